#include "paratrain/comm/flight_recorder.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <thread>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/env.h"
#include "paratrain/base/log.h"
#include "paratrain/base/error.h"
#include "paratrain/base/json_text.h"
#include "paratrain/base/trace.h"

namespace paratrain::comm {
namespace {

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
int64_t wall_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char h[256] = {};
  if (::gethostname(h, sizeof(h) - 1) != 0) return "?";
  return h;
}

// One finished call as a trace event "<op>" on its group's track. algbw = the operation's
// size over its time; the size is the whole buffer for allgather / reduce_scatter / all_to_all
// (the count is one rank's part), the buffer otherwise; busbw = comm::bus_bytes over the time
// (nccl-tests' conventions).
void trace_call(const FlightRecord& r, int group_size, uint32_t track) {
  const double seconds = static_cast<double>(r.finished_ns - r.started_ns) * 1e-9;
  const bool whole = r.op == OpType::kAllgather || r.op == OpType::kReduceScatter || r.op == OpType::kAllToAll;
  const double size = static_cast<double>(r.bytes) * (whole ? group_size : 1);
  const double algbw = seconds > 0 ? size / seconds / 1e9 : 0.0;
  trace::Args a;
  a.num("bytes", static_cast<double>(r.bytes)).num("count", static_cast<double>(r.count));
  a.str("dtype", dtype_name(r.dtype)).num("seq", static_cast<double>(r.seq));
  if (r.peer >= 0) a.num("peer", r.peer);
  const double busbw = seconds > 0 ? bus_bytes(r.op, r.bytes, group_size) / seconds / 1e9 : 0.0;
  a.num("algbw_gbps", algbw).num("busbw_gbps", busbw);
  if (r.trace_tag) a.num(r.trace_tag, static_cast<double>(r.trace_tag_value));
  if (r.state == RecordState::kFailed) a.str("state", "failed");
  trace::complete(op_type_name(r.op), "comm", track, r.started_ns, r.finished_ns, a);
}

// ---- SIGUSR1: the handler writes one byte to a pipe; the recorder's thread dumps.
int g_usr1_pipe_w = -1;

extern "C" void on_flight_usr1(int) {
  int saved = errno;
  unsigned char b = 1;
  if (g_usr1_pipe_w >= 0) {
    ssize_t r = ::write(g_usr1_pipe_w, &b, 1);
    (void)r;
  }
  errno = saved;
}

}  // namespace

const char* record_state_name(RecordState s) {
  switch (s) {
    case RecordState::kScheduled: return "scheduled";
    case RecordState::kStarted: return "started";
    case RecordState::kCompleted: return "completed";
    case RecordState::kFailed: return "failed";
  }
  return "?";
}

std::string flight_dump_path(const std::string& dir, int rank) {
  return dir + "/rank_" + std::to_string(rank) + ".fr.json";
}
std::string flight_progress_path(const std::string& dir, int rank) {
  return dir + "/rank_" + std::to_string(rank) + ".fr.progress";
}

std::optional<FlightProgressSnapshot> read_flight_progress(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  // A file shorter than the record (not a progress file, or one cut short) is not mapped:
  // reading a mapping past a file's end raises SIGBUS.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(sizeof(FlightProgress))) {
    ::close(fd);
    return std::nullopt;
  }
  void* m = ::mmap(nullptr, sizeof(FlightProgress), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) return std::nullopt;
  const auto* p = static_cast<const FlightProgress*>(m);
  std::optional<FlightProgressSnapshot> out;
  for (int attempt = 0; attempt < 1000 && !out; ++attempt) {
    uint64_t v1 = p->version.load(std::memory_order_acquire);
    if (v1 & 1) {
      std::this_thread::yield();
      continue;
    }
    FlightProgressSnapshot s;
    std::atomic_thread_fence(std::memory_order_acquire);
    if (p->magic != FlightProgress::kMagic) break;
    s.pid = p->pid;
    s.rank = p->rank;
    s.issued = p->issued;
    s.finished = p->finished;
    s.dumps = p->dumps;
    std::memcpy(&s.last_issued, &p->last_issued, sizeof(FlightProgressCall));
    std::memcpy(&s.last_finished, &p->last_finished, sizeof(FlightProgressCall));
    std::atomic_thread_fence(std::memory_order_acquire);
    if (p->version.load(std::memory_order_relaxed) == v1) out = s;
  }
  ::munmap(m, sizeof(FlightProgress));
  return out;
}

