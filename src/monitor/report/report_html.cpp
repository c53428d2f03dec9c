// The report page: a static header (summary, table of means), one card per chart (an absent
// chart's card says "not in this run" and why, in the markup itself), the data as JSON and the
// drawing script (report_script.cpp). Every string from the run is escaped, '/' included, so
// neither the markup nor the embedded JSON can hold a URL or close the <script> early.
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>

#include "paratrain/base/atomic_file.h"
#include "paratrain/monitor/report.h"
#include "report_detail.h"

namespace paratrain::monitor {

namespace {

using nlohmann::json;

std::string esc(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '/': out += "&#47;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string text_of(const json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// 4 significant digits, no exponent for ordinary magnitudes.
std::string fmt(double v) {
  char buf[64];
  const double a = std::fabs(v);
  if (a != 0 && (a >= 1e7 || a < 1e-3)) std::snprintf(buf, sizeof buf, "%.3e", v);
  else if (a >= 1000) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// The JSON for a <script type="application/json">: '/' and '<' only occur inside strings,
// where "\/" and "\u003c" are the same characters to JSON.parse.
std::string embedded_json(const json& data) {
  const std::string raw = data.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string out;
  out.reserve(raw.size() + raw.size() / 16);
  for (char c : raw) {
    if (c == '/') out += "\\/";
    else if (c == '<') out += "\\u003c";
    else out += c;
  }
  return out;
}

void summary_html(std::ostream& os, const json& s) {
  auto item = [&](const std::string& label, const std::string& value) {
    os << "<div><dt>" << esc(label) << "</dt><dd>" << esc(value) << "</dd></div>";
  };
  os << "<dl class=\"summary\" id=\"summary\">";
  item("steps", std::to_string(s["steps"].get<int64_t>()) + " (" + text_of(s["first_step"]) + " to " +
                    text_of(s["last_step"]) + ")");
  if (s.contains("final_loss")) item("final loss", fmt(s["final_loss"].get<double>()));
  if (s.contains("final_val_loss")) item("final val_loss", fmt(s["final_val_loss"].get<double>()));
  if (s.contains("final_accuracy")) item("final accuracy", fmt(100 * s["final_accuracy"].get<double>()) + " %");
  if (s.contains("mean_tokens_per_s")) item("mean tokens/s", fmt(s["mean_tokens_per_s"].get<double>()));
  if (s.contains("mean_samples_per_s")) item("mean samples/s", fmt(s["mean_samples_per_s"].get<double>()));
  item("ranks", s.contains("ranks") ? text_of(s["ranks"]) : "not in this run");
  if (s.contains("imbalance_pct")) item("step-time imbalance", fmt(s["imbalance_pct"].get<double>()) + " %");
  if (s.contains("model")) item("model", text_of(s["model"]));
  if (s.contains("layout")) {
    std::string l;
    for (auto it = s["layout"].begin(); it != s["layout"].end(); ++it)
      l += (l.empty() ? "" : " ") + it.key() + " " + text_of(*it);
    item("layout", l);
  }
  if (s.contains("precision")) item("precision", text_of(s["precision"]));
  item("evaluations", text_of(s["evals"]));
  os << "</dl>\n";
}

void means_html(std::ostream& os, const json& means) {
  os << "<section class=\"card means-card\"><h2>Means per step</h2><p class=\"what\">Over the training steps, "
        "the first (warm-up) step left out when there are more.</p><table class=\"means\" id=\"means\">"
        "<tr><th>metric</th><th>mean</th><th>unit</th></tr>";
  for (const json& r : means) {
    os << "<tr><td>" << esc(r["name"].get<std::string>()) << "</td>";
    if (r["value"].is_null()) os << "<td class=\"na\">not in this run</td>";
    else os << "<td>" << fmt(r["value"].get<double>()) << "</td>";
    os << "<td>" << esc(r["unit"].get<std::string>()) << "</td></tr>";
  }
  os << "</table></section>\n";
}

void chart_html(std::ostream& os, const json& c) {
  const std::string id = c["id"].get<std::string>();
  os << "<section class=\"card" << (c["kind"] == "gantt" ? " wide" : "") << "\" id=\"card-" << esc(id) << "\"><h2>"
     << esc(c["title"].get<std::string>()) << "</h2><p class=\"what\">" << esc(c["what"].get<std::string>())
     << "</p><div class=\"chart\" id=\"chart-" << esc(id) << "\" data-kind=\"" << esc(c["kind"].get<std::string>())
     << "\"";
  if (c.contains("absent"))
    os << " data-absent=\"1\" data-rendered=\"0\"><p class=\"absent\">not in this run: "
       << esc(c["absent"].get<std::string>()) << "</p>";
  else
    os << " data-rendered=\"0\">";
  os << "</div>";
  if (!c["notes"].empty()) {
    os << "<ul class=\"notes\">";
    for (const json& n : c["notes"]) os << "<li class=\"absent\">" << esc(n.get<std::string>()) << "</li>";
    os << "</ul>";
  }
  os << "</section>\n";
}

}  // namespace

std::string render_report_html(const json& data) {
  std::ostringstream os;
  const std::string title = data["title"].get<std::string>();
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << esc(title)
     << "</title>\n<style>" << detail::report_style() << "</style></head>\n<body>\n<header><h1>" << esc(title)
     << "</h1><p class=\"source\">metrics: " << esc(data["source"].get<std::string>()) << "</p>\n";
  summary_html(os, data["summary"]);
  os << "</header>\n";
  means_html(os, data["means"]);
  os << "<main class=\"grid\">\n";
  for (const json& c : data["charts"]) chart_html(os, c);
  os << "</main>\n<script type=\"application/json\" id=\"report-data\">" << embedded_json(data)
     << "</script>\n<script>" << detail::report_script() << "</script>\n</body></html>\n";
  return os.str();
}

void write_report(const std::string& path, const MetricsLog& log, const Trace* trace, const ReportOptions& opt) {
  write_file_atomic(path, render_report_html(build_report_data(log, trace, opt)));
}

}  // namespace paratrain::monitor
