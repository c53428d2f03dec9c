#include "launch/flight_watch.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/launch/hang_report.h"
#include "paratrain/launch/process.h"

namespace paratrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  if (!f) return "";
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The state letter of /proc/<pid>/stat (R, S, D, T, t, Z, ...), or 0.
char proc_state(pid_t pid) {
  std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

std::string describe_state(const WatchedRank& r) {
  if (r.exited) return "exited (" + r.exit_status + ")";
  switch (proc_state(r.pid)) {
    case 'T':
    case 't': return "stopped (SIGSTOP)";
    case 'Z': return "exited";
    case 0: return "gone";
    default: return "running";
  }
}

double wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

FlightWatch::FlightWatch(const std::string& log_dir) {
  if (!log_dir.empty()) {
    dir_ = log_dir;
    return;
  }
  std::string tmpl = (std::filesystem::temp_directory_path() / "paratrain-launch-XXXXXX").string();
  if (::mkdtemp(tmpl.data()) == nullptr) PT_THROW(IoError, "launch: cannot create a directory for the ranks' flight records: ", tmpl);
  dir_ = tmpl;
  own_dir_ = true;
}

FlightWatch::~FlightWatch() {
  if (own_dir_ && !reported_) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
}

void FlightWatch::reset(const std::vector<WatchedRank>& ranks) {
  for (const WatchedRank& r : ranks) {
    ::unlink(comm::flight_dump_path(dir_, r.rank).c_str());
    ::unlink(comm::flight_progress_path(dir_, r.rank).c_str());
  }
  last_total_ = 0;
  last_change_ = Clock::now();
  stalled_ = 0;
}

bool FlightWatch::any_recorder(const std::vector<WatchedRank>& ranks) const {
  for (const WatchedRank& r : ranks)
    if (::access(comm::flight_progress_path(dir_, r.rank).c_str(), F_OK) == 0) return true;
  return false;
}

double FlightWatch::stalled_s(const std::vector<WatchedRank>& ranks) {
  auto now = Clock::now();
  if (now - last_read_ < std::chrono::milliseconds(500)) return stalled_;
  last_read_ = now;
  uint64_t total = 0;
  bool pending = false;
  for (const WatchedRank& r : ranks) {
    auto p = comm::read_flight_progress(comm::flight_progress_path(dir_, r.rank));
    if (!p) continue;
    total += p->finished;
    if (p->issued > p->finished) pending = true;
  }
  if (total != last_total_ || !pending) {
    last_total_ = total;
    last_change_ = now;
  }
  stalled_ = std::chrono::duration<double>(now - last_change_).count();
  return stalled_;
}

std::string FlightWatch::report(const std::vector<WatchedRank>& ranks, const std::string& why) {
  reported_ = true;
  // Ask every live rank with a recorder for a fresh dump.
  std::vector<uint64_t> before(ranks.size(), 0);
  std::vector<bool> asked(ranks.size(), false), answered(ranks.size(), false);
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i].exited) continue;
    auto p = comm::read_flight_progress(comm::flight_progress_path(dir_, ranks[i].rank));
    if (!p || p->pid != ranks[i].pid) continue;
    before[i] = p->dumps;
    asked[i] = ::kill(ranks[i].pid, SIGUSR1) == 0;
  }
  auto until = Clock::now() + std::chrono::duration<double>(kDumpWaitS);
  for (;;) {
    bool waiting = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (!asked[i] || answered[i]) continue;
      auto p = comm::read_flight_progress(comm::flight_progress_path(dir_, ranks[i].rank));
      if (p && p->dumps > before[i]) {
        answered[i] = true;
        continue;
      }
      char st = proc_state(ranks[i].pid);
      if (st == 'T' || st == 't' || st == 'Z' || st == 0) continue;  // cannot answer
      waiting = true;
    }
    if (!waiting || Clock::now() >= until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::vector<RankFlightInput> in;
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankFlightInput r;
    r.rank = ranks[i].rank;
    r.pid = ranks[i].pid;
    r.state = describe_state(ranks[i]);
    r.answered = answered[i];
    r.dump_json = slurp(comm::flight_dump_path(dir_, ranks[i].rank));
    r.progress = comm::read_flight_progress(comm::flight_progress_path(dir_, ranks[i].rank));
    in.push_back(std::move(r));
  }
  FlightReport rep = analyse_flight_records(in, wall_s());
  std::string text = "paratrain launch: flight recorder report (" + why + "):\n" + rep.table;
  for (const std::string& v : rep.verdicts) text += "paratrain launch: verdict: " + v + "\n";
  text += "paratrain launch: flight records (JSON, one per rank) kept in " + dir_ + "\n";
  write_all(2, text.data(), text.size());
  try {
    write_file_atomic(dir_ + "/flight_report.txt", text);
  } catch (const Error&) {
  }
  return text;
}

}  // namespace paratrain::launch
