// The launcher's hang and failure report: what every local rank's flight recorder says
// (comm/flight_recorder.h), as one table and a verdict.
//
// analyse_flight_records() takes, per rank, its dump (JSON text, "" when it has none) and
// its progress file, and finds per process group: each rank's last completed and its oldest
// pending collective; the ranks that never arrived at the collective the others wait in
// ("rank 2 never called allreduce #7 (group world); ranks 0,1 wait for it since 12.3 s"),
// with what those ranks do instead (stopped, exited, waiting in an earlier collective,
// outside any collective); and the first collective at which ranks disagree on the op,
// dtype, count or root ("mismatch"). A rank with no dump is judged by its progress file
// (the last call it issued and the last it finished).
//
// Thread-safety: pure functions over values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "paratrain/comm/flight_recorder.h"

namespace paratrain::launch {

struct RankFlightInput {
  int rank = 0;
  long pid = 0;
  std::string state;     // "running", "stopped (SIGSTOP)", "exited (exit code 1)", ...
  bool answered = false; // wrote a fresh dump when asked
  std::string dump_json; // its dump, "" = none
  std::optional<comm::FlightProgressSnapshot> progress;
};

struct FlightReport {
  std::string table;                  // one row per rank and group, with a header
  std::vector<std::string> verdicts;  // "rank 2 never called ...", "mismatch ...", or why none
};

// `now_s`: the wall clock (Unix seconds) the ages are measured against.
FlightReport analyse_flight_records(const std::vector<RankFlightInput>& ranks, double now_s);

}  // namespace paratrain::launch
