// The report's timeline excerpt: one step of the trace, every rank's spans in it, as a Gantt
// chart (a lane per rank and track).
//
// The step: the trace's step spans are the events named "step" (any case) or of category
// "step"; the excerpt takes the middle one of the lowest rank (steady state: the first steps
// pay warm-up) and shows every span, on every rank, that overlaps its time window (clipped to
// it). A trace without step spans shows its first spans from the earliest one on. At most
// `max_events` spans are kept (the earliest); the entry says how many were cut.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "report_detail.h"

namespace paratrain::monitor::detail {

namespace {

using nlohmann::json;

bool is_step_span(const TraceEvent& e) {
  std::string n = e.name, c = e.cat;
  for (auto* s : {&n, &c})
    for (char& ch : *s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return n == "step" || c == "step";
}

// A short "key=value, ..." of an event's args for the hover text.
std::string args_text(const json& args) {
  if (!args.is_object()) return "";
  std::string out;
  for (auto it = args.begin(); it != args.end(); ++it) {
    if (out.size() > 160) break;
    out += (out.empty() ? "" : ", ") + it.key() + "=" + (it->is_string() ? it->get<std::string>() : it->dump());
  }
  return out;
}

}  // namespace

json timeline_chart(const Trace* trace, size_t max_events) {
  json c = {{"id", "timeline"},
            {"title", "Timeline excerpt"},
            {"kind", "gantt"},
            {"what", "One training step of the trace: every rank's spans in it (forward, backward, all-reduce "
                     "buckets, optimizer, data wait ...), one lane per rank and track. Gaps are waits."},
            {"notes", json::array()},
            {"series", json::array()}};
  if (trace == nullptr) {
    c["absent"] = "no trace given (record one with `paratrain train --trace DIR`, then `paratrain report "
                  "METRICS --trace DIR`)";
    return c;
  }
  if (trace->events.empty()) {
    c["absent"] = "the trace holds no spans (no \"X\" or \"B\"/\"E\" events)";
    return c;
  }
  // The window: the middle step span of the lowest rank, or from the first span on.
  std::vector<const TraceEvent*> steps;
  int64_t low_pid = trace->events.front().pid;
  for (const TraceEvent& e : trace->events) low_pid = std::min(low_pid, e.pid);
  for (const TraceEvent& e : trace->events)
    if (e.pid == low_pid && is_step_span(e)) steps.push_back(&e);
  double start = trace->events.front().ts_us, end = 0;
  std::string label;
  if (!steps.empty()) {
    const TraceEvent& s = *steps[steps.size() / 2];
    start = s.ts_us, end = s.ts_us + s.dur_us;
    const std::string which = s.args.is_object() && s.args.contains("step") ? s.args["step"].dump()
                                                                            : std::to_string(steps.size() / 2 + 1);
    label = "step " + which + " (span " + std::to_string(steps.size() / 2 + 1) + " of " +
            std::to_string(steps.size()) + " on rank " + std::to_string(low_pid) + ")";
  } else {
    for (const TraceEvent& e : trace->events) end = std::max(end, e.ts_us + e.dur_us);
    label = "the trace from its first span (it marks no steps: no span named \"step\")";
    c["notes"].push_back("step spans: not in this trace; showing the first spans instead");
  }
  std::map<std::pair<int64_t, int64_t>, size_t> lane_of;
  std::vector<const TraceEvent*> shown;
  size_t cut = 0;
  for (const TraceEvent& e : trace->events) {
    const bool overlaps = e.dur_us > 0 ? (e.ts_us < end && e.ts_us + e.dur_us > start)
                                       : (e.ts_us >= start && e.ts_us <= end);
    if (!overlaps) continue;
    if (shown.size() >= max_events) {
      ++cut;
      continue;
    }
    shown.push_back(&e);
    lane_of.emplace(std::make_pair(e.pid, e.tid), 0);
  }
  json lanes = json::array();
  size_t i = 0;
  for (auto& [key, index] : lane_of) {
    index = i++;
    auto p = trace->process_names.find(key.first);
    auto t = trace->thread_names.find(key);
    const std::string proc = p != trace->process_names.end() ? p->second : "rank " + std::to_string(key.first);
    const std::string thread = t != trace->thread_names.end() ? t->second : "tid " + std::to_string(key.second);
    lanes.push_back({{"pid", key.first}, {"tid", key.second}, {"label", proc + " / " + thread}});
  }
  json spans = json::array();
  for (const TraceEvent* e : shown) {
    const double t0 = std::max(e->ts_us, start), t1 = std::min(e->ts_us + e->dur_us, end);
    spans.push_back({{"lane", lane_of[{e->pid, e->tid}]},
                     {"name", e->name},
                     {"cat", e->cat},
                     {"t0", (t0 - start) / 1000.0},
                     {"dur", std::max(0.0, t1 - t0) / 1000.0},
                     {"full_dur", e->dur_us / 1000.0},
                     {"info", args_text(e->args)}});
  }
  c["window"] = {{"label", label}, {"start_us", start}, {"dur_ms", (end - start) / 1000.0}};
  c["lanes"] = std::move(lanes);
  c["spans"] = std::move(spans);
  c["x_label"] = "ms from the window's start";
  if (cut > 0) c["notes"].push_back(std::to_string(cut) + " more spans in the window not drawn (limit " +
                                    std::to_string(max_events) + ")");
  return c;
}

}  // namespace paratrain::monitor::detail
