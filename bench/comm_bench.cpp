// Stand-alone `paratrain bench comm` (same code as the CLI subcommand), so bench/comm_allreduce.sh
// can run before the CLI wires the subcommand: comm_bench [bench comm flags].
#include "cli/bench_comm_cmd.cpp"  // NOLINT: the logic lives in one place

int main(int argc, char** argv) { return paratrain::cli::run_bench_comm(argc, argv); }
