// Internal to src/monitor/report: the pieces report_data.cpp and report_html.cpp share.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/monitor/report.h"

namespace paratrain::monitor::detail {

// The "timeline" chart's entry: one step's spans per rank and track (timeline.cpp). `trace`
// may be null (no --trace given): the entry is then absent with that reason.
nlohmann::json timeline_chart(const Trace* trace, size_t max_events);

// The page's script: draws every chart of the embedded data (report_script.cpp).
const char* report_script();

// The page's style sheet (report_html.cpp's neighbour, report_script.cpp).
const char* report_style();

}  // namespace paratrain::monitor::detail
