#include "plan_cmd.h"

#include <iomanip>
#include <iostream>

#include "cli_util.h"
#include "paratrain/parallel/pipeline/schedule.h"

namespace paratrain::cli {

int run_plan(int argc, char** argv) {
  CLI::App app{"Plan a layout. Today: print and check a pipeline schedule (--print-schedule)", "plan"};
  bool print_schedule = false;
  int pp = 2, micro_batches = 4, virtual_chunks = 1;
  std::string schedule = "1f1b";
  app.add_flag("--print-schedule", print_schedule,
               "print each rank's actions for one step (F, B, I, W and the sends and receives) and check them: "
               "no deadlock, forwards before backwards, held activations, the bubble against the theory");
  app.add_option("--pp", pp, "pipeline stages (ranks)");
  app.add_option("--micro-batches", micro_batches, "micro-batches per step (train's --grad-accum)");
  app.add_option("--pp-schedule", schedule, "gpipe | 1f1b | interleaved | zb1p");
  app.add_option("--pp-virtual", virtual_chunks, "model chunks per rank (interleaved)");
  if (!parse_or_throw(app, argc, argv)) return 0;
  if (!print_schedule)
    throw InputError(
        "plan: the layout planner (memory and step time of each dp x tp x pp layout) is not built yet; "
        "--print-schedule prints and checks a pipeline schedule");
  using namespace parallel::pipeline;
  const ScheduleSpec spec{parse_schedule(schedule), pp, micro_batches, virtual_chunks};
  const Schedule s = build_schedule(spec);
  const ScheduleCheck c = check_schedule(s);
  std::cout << schedule_name(spec.kind) << ", " << pp << " stages, " << micro_batches << " micro-batches"
            << (virtual_chunks > 1 ? ", " + std::to_string(virtual_chunks) + " chunks per rank" : "") << "\n"
            << format_schedule(s);
  if (!c.ok) throw Error("plan: the schedule does not check: " + c.problem);
  std::cout << std::fixed << std::setprecision(3) << "check: ok (no deadlock; every micro-batch forward before "
            << "backward on every stage; every receive has its send)\nbubble: " << c.bubble_fraction
            << " of the step (theory " << theoretical_bubble(spec) << "), with F = I = W = 1 (B = 2)\n"
            << "peak activations held (micro-batch chunks) per rank:";
  for (int a : c.peak_activations) std::cout << " " << a;
  std::cout << "\n";
  return 0;
}

}  // namespace paratrain::cli
