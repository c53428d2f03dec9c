// `paratrain plan`: what a layout would do before anything runs. Today: --print-schedule, a
// pipeline schedule printed and checked as data (parallel/pipeline/schedule.h). The layout
// planner (memory and step time of each dp x tp x pp layout) is not built yet and says so.
#pragma once

namespace paratrain::cli {

int run_plan(int argc, char** argv);

}  // namespace paratrain::cli
