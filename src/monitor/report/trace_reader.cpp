// Reading Chrome trace-event JSON (the format DESIGN.md's `--trace DIR` writes and Perfetto
// loads) for the report's timeline. What is read:
//   {"traceEvents": [ev, ...], ...} or a bare [ev, ...];
//   ev = {"name", "cat"?, "ph", "ts" (microseconds), "dur"? (microseconds), "pid" (the rank),
//         "tid", "args"?}.
// "X" events are spans; "B"/"E" pairs on one (pid, tid) are matched as a stack (an "E" closes
// the latest open "B"); "M" events named process_name / thread_name label the tracks
// (args.name). Other phases (counters, instants, flows, async) are skipped. A string tid (some
// writers use names) becomes a small number per process, its string the thread's name.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/monitor/report.h"

namespace paratrain::monitor {

namespace {

namespace fs = std::filesystem;

int64_t id_of(const nlohmann::json& v, int64_t fallback) {
  if (v.is_number_integer() || v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_float()) return static_cast<int64_t>(v.get<double>());
  return fallback;
}

double number_or(const nlohmann::json& ev, const char* key, double fallback) {
  auto it = ev.find(key);
  return it != ev.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string string_or(const nlohmann::json& ev, const char* key) {
  auto it = ev.find(key);
  return it != ev.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Appends the spans of one file to `out`; events without a pid take `default_pid`.
void read_into(const std::string& path, int64_t default_pid, Trace& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the trace file");
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) throw InputError(path + ": not JSON (expected Chrome trace-event JSON)");
  const nlohmann::json* events = nullptr;
  if (doc.is_array()) events = &doc;
  else if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array())
    events = &doc["traceEvents"];
  else
    throw InputError(path + ": not Chrome trace-event JSON (expected {\"traceEvents\": [...]} or an array of events)");
  out.files.push_back(path);

  std::map<std::pair<int64_t, std::string>, int64_t> string_tids;  // (pid, name) -> number
  std::map<std::pair<int64_t, int64_t>, std::vector<TraceEvent>> open;  // "B" stacks
  size_t index = 0;
  for (const nlohmann::json& ev : *events) {
    ++index;
    if (!ev.is_object()) throw InputError(path + ": trace event " + std::to_string(index) + " is not an object");
    const std::string ph = string_or(ev, "ph");
    const int64_t pid = ev.contains("pid") ? id_of(ev["pid"], default_pid) : default_pid;
    int64_t tid = 0;
    if (auto t = ev.find("tid"); t != ev.end()) {
      if (t->is_string()) {
        auto [it, fresh] = string_tids.try_emplace({pid, t->get<std::string>()}, 0);
        if (fresh) {
          it->second = 1000000 + static_cast<int64_t>(string_tids.size());
          out.thread_names[{pid, it->second}] = it->first.second;
        }
        tid = it->second;
      } else {
        tid = id_of(*t, 0);
      }
    }
    if (ph == "M") {
      const std::string what = string_or(ev, "name");
      const std::string label = ev.contains("args") && ev["args"].is_object() ? string_or(ev["args"], "name") : "";
      if (label.empty()) continue;
      if (what == "process_name") out.process_names[pid] = label;
      if (what == "thread_name") out.thread_names[{pid, tid}] = label;
      continue;
    }
    if (ph != "X" && ph != "B" && ph != "E") continue;
    if (!ev.contains("ts") || !ev["ts"].is_number())
      throw InputError(path + ": trace event " + std::to_string(index) + " (\"" + string_or(ev, "name") +
                       "\") has no numeric \"ts\"");
    TraceEvent e;
    e.name = string_or(ev, "name");
    e.cat = string_or(ev, "cat");
    e.pid = pid;
    e.tid = tid;
    e.ts_us = ev["ts"].get<double>();
    if (auto a = ev.find("args"); a != ev.end()) e.args = *a;
    if (ph == "X") {
      e.dur_us = std::max(0.0, number_or(ev, "dur", 0.0));
      out.events.push_back(std::move(e));
    } else if (ph == "B") {
      open[{pid, tid}].push_back(std::move(e));
    } else {  // "E": closes the latest open "B" of its track
      auto& stack = open[{pid, tid}];
      if (stack.empty()) continue;
      TraceEvent b = std::move(stack.back());
      stack.pop_back();
      b.dur_us = std::max(0.0, e.ts_us - b.ts_us);
      if (!e.args.is_null() && b.args.is_object() && e.args.is_object()) b.args.update(e.args);
      out.events.push_back(std::move(b));
    }
  }
}

void sort_events(Trace& t) {
  std::stable_sort(t.events.begin(), t.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    if (a.ts_us != b.ts_us) return a.ts_us < b.ts_us;
    if (a.pid != b.pid) return a.pid < b.pid;
    return a.tid < b.tid;
  });
}

}  // namespace

Trace read_trace_file(const std::string& path) {
  Trace t;
  read_into(path, 0, t);
  sort_events(t);
  return t;
}

Trace read_trace(const std::string& dir) {
  if (!fs::is_directory(dir)) throw InputError(dir + ": not a trace directory (expected the --trace DIR of a run)");
  Trace t;
  const fs::path merged = fs::path(dir) / "trace.json";
  if (fs::exists(merged)) {
    read_into(merged.string(), 0, t);
  } else {
    static const std::regex kRankFile(R"(rank(\d+)\.trace\.json)");
    std::vector<std::pair<int64_t, std::string>> files;
    for (const auto& entry : fs::directory_iterator(dir)) {
      std::smatch m;
      const std::string name = entry.path().filename().string();
      if (entry.is_regular_file() && std::regex_match(name, m, kRankFile))
        files.emplace_back(std::stoll(m[1].str()), entry.path().string());
    }
    if (files.empty()) throw InputError(dir + ": holds neither trace.json nor rank<R>.trace.json");
    std::sort(files.begin(), files.end());
    for (const auto& [rank, file] : files) read_into(file, rank, t);
  }
  sort_events(t);
  return t;
}

}  // namespace paratrain::monitor
