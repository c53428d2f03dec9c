// `paratrain doctor`: the checks of monitor/doctor.h as a table (or one JSON document).
// Exit code: 0 when no check failed (warnings allowed), 1 when one did, 2 for bad usage.
// Under a launcher every rank runs the checks; rank 0 prints the job's report.
#include "doctor_cmd.h"

#include <iostream>

#include "cli_util.h"
#include "paratrain/base/atomic_file.h"
#include "paratrain/base/env.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/doctor.h"

namespace paratrain::cli {

int run_doctor(int argc, char** argv) {
  CLI::App app{
      "Check this machine (CPU, memory, clock, BLAS and kernels, MPI, /dev/shm, ports, CUDA, PARATRAIN_* "
      "variables) and, under `paratrain launch ... -- paratrain doctor`, the job (store, all-reduce on each "
      "backend, bandwidth, clock skew). Exit code 0: no check failed; 1: one did; 2: bad usage",
      "doctor"};
  bool json = false;
  std::string output;
  double mib = 4, timeout_s = 30;
  app.add_flag("--json", json, "print one JSON document instead of the table (schema: docs/doctor.md)");
  app.add_option("-o,--output", output, "also write the JSON document to FILE (rank 0)");
  app.add_option("--allreduce-mib", mib, "size of the timed all-reduce under a launcher, MiB (default 4)")
      ->check(CLI::Range(1.0 / 1024, 1024.0));
  app.add_option("--timeout", timeout_s, "deadline of each wait of the job checks, seconds (default 30)")
      ->check(CLI::PositiveNumber);
  if (!parse_or_throw(app, argc, argv)) return 0;

  // A rank's compute threads, as training sets them (a malformed value is reported by the checks).
  try {
    if (int64_t t = env::get_int("PARATRAIN_THREADS"); t > 0) kernels::cpu::set_num_threads(static_cast<int>(t));
  } catch (const Error&) {
  }
  monitor::doctor::Options opts;
  opts.allreduce_bytes = static_cast<size_t>(mib * (1u << 20));
  opts.timeout_s = timeout_s;
  const monitor::doctor::Report rep = monitor::doctor::run(opts);
  if (rep.rank == 0) {
    const nlohmann::json doc = monitor::doctor::to_json(rep);
    if (json)
      std::cout << doc.dump(2) << "\n";
    else
      std::cout << monitor::doctor::format_table(rep);
    std::cout.flush();
    if (!output.empty()) write_file_atomic(output, doc.dump(2) + "\n");
  } else if (rep.count(monitor::doctor::Status::kFail) > 0) {
    std::cerr << "rank " << rep.rank << ": " << rep.count(monitor::doctor::Status::kFail)
              << " doctor checks failed (rank 0's report lists them)\n";
  }
  return rep.failed() ? 1 : 0;
}

}  // namespace paratrain::cli
