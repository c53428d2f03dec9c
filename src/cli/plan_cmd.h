// `paratrain plan`: what a layout would do before anything runs (docs/plan.md). The layout
// planner (parallel/planner.h): every dp x tp x pp layout of a GPT on N devices with its
// per-rank memory, estimated step time and communication, and the one it recommends;
// --check compares the memory estimate with a run's metrics; --print-schedule prints and
// checks a pipeline schedule as data (parallel/pipeline/schedule.h).
#pragma once

namespace paratrain::cli {

int run_plan(int argc, char** argv);

}  // namespace paratrain::cli
