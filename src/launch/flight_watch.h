// FlightWatch: the launcher's side of the flight recorder (comm/flight_recorder.h).
//
// The ranks get PARATRAIN_FR_DUMP_DIR = dir() (the --log-dir, or a directory the launcher
// creates under the system's temporary directory). progressed() reads the ranks' progress
// files and says how long no call finished on any rank while some call is pending (the
// --hang-timeout watch). report() gathers every rank's record before anything is killed:
// SIGUSR1 to each live rank that has a progress file (so its recorder handles SIGUSR1),
// a bounded wait (kDumpWaitS) for their fresh dumps, the last dump or the progress file of
// the ranks that cannot answer (stopped, dead); then it prints one table and the verdict
// (hang_report.h) to stderr and keeps the text as DIR/flight_report.txt beside the dumps.
//
// Thread-safety: used from the launcher's thread only.
#pragma once

#include <chrono>
#include <string>
#include <sys/types.h>
#include <vector>

namespace paratrain::launch {

struct WatchedRank {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;
  std::string exit_status;  // "exit code 3", "signal 9 (SIGKILL)" once exited
};

class FlightWatch {
 public:
  static constexpr double kDumpWaitS = 3;  // how long report() waits for fresh dumps

  // `log_dir` "" = make a directory of its own (removed at the end if no report used it).
  explicit FlightWatch(const std::string& log_dir);
  ~FlightWatch();
  FlightWatch(const FlightWatch&) = delete;
  FlightWatch& operator=(const FlightWatch&) = delete;

  const std::string& dir() const { return dir_; }
  // Before an attempt: removes the files of the last one.
  void reset(const std::vector<WatchedRank>& ranks);
  // Seconds for which no rank finished a call while at least one call was pending (0 when
  // calls advance or none is pending). Reads the progress files at most every 0.5 s.
  double stalled_s(const std::vector<WatchedRank>& ranks);
  // Whether any rank runs a flight recorder (has a progress file).
  bool any_recorder(const std::vector<WatchedRank>& ranks) const;
  // Gathers and prints the report; returns its text.
  std::string report(const std::vector<WatchedRank>& ranks, const std::string& why);

 private:
  std::string dir_;
  bool own_dir_ = false;
  bool reported_ = false;
  uint64_t last_total_ = 0;
  std::chrono::steady_clock::time_point last_change_{};
  std::chrono::steady_clock::time_point last_read_{};
  double stalled_ = 0;
};

}  // namespace paratrain::launch
