// `paratrain bench comm`: measures a collective over a range of sizes, nccl-tests style.
#pragma once

namespace paratrain::cli {

// Runs the benchmark on this rank (ranks come from the environment: launcher, torchrun-style
// variables, or mpirun). Returns the process exit code (0 ok, 1 wrong results or failure,
// 2 bad usage).
int run_bench_comm(int argc, char** argv);

}  // namespace paratrain::cli
