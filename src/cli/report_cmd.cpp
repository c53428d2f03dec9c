#include "cli/report_cmd.h"

#include "cli/cli_util.h"

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>

#include "paratrain/monitor/report.h"

namespace paratrain::cli {

int run_report(int argc, char** argv) {
  std::string metrics, trace_dir, out = "report.html", title;
  monitor::ReportOptions opt;
  CLI::App app{
      "Turn a run's metrics file (paratrain train --metrics FILE) and optionally its trace (--trace DIR) into "
      "one self-contained HTML page: loss and validation loss, throughput and MFU, the compute / communication / "
      "bubble split, per-rank memory and step time, bus bandwidth and a timeline excerpt. The page needs no "
      "network to view; charts whose data the run did not record say so.",
      "paratrain report"};
  app.option_defaults()->always_capture_default();
  app.add_option("metrics", metrics, "the metrics file (one JSON object per line)")->required();
  app.add_option("--trace", trace_dir, "the run's trace directory (DIR/trace.json or DIR/rank<R>.trace.json)");
  app.add_option("-o,--out", out, "the HTML file to write");
  app.add_option("--title", title, "the page's title (default: paratrain run: METRICS)");
  app.add_option("--max-timeline-events", opt.max_timeline_events, "at most this many spans in the timeline");
  if (!parse_or_throw(app, argc, argv, "report")) return 0;
  opt.title = title.empty() ? "paratrain run: " + std::filesystem::path(metrics).filename().string() : title;
  const monitor::MetricsLog log = monitor::read_metrics_log(metrics);
  std::optional<monitor::Trace> trace;
  if (!trace_dir.empty()) trace = monitor::read_trace(trace_dir);
  monitor::write_report(out, log, trace ? &*trace : nullptr, opt);
  std::cout << "report: " << out << " (" << log.steps.size() << " steps, " << log.evals.size() << " evaluations"
            << (trace ? ", " + std::to_string(trace->events.size()) + " trace spans" : std::string()) << ")\n";
  return 0;
}

}  // namespace paratrain::cli