FlightRecorder& FlightRecorder::instance() {
  // Never destroyed: Works may finish while the process exits.
  static FlightRecorder* r = [] {
    int64_t n = env::get_int("PARATRAIN_FR_BUFFER");
    if (n < 0) PT_THROW(InputError, "PARATRAIN_FR_BUFFER=", n, " must be 0 (off) or a number of records");
    int rank = static_cast<int>(env::raw_int("RANK").value_or(-1));
    return new FlightRecorder(static_cast<size_t>(n), env::get_string("PARATRAIN_FR_DUMP_DIR"), rank);
  }();
  return *r;
}

FlightRecorder::FlightRecorder(size_t capacity, std::string dump_dir, int rank)
    : capacity_(capacity), dump_dir_(std::move(dump_dir)), rank_(rank) {
  ring_.resize(capacity_);
}

FlightRecorder::~FlightRecorder() {
  if (progress_) ::munmap(progress_, sizeof(FlightProgress));
}

int FlightRecorder::add_group(std::string name, const std::string& backend, int rank, int size,
                              std::vector<int> global_ranks) {
  if (!enabled()) return -1;
  std::lock_guard<std::mutex> l(mu_);
  auto g = std::make_unique<FlightGroup>();
  g->id = static_cast<int>(groups_.size());
  if (name.empty()) name = top_level_groups_++ == 0 ? "world" : "pg" + std::to_string(g->id);
  g->name = std::move(name);
  g->backend = backend;
  g->rank = rank;
  g->size = size;
  if (global_ranks.empty())
    for (int r = 0; r < size; ++r) global_ranks.push_back(r);
  g->ranks = std::move(global_ranks);
  if (rank_ < 0) rank_ = g->ranks[static_cast<size_t>(rank)];
  groups_.push_back(std::move(g));
  colls_.push_back(0);
  traffic_.emplace_back();
  trace_tracks_.push_back(0);
  if (!dump_dir_.empty() && !progress_) open_progress();
  return groups_.back()->id;
}

const FlightGroup* FlightRecorder::group(int id) const {
  std::lock_guard<std::mutex> l(mu_);
  if (id < 0 || id >= static_cast<int>(groups_.size())) return nullptr;
  return groups_[static_cast<size_t>(id)].get();
}

void FlightRecorder::open_progress() {
  // SIGUSR1 first (where nobody else wants it), so a progress file means "ask me for a dump".
  struct sigaction old;
  if (::sigaction(SIGUSR1, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) return;
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return;
  g_usr1_pipe_w = p[1];
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_flight_usr1;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &sa, nullptr);
  const int read_fd = p[0];
  std::thread([this, read_fd] {
    for (;;) {
      pollfd pf{read_fd, POLLIN, 0};
      if (::poll(&pf, 1, -1) < 0 && errno != EINTR) return;
      unsigned char buf[64];
      bool asked = false;
      while (::read(read_fd, buf, sizeof(buf)) > 0) asked = true;
      if (!asked) continue;
      try {
        dump("sigusr1");
      } catch (const std::exception& e) {
        PT_LOG_ERROR(kComm, "flight recorder: ", e.what());
      }
    }
  }).detach();

  // Made whole under a temporary name, then renamed into place: a reader (the launcher's
  // watcher, polling from the rank's start) never sees the file empty or half-initialised,
  // also when a restarted rank replaces its predecessor's.
  const std::string path = flight_progress_path(dump_dir_, rank_);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (::ftruncate(fd, sizeof(FlightProgress)) != 0) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return;
  }
  void* m = ::mmap(nullptr, sizeof(FlightProgress), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    ::unlink(tmp.c_str());
    return;
  }
  auto* progress = new (m) FlightProgress();
  progress->pid = ::getpid();
  progress->rank = rank_;
  std::atomic_thread_fence(std::memory_order_release);
  progress->magic = FlightProgress::kMagic;
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::munmap(m, sizeof(FlightProgress));
    ::unlink(tmp.c_str());
    return;
  }
  progress_ = progress;
}

void FlightRecorder::publish(const FlightRecord& r, bool issued) {
  FlightProgress* p = progress_;
  p->version.fetch_add(1, std::memory_order_acq_rel);  // odd: being written
  FlightProgressCall& c = issued ? p->last_issued : p->last_finished;
  c.seq = r.seq;
  c.coll = r.coll;
  c.count = r.count;
  c.t_unix_us = wall_us();
  const FlightGroup& g = *groups_[static_cast<size_t>(r.group)];
  c.group_size = g.size;
  c.op = static_cast<uint8_t>(r.op);
  c.dtype = static_cast<uint8_t>(r.dtype);
  c.state = static_cast<uint8_t>(r.state);
  c.valid = 1;
  std::snprintf(c.group, sizeof(c.group), "%s", g.name.c_str());
  if (issued) ++p->issued;
  else ++p->finished;
  p->version.fetch_add(1, std::memory_order_release);
}

