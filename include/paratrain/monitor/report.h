// The run report: a metrics file (and optionally a trace directory) turned into one
// self-contained HTML page of charts (`paratrain report`, docs/report.md).
//
// read_metrics_log reads DESIGN.md "Metrics" lines (one JSON object per line, rank 0's) and
// splits them into training and evaluation ("eval": true) lines; unknown keys are kept and
// ignored by the report. read_trace reads Chrome trace-event JSON as DESIGN.md's `--trace DIR`
// names it (DIR/trace.json merged, or DIR/rank<R>.trace.json per rank). build_report_data
// turns both into the charts' data (one entry per chart; a chart whose inputs are not in the
// run carries the reason instead of data, never a made-up series); render_report_html embeds
// that data as JSON with a small script that draws SVG charts when the page loads: the page
// references no network resource (no scripts, fonts or style sheets by URL) and works
// offline. write_report writes it atomically (base/atomic_file.h).
//
// Errors: InputError naming "file:line" for a malformed line, naming the file when it is
// missing, empty or holds no training line, or when a trace is malformed; IoError when the
// report cannot be written. Thread-safety: free functions over values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace paratrain::monitor {

// One metrics file, as read. Lines keep their file order; blank lines are skipped.
struct MetricsLog {
  std::string path;
  std::vector<nlohmann::json> steps;  // training lines (objects without "eval": true)
  std::vector<nlohmann::json> evals;  // evaluation lines ("eval": true, val_loss or accuracy)
};

// Reads `path`. Every non-blank line must be a JSON object; training lines must carry a
// numeric "step". InputError "<path>:<line>: ..." otherwise, and "<path>: ..." when the file
// is missing, empty or has no training line.
MetricsLog read_metrics_log(const std::string& path);

// One span of a trace: a Chrome "X" (complete) event, or a matched "B"/"E" pair.
struct TraceEvent {
  std::string name;
  std::string cat;
  int64_t pid = 0;     // the rank (DESIGN.md: one process track per rank)
  int64_t tid = 0;     // the thread/track within the rank
  double ts_us = 0;    // start, microseconds
  double dur_us = 0;   // duration, microseconds (>= 0)
  nlohmann::json args; // the event's "args" (null when absent)
};

struct Trace {
  std::vector<std::string> files;                            // the files read
  std::vector<TraceEvent> events;                            // sorted by (ts_us, pid, tid)
  std::map<int64_t, std::string> process_names;              // "M" process_name, by pid
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;  // "M" thread_name, by (pid, tid)
};

// Reads one trace file: {"traceEvents": [...]} or a bare array of events. Events of other
// phases (counters, instants, flows) are skipped; an "E" without its "B" is skipped.
// InputError naming the file when it is missing or not trace-event JSON.
Trace read_trace_file(const std::string& path);

// Reads a `--trace DIR`: DIR/trace.json when present, else every DIR/rank<R>.trace.json
// (merged; an event without "pid" takes R). InputError when DIR holds neither.
Trace read_trace(const std::string& dir);

struct ReportOptions {
  std::string title = "paratrain run";
  // The timeline excerpt shows at most this many spans (the busiest step's window is cut).
  size_t max_timeline_events = 3000;
};

// The charts' data and the run summary, as embedded in the page (its "data" script).
// {"title", "source", "summary": {...}, "means": [{"name","value","unit"}...],
//  "charts": [{"id","title","kind","absent"?: reason, "notes": [...], "series": [...]}...]}.
// Chart ids, in page order: loss, throughput, split, memory, step_time, busbw, timeline.
nlohmann::json build_report_data(const MetricsLog& log, const Trace* trace, const ReportOptions& opt = {});

// The whole HTML page for `data` (from build_report_data).
std::string render_report_html(const nlohmann::json& data);

// build_report_data + render_report_html, written atomically to `path`.
void write_report(const std::string& path, const MetricsLog& log, const Trace* trace,
                  const ReportOptions& opt = {});

}  // namespace paratrain::monitor
