#include "verify_cmd.h"

#include <iostream>

#include "cli_util.h"
#include "paratrain/base/atomic_file.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/train/verify.h"
#include "train_cmd.h"

namespace paratrain::cli {

int run_verify(int argc, char** argv) {
  train::TrainConfig c;
  c.steps = 3;
  train::VerifyOptions o;
  std::string json;
  CLI::App app{"Check the gradient synchronisation of a training configuration: every step, the applied gradients "
               "against the mean of the ranks' local gradients, the replicas' parameters bit for bit, and the "
               "parameters against a single-process run of the same global batch (docs/verify.md). Run it under "
               "paratrain launch like train",
               "verify"};
  app.option_defaults()->always_capture_default();
  add_train_flags(app, c);
  app.add_option("--json", json, "also write the report as JSON to this file (rank 0)");
  app.add_option("--grad-tolerance", o.grad_tolerance, "relative tolerance of the gradient check (-1 = from the config)");
  app.add_option("--param-tolerance", o.param_tolerance,
                 "relative tolerance of the single-process comparison (-1 = from the config, 0 = bit-identical)");
  if (!parse_or_throw(app, argc, argv)) return 0;
  if (c.steps <= 0) PT_THROW(InputError, "verify: --steps must be at least 1");
  const train::VerifyReport r = train::verify(c, std::cerr, o);
  if (comm::read_job_env().rank == 0) {
    train::print_verify_report(r, std::cout);
    if (!json.empty()) write_file_atomic(json, r.to_json().dump(2) + "\n");
  }
  return r.passed ? 0 : 1;
}

}  // namespace paratrain::cli
