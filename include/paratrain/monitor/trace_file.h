// Trace files (DESIGN.md "Traces and records", `--trace DIR`): what the base trace sink
// (base/trace.h) recorded, written as Chrome trace-event JSON that Perfetto and
// chrome://tracing load and `paratrain report --trace DIR` reads.
//
// DIR/rank<R>.trace.json holds one rank's events; DIR/trace.json (rank 0) holds every rank's,
// gathered over the world process group (so it works across hosts, without a shared file
// system). Format: {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}; every
// span is an "X" event with "ts" and "dur" in microseconds, "pid" = the rank, "tid" = the
// track; "M" events name the process ("rank R") and the tracks ("train", "data loader",
// "comm world", ...). Timestamps are unix time (steady clock converted at write time), so the
// ranks of one job line up as far as their hosts' clocks agree. otherData carries the rank(s),
// the cap on events and the events dropped over it (per rank in trace.json).
//
// TraceSession is one run's tracing: it creates DIR, turns the sink on, and writes the files.
// Only one may be alive in a process (the sink is process-wide). Not thread-safe: one thread
// (the training loop) owns it; what it records may come from any thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/base/trace.h"

namespace paratrain::comm {
class ProcessGroup;
}

namespace paratrain::monitor {

// DIR/rank<R>.trace.json and DIR/trace.json.
std::string rank_trace_path(const std::string& dir, int rank);
std::string merged_trace_path(const std::string& dir);

// The events of one rank as the comma-separated members of a traceEvents array (metadata
// first). `unix_offset_ns` is added to the steady-clock times (unix ns = steady ns + offset).
std::string trace_events_json(const trace::Recording& rec, int rank, int64_t unix_offset_ns);
// A whole trace document around rank bodies from trace_events_json; `other_data` is a JSON
// object's text ("{...}").
std::string trace_document(const std::vector<std::string>& bodies, const std::string& other_data);
// unix time minus steady time, now (nanoseconds).
int64_t steady_to_unix_offset_ns();

class TraceSession {
 public:
  // Creates `dir` (InputError naming it when it cannot be created or written) and starts the
  // sink with a cap of `max_events`.
  TraceSession(std::string dir, int rank, size_t max_events = trace::kDefaultMaxEvents);
  // A session not finished (the run failed) writes this rank's file, best effort (a failure
  // is one line on stderr), and stops the sink.
  ~TraceSession();
  TraceSession(const TraceSession&) = delete;
  TraceSession& operator=(const TraceSession&) = delete;

  // Stops the sink and writes DIR/rank<R>.trace.json; with `world` (collective: every rank of
  // it calls finish) the ranks' events are gathered on rank 0, which writes DIR/trace.json.
  // Every wait has `timeout`; TimeoutError / CommError name the rank and the step. Without
  // `world` (one process) DIR/trace.json holds this rank's events.
  void finish(comm::ProcessGroup* world, std::chrono::milliseconds timeout = std::chrono::seconds(60));

  const std::string& dir() const { return dir_; }

 private:
  std::string write_own();  // stops the sink, writes the rank file, returns its events' body

  std::string dir_;
  int rank_;
  bool finished_ = false;
  uint64_t dropped_ = 0;
  size_t max_events_ = 0;
};

}  // namespace paratrain::monitor
