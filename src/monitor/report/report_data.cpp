// The report's data: the run summary, the table of means and one entry per chart, computed
// from the metrics lines (and the trace) exactly as they are. A chart whose inputs are not in
// the run gets "absent" (the reason) and no series; a series whose input is missing is left
// out and named in the chart's "notes". Nothing is interpolated or made up.
//
// How the per-step split reads the trainer's fields (src/train/step_report.cpp writes
// compute_ms = step_ms - exposed_comm_ms, so compute_ms holds the pipeline bubble and the data
// wait): exposed comm = exposed_comm_ms; bubble = bubble_fraction x step_ms; data wait =
// data_wait_ms; compute = compute_ms - bubble - data wait; other = step_ms - compute_ms -
// exposed_comm_ms (time neither field covers; zero for today's trainer). Negative parts clamp
// to zero.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/monitor/report.h"
#include "report_detail.h"

namespace paratrain::monitor {

namespace {

using nlohmann::json;

std::optional<double> num(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  const double v = it->get<double>();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

// [[step, value], ...] of the lines that carry `key` (times `scale`).
json points(const std::vector<json>& lines, const char* key, double scale = 1.0) {
  json p = json::array();
  for (const json& l : lines)
    if (auto v = num(l, key)) p.push_back({l["step"].get<double>(), *v * scale});
  return p;
}

json series(const std::string& name, json pts, const std::string& axis = "left") {
  return {{"name", name}, {"axis", axis}, {"points", std::move(pts)}};
}

json chart(const std::string& id, const std::string& title, const std::string& kind, const std::string& what) {
  return {{"id", id}, {"title", title}, {"kind", kind}, {"what", what}, {"notes", json::array()},
          {"series", json::array()}};
}

// Mean of `key` over the training lines, skipping the first step (warm-up) when there are more.
std::optional<double> mean_of(const std::vector<json>& steps, const char* key, double scale = 1.0) {
  double sum = 0;
  int64_t n = 0;
  for (size_t i = steps.size() > 1 ? 1 : 0; i < steps.size(); ++i)
    if (auto v = num(steps[i], key)) sum += *v * scale, ++n;
  if (n == 0) return std::nullopt;
  return sum / static_cast<double>(n);
}

// The per-rank arrays of `key`, one vector of values per rank (lines without it skipped).
std::vector<std::vector<double>> per_rank(const std::vector<json>& steps, const char* key) {
  std::vector<std::vector<double>> out;
  for (const json& l : steps) {
    auto it = l.find(key);
    if (it == l.end() || !it->is_array()) continue;
    if (out.size() < it->size()) out.resize(it->size());
    for (size_t r = 0; r < it->size(); ++r)
      if ((*it)[r].is_number()) out[r].push_back((*it)[r].get<double>());
  }
  return out;
}

json loss_chart(const MetricsLog& log) {
  json c = chart("loss", "Loss and validation loss", "line",
                 "Training loss per step; validation loss (or accuracy) at each evaluation.");
  c["x_label"] = "step", c["y_label"] = "loss";
  json loss = points(log.steps, "loss"), val = points(log.evals, "val_loss"), acc = points(log.evals, "accuracy", 100);
  if (loss.empty()) c["absent"] = "no line carries \"loss\"";
  else c["series"].push_back(series("loss", loss));
  if (!val.empty()) c["series"].push_back(series("val_loss", val));
  if (!acc.empty()) c["series"].push_back(series("accuracy %", acc, "right")), c["y2_label"] = "accuracy %";
  if (val.empty() && acc.empty())
    c["notes"].push_back("validation loss: not in this run (no evaluation lines; train with --eval-every and --val-data)");
  return c;
}

json throughput_chart(const MetricsLog& log) {
  json c = chart("throughput", "Throughput and MFU", "line",
                 "Items per second over the whole global batch (left) and model FLOP utilisation (right).");
  c["x_label"] = "step";
  const bool tokens = !points(log.steps, "tokens_per_s").empty();
  const char* key = tokens ? "tokens_per_s" : "samples_per_s";
  json thr = points(log.steps, key), mfu = points(log.steps, "mfu", 100);
  c["y_label"] = key, c["y2_label"] = "MFU %";
  if (!thr.empty()) c["series"].push_back(series(key, thr));
  else c["notes"].push_back("tokens_per_s / samples_per_s: not in this run");
  if (!mfu.empty()) c["series"].push_back(series("MFU %", mfu, "right"));
  else c["notes"].push_back("MFU: not in this run");
  if (thr.empty() && mfu.empty()) c["absent"] = "no line carries tokens_per_s, samples_per_s or mfu";
  return c;
}

json split_chart(const MetricsLog& log) {
  json c = chart("split", "Where the step time goes", "stack",
                 "Each step's wall time split into compute, exposed (not overlapped) communication, "
                 "pipeline bubble, data wait and the rest.");
  c["x_label"] = "step", c["y_label"] = "ms";
  json x = json::array(), compute = json::array(), comm = json::array(), bubble = json::array(),
       wait = json::array(), other = json::array();
  bool has_comm = false, has_bubble = false, has_wait = false;
  for (const json& l : log.steps) {
    auto step_ms = num(l, "step_ms");
    if (!step_ms) continue;
    const auto exposed = num(l, "exposed_comm_ms");
    const auto frac = num(l, "bubble_fraction");
    const auto dw = num(l, "data_wait_ms");
    has_comm |= exposed.has_value(), has_bubble |= frac.has_value() && *frac >= 0, has_wait |= dw.has_value();
    const double e = std::max(0.0, exposed.value_or(0.0));
    const double b = frac && *frac >= 0 ? *frac * *step_ms : 0.0;
    const double w = std::max(0.0, dw.value_or(0.0));
    const double comp_field = num(l, "compute_ms").value_or(*step_ms - e);
    x.push_back(l["step"].get<double>());
    compute.push_back(std::max(0.0, comp_field - b - w));
    comm.push_back(e), bubble.push_back(b), wait.push_back(w);
    other.push_back(std::max(0.0, *step_ms - comp_field - e));
  }
  if (x.empty()) {
    c["absent"] = "no line carries \"step_ms\"";
    return c;
  }
  c["x"] = x;
  c["series"].push_back({{"name", "compute"}, {"values", compute}});
  if (has_comm) c["series"].push_back({{"name", "exposed comm"}, {"values", comm}});
  else c["notes"].push_back("exposed communication: not in this run");
  if (has_bubble) c["series"].push_back({{"name", "bubble"}, {"values", bubble}});
  else c["notes"].push_back("pipeline bubble: not in this run (no bubble_fraction: not a pipeline run)");
  if (has_wait) c["series"].push_back({{"name", "data wait"}, {"values", wait}});
  else c["notes"].push_back("data wait: not in this run");
  c["series"].push_back({{"name", "other"}, {"values", other}});
  return c;
}

json ranks_json(size_t n) {
  json cats = json::array();
  for (size_t r = 0; r < n; ++r) cats.push_back("rank " + std::to_string(r));
  return cats;
}

json memory_chart(const MetricsLog& log) {
  json c = chart("memory", "Peak memory per rank", "bars",
                 "The highest mem_peak_bytes each rank reported over the run (MiB): a rank far above the "
                 "others holds more than its share.");
  c["y_label"] = "MiB";
  const auto mem = per_rank(log.steps, "mem_peak_bytes");
  if (mem.empty()) {
    c["absent"] = "no line carries \"mem_peak_bytes\"";
    return c;
  }
  json peak = json::array();
  for (const auto& v : mem) peak.push_back(v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()) / 1048576.0);
  c["categories"] = ranks_json(mem.size());
  c["series"].push_back({{"name", "peak MiB"}, {"values", peak}});
  return c;
}

json step_time_chart(const MetricsLog& log, json& summary) {
  json c = chart("step_time", "Step time per rank (load balance)", "bars",
                 "Each rank's mean and slowest step (ms). Imbalance = slowest rank's mean over the mean of "
                 "all ranks, minus one: the time the others spend waiting for it.");
  c["y_label"] = "ms";
  const auto st = per_rank(log.steps, "step_ms_per_rank");
  if (st.empty()) {
    c["absent"] = "no line carries \"step_ms_per_rank\"";
    return c;
  }
  json mean = json::array(), max = json::array();
  double worst = 0, total = 0;
  for (const auto& v : st) {
    double s = 0, m = 0;
    for (double x : v) s += x, m = std::max(m, x);
    const double mu = v.empty() ? 0.0 : s / static_cast<double>(v.size());
    mean.push_back(mu), max.push_back(m);
    worst = std::max(worst, mu), total += mu;
  }
  const double avg = total / static_cast<double>(st.size());
  const double imbalance = avg > 0 ? (worst / avg - 1.0) * 100.0 : 0.0;
  c["categories"] = ranks_json(st.size());
  c["series"].push_back({{"name", "mean ms"}, {"values", mean}});
  c["series"].push_back({{"name", "max ms"}, {"values", max}});
  c["imbalance_pct"] = imbalance;
  summary["imbalance_pct"] = imbalance;
  return c;
}

json busbw_chart(const MetricsLog& log) {
  json c = chart("busbw", "Bus bandwidth", "line",
                 "Achieved bus bandwidth of each step's collectives (GB/s, nccl-tests' busbw), per group "
                 "where there are several: compare with `paratrain bench comm`.");
  c["x_label"] = "step", c["y_label"] = "GB/s";
  std::map<std::string, json> groups;  // name -> points
  for (const json& l : log.steps) {
    auto it = l.find("busbw_gbps");
    if (it == l.end()) continue;
    if (it->is_number()) groups["busbw"].push_back({l["step"].get<double>(), it->get<double>()});
    else if (it->is_object())
      for (auto g = it->begin(); g != it->end(); ++g)
        if (g->is_number()) groups[g.key()].push_back({l["step"].get<double>(), g->get<double>()});
  }
  if (groups.empty()) c["absent"] = "no line carries \"busbw_gbps\"";
  for (auto& [name, pts] : groups) c["series"].push_back(series(name, pts));
  return c;
}

json means_table(const MetricsLog& log) {
  struct Row {
    const char* key;
    const char* unit;
    double scale;
  };
  static const Row kRows[] = {{"step_ms", "ms", 1},         {"compute_ms", "ms", 1},
                              {"comm_ms", "ms", 1},         {"exposed_comm_ms", "ms", 1},
                              {"data_wait_ms", "ms", 1},    {"tokens_per_s", "tokens/s", 1},
                              {"samples_per_s", "samples/s", 1}, {"mfu", "%", 100},
                              {"busbw_gbps", "GB/s", 1},    {"bubble_fraction", "", 1},
                              {"grad_norm", "", 1},         {"loss_scale", "", 1}};
  // Throughput is tokens or samples: the row the run does not count is left out.
  const bool tokens = mean_of(log.steps, "tokens_per_s").has_value();
  json rows = json::array();
  for (const Row& r : kRows) {
    if (std::string(r.key) == (tokens ? "samples_per_s" : "tokens_per_s")) continue;
    auto m = mean_of(log.steps, r.key, r.scale);
    if (std::string(r.key) == "busbw_gbps" && !m) {  // per group: {"dp": x, "tp": y}
      const json groups = busbw_chart(log)["series"];
      for (const json& g : groups) {
        double sum = 0;
        size_t n = 0;
        for (const json& p : g["points"])
          if (log.steps.size() < 2 || p[0] != log.steps.front()["step"]) sum += p[1].get<double>(), ++n;
        if (n > 0) rows.push_back({{"name", "busbw_gbps " + g["name"].get<std::string>()}, {"unit", r.unit},
                                   {"value", sum / static_cast<double>(n)}});
      }
      if (!groups.empty()) continue;
    }
    rows.push_back({{"name", r.key}, {"unit", r.unit}, {"value", m ? json(*m) : json(nullptr)}});
  }
  return rows;
}

json summary_of(const MetricsLog& log) {
  const json& last = log.steps.back();
  json s = {{"steps", log.steps.size()},
            {"first_step", log.steps.front()["step"]},
            {"last_step", last["step"]},
            {"evals", log.evals.size()}};
  if (auto v = num(last, "loss")) s["final_loss"] = *v;
  for (auto it = log.evals.rbegin(); it != log.evals.rend(); ++it) {
    if (auto v = num(*it, "val_loss")) { s["final_val_loss"] = *v; break; }
    if (auto v = num(*it, "accuracy")) { s["final_accuracy"] = *v; break; }
  }
  if (auto v = mean_of(log.steps, "tokens_per_s")) s["mean_tokens_per_s"] = *v;
  if (auto v = mean_of(log.steps, "samples_per_s")) s["mean_samples_per_s"] = *v;
  int64_t ranks = 0;
  if (auto v = num(last, "world_size")) ranks = static_cast<int64_t>(*v);
  for (const char* k : {"mem_peak_bytes", "step_ms_per_rank"})
    if (ranks == 0 && last.contains(k) && last[k].is_array()) ranks = static_cast<int64_t>(last[k].size());
  if (ranks > 0) s["ranks"] = ranks;
  if (last.contains("model") && last["model"].is_object() && last["model"].contains("name"))
    s["model"] = last["model"]["name"];
  if (last.contains("layout") && last["layout"].is_object()) s["layout"] = last["layout"];
  if (last.contains("precision")) s["precision"] = last["precision"];
  return s;
}

}  // namespace

json build_report_data(const MetricsLog& log, const Trace* trace, const ReportOptions& opt) {
  json data = {{"title", opt.title}, {"source", log.path}};
  json summary = summary_of(log);
  json charts = json::array();
  charts.push_back(loss_chart(log));
  charts.push_back(throughput_chart(log));
  charts.push_back(split_chart(log));
  charts.push_back(memory_chart(log));
  charts.push_back(step_time_chart(log, summary));
  charts.push_back(busbw_chart(log));
  charts.push_back(detail::timeline_chart(trace, opt.max_timeline_events));
  data["summary"] = std::move(summary);
  data["means"] = means_table(log);
  data["charts"] = std::move(charts);
  return data;
}

}  // namespace paratrain::monitor