uint64_t FlightRecorder::record(int group, uint64_t seq, OpType op, DType dtype, uint64_t count, ReduceOp reduce_op,
                                int peer, int tag) {
  if (!enabled() || group < 0) return 0;
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t id = next_id_++;
  FlightRecord& r = ring_[id % capacity_];
  r.id = id;
  r.group = group;
  r.seq = seq;
  const bool p2p = op == OpType::kSend || op == OpType::kRecv;
  r.coll = p2p ? -1 : colls_[static_cast<size_t>(group)]++;
  r.op = op;
  r.dtype = dtype;
  r.reduce_op = reduce_op;
  r.state = RecordState::kScheduled;
  r.count = count;
  r.bytes = op == OpType::kBarrier ? 0 : count * dtype_size(dtype);
  r.peer = peer;
  r.tag = tag;
  r.enqueued_ns = now;
  r.started_ns = 0;
  r.finished_ns = 0;
  const trace::CallTag call_tag = trace::enabled() ? trace::current_call_tag() : trace::CallTag{};
  r.trace_tag = call_tag.key;
  r.trace_tag_value = call_tag.value;
  if (progress_) publish(r, true);
  return id;
}

double GroupTraffic::busbw_gbps_since(const GroupTraffic& before) const {
  const int64_t ns = busy_ns - before.busy_ns;
  return ns > 0 ? (bus_bytes - before.bus_bytes) / static_cast<double>(ns) : 0.0;
}

GroupTraffic FlightRecorder::traffic(int group) const {
  std::lock_guard<std::mutex> l(mu_);
  if (group < 0 || static_cast<size_t>(group) >= traffic_.size()) return {};
  return traffic_[static_cast<size_t>(group)];
}

void FlightRecorder::started(uint64_t id) {
  if (id == 0) return;
  const int64_t now = steady_ns();
  std::lock_guard<std::mutex> l(mu_);
  FlightRecord& r = ring_[id % capacity_];
  if (r.id != id || r.state != RecordState::kScheduled) return;  // overwritten meanwhile
  r.state = RecordState::kStarted;
  r.started_ns = now;
}

void FlightRecorder::finished(uint64_t id, const std::exception_ptr& error) {
  if (id == 0) return;
  const int64_t now = steady_ns();
  bool dump_now = false;
  bool timeout = false;
  std::optional<FlightRecord> traced;  // copied under the lock, emitted after it
  int group_size = 1;
  uint32_t track = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    FlightRecord& r = ring_[id % capacity_];
    if (r.id == id) {
      r.state = error ? RecordState::kFailed : RecordState::kCompleted;
      if (r.started_ns == 0) r.started_ns = now;
      r.finished_ns = now;
      if (progress_) publish(r, false);
      if (!error) {
        GroupTraffic& t = traffic_[static_cast<size_t>(r.group)];
        ++t.calls;
        t.bytes += r.bytes;
        t.bus_bytes += bus_bytes(r.op, r.bytes, groups_[static_cast<size_t>(r.group)]->size);
        t.busy_ns += r.finished_ns - r.started_ns;
      }
      if (trace::enabled()) {
        traced = r;
        const FlightGroup& g = *groups_[static_cast<size_t>(r.group)];
        group_size = g.size;
        uint32_t& t = trace_tracks_[static_cast<size_t>(r.group)];
        if (t == 0) t = trace::track("comm " + g.name);
        track = t;
      }
    }
    if (error && !dump_dir_.empty() && now - last_failure_dump_ns_ > 1000000000) {
      last_failure_dump_ns_ = now;
      dump_now = true;
      try {
        std::rethrow_exception(error);
      } catch (const TimeoutError& e) {
        timeout = true;
        if (first_failure_.empty()) first_failure_ = e.what();
      } catch (const std::exception& e) {
        if (first_failure_.empty()) first_failure_ = e.what();
      } catch (...) {
        if (first_failure_.empty()) first_failure_ = "unknown error";
      }
    }
  }
  if (traced) trace_call(*traced, group_size, track);
  // On the failing thread: the process may exit right after this failure.
  if (dump_now) {
    try {
      dump(timeout ? "timeout" : "failure");
    } catch (const std::exception& e) {
      PT_LOG_ERROR(kComm, "flight recorder: ", e.what());
    }
  }
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::vector<FlightRecord> out;
  if (!enabled()) return out;
  std::lock_guard<std::mutex> l(mu_);
  const uint64_t first = next_id_ > capacity_ ? next_id_ - capacity_ : 1;
  out.reserve(next_id_ - first);
  for (uint64_t id = first; id < next_id_; ++id) out.push_back(ring_[id % capacity_]);
  return out;
}

