// The `paratrain` program: picks the subcommand and hands over to it. Exit codes (DESIGN.md):
// 0 success; 2 bad input or usage, one line on stderr; 1 any other failure, with the rank.
#include <cstring>
#include <iostream>
#include <string>

#include "bench_comm_cmd.h"
#include "bench_compute_cmd.h"
#include "data_prepare_cmd.h"
#include "doctor_cmd.h"
#include "launch_cmd.h"
#include "plan_cmd.h"
#include "report_cmd.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "train_cmd.h"
#include "verify_cmd.h"
#include "paratrain/version.h"

namespace {

const char* kUsage =
    "usage: paratrain <command> [options]   (paratrain <command> --help for its options)\n"
    "\n"
    "commands:\n"
    "  train          train a model (GPT on token files, MLP/CNN on Fashion-MNIST)\n"
    "  sample         generate text with a trained GPT\n"
    "  data prepare   train a tokenizer and write token files (llm.c .bin)\n"
    "  launch         start and supervise one process per device, on one or many hosts\n"
    "  bench comm     measure collective bandwidth (nccl-tests style table)\n"
    "  bench compute  measure this CPU's f32 peak (FMA throughput) and GEMM peak: MFU's denominator\n"
    "  doctor         check this machine (and, under a launcher, the job): pass/warn/fail, --json\n"
    "  plan           the layouts of a model on N devices: memory, step time, the one to use; --check, --print-schedule\n"
    "  report         one self-contained HTML page of a run's charts from its metrics (and trace)\n"
    "  verify         check the gradient synchronisation of a training configuration: PASS or the first divergence\n";

std::string rank_tag() {
  for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (auto r = paratrain::env::raw(v)) return "rank " + *r + ": ";
  return "";
}

int dispatch(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version") {
    std::cout << "paratrain " PARATRAIN_VERSION_STRING "\n";
    return 0;
  }
  // A malformed PARATRAIN_LOG stops here with one line (exit 2); doctor reports it as a check.
  if (cmd != "doctor") paratrain::log::configure_from_env();
  if (cmd == "train") return paratrain::cli::run_train(argc - 1, argv + 1);
  if (cmd == "sample") return paratrain::cli::run_sample(argc - 1, argv + 1);
  if (cmd == "launch") return paratrain::cli::run_launch(argc - 1, argv + 1);
  if (cmd == "doctor") return paratrain::cli::run_doctor(argc - 1, argv + 1);
  if (cmd == "plan") return paratrain::cli::run_plan(argc - 1, argv + 1);
  if (cmd == "report") return paratrain::cli::run_report(argc - 1, argv + 1);
  if (cmd == "verify") return paratrain::cli::run_verify(argc - 1, argv + 1);
  if (cmd == "data" || cmd == "bench") {
    const std::string sub = argc > 2 ? argv[2] : "";
    if (cmd == "data" && sub == "prepare") return paratrain::cli::run_data_prepare(argc - 2, argv + 2);
    if (cmd == "bench" && sub == "comm") return paratrain::cli::run_bench_comm(argc - 2, argv + 2);
    if (cmd == "bench" && sub == "compute") return paratrain::cli::run_bench_compute(argc - 2, argv + 2);
    throw paratrain::InputError("unknown command 'paratrain " + cmd + (sub.empty() ? "" : " " + sub) +
                                "' (expected " + (cmd == "data" ? "'data prepare'" : "'bench comm' or 'bench compute'") + ")");
  }
  throw paratrain::InputError("unknown command '" + cmd + "' (see paratrain --help)");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return dispatch(argc, argv);
  } catch (const paratrain::InputError& e) {
    std::cerr << "paratrain: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "paratrain: " << rank_tag() << "failed: " << e.what() << "\n";
    return 1;
  }
}