std::string FlightRecorder::dump_json(const std::string& reason) const {
  std::vector<FlightRecord> recs = snapshot();
  std::vector<FlightGroup> groups;
  std::string failure;
  int rank;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& g : groups_) groups.push_back(*g);
    failure = first_failure_;
    rank = rank_;
  }
  const int64_t now_ns = steady_ns();
  const int64_t now_wall = wall_us();
  auto wall = [&](int64_t ns) { return ns == 0 ? 0.0 : (now_wall - (now_ns - ns) / 1000) / 1e6; };
  auto rec = [&](const FlightRecord& r) {
    std::ostringstream o;
    o << "{\"id\":" << r.id << ",\"group\":" << r.group << ",\"seq\":" << r.seq << ",\"coll\":" << r.coll
      << ",\"op\":\"" << op_type_name(r.op) << "\",\"dtype\":\"" << dtype_name(r.dtype) << "\",\"count\":" << r.count
      << ",\"bytes\":" << r.bytes << ",\"reduce_op\":\"" << reduce_op_name(r.reduce_op) << "\",\"peer\":" << r.peer
      << ",\"tag\":" << r.tag << ",\"state\":\"" << record_state_name(r.state) << "\"";
    char b[160];
    std::snprintf(b, sizeof(b), ",\"enqueued_s\":%.6f,\"started_s\":%.6f,\"finished_s\":%.6f", wall(r.enqueued_ns),
                  wall(r.started_ns), wall(r.finished_ns));
    o << b;
    std::snprintf(b, sizeof(b), ",\"enqueued_steady_us\":%lld,\"started_steady_us\":%lld,\"finished_steady_us\":%lld}",
                  static_cast<long long>(r.enqueued_ns / 1000), static_cast<long long>(r.started_ns / 1000),
                  static_cast<long long>(r.finished_ns / 1000));
    o << b;
    return o.str();
  };
  std::ostringstream o;
  char b[64];
  std::snprintf(b, sizeof(b), "%.6f", now_wall / 1e6);
  o << "{\"format\":\"paratrain-flight-recorder/1\",\"rank\":" << rank << ",\"pid\":" << ::getpid()
    << ",\"host\":" << json_string(host_name()) << ",\"reason\":" << json_string(reason) << ",\"time_s\":" << b
    << ",\"steady_us\":" << now_ns / 1000 << ",\"capacity\":" << capacity_ << ",\"failure\":" << json_string(failure)
    << ",\"groups\":[";
  for (size_t i = 0; i < groups.size(); ++i) {
    const FlightGroup& g = groups[i];
    const FlightRecord* last = nullptr;
    std::vector<const FlightRecord*> pending;
    for (const FlightRecord& r : recs) {
      if (r.group != g.id) continue;
      if (r.state == RecordState::kCompleted) last = &r;
      else if (r.state != RecordState::kFailed) pending.push_back(&r);
    }
    o << (i ? "," : "") << "{\"id\":" << g.id << ",\"name\":" << json_string(g.name)
      << ",\"backend\":" << json_string(g.backend) << ",\"rank\":" << g.rank << ",\"size\":" << g.size
      << ",\"ranks\":[";
    for (size_t k = 0; k < g.ranks.size(); ++k) o << (k ? "," : "") << g.ranks[k];
    o << "],\"last_completed\":" << (last ? rec(*last) : "null") << ",\"pending\":[";
    for (size_t k = 0; k < pending.size(); ++k) o << (k ? "," : "") << rec(*pending[k]);
    o << "]}";
  }
  o << "],\"records\":[";
  for (size_t i = 0; i < recs.size(); ++i) o << (i ? ",\n" : "\n") << rec(recs[i]);
  o << "]}\n";
  return o.str();
}

std::string FlightRecorder::dump(const std::string& reason) {
  if (dump_dir_.empty() || !enabled()) return "";
  std::lock_guard<std::mutex> d(dump_mu_);
  int rank;
  {
    std::lock_guard<std::mutex> l(mu_);
    rank = rank_ < 0 ? 0 : rank_;
  }
  const std::string path = flight_dump_path(dump_dir_, rank);
  write_file_atomic(path, dump_json(reason));
  PT_LOG_DEBUG(kComm, "flight recorder: dumped ", path, " (", reason, ")");
  std::lock_guard<std::mutex> l(mu_);
  if (progress_) {
    progress_->version.fetch_add(1, std::memory_order_acq_rel);
    ++progress_->dumps;
    progress_->version.fetch_add(1, std::memory_order_release);
  }
  return path;
}

}  // namespace paratrain::comm
