// paratrain::spawn(): start N ranks of the calling program on this host, as
// torch.multiprocessing.spawn does, so a program needs no launcher to use a whole machine
// (docs/library.md, "spawn").
//
//   int main(int argc, char** argv) {
//     return paratrain::spawn(2, [&](int rank) {
//       auto pg = paratrain::comm::create_process_group_from_env();
//       ...                      // train; rank == pg->rank()
//       return 0;                // this rank's exit status
//     });
//   }
//
// How: re-execution, never fork of a running (possibly multi-threaded) process. In the
// calling process ("the parent"), spawn() runs the launcher (launch::Launcher, the engine of
// `paratrain launch --nproc-per-node N`) on this same executable (/proc/self/exe) with the
// same arguments (/proc/self/cmdline). Each of the N children starts main() from the top
// with the launcher's environment contract (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT, PARATRAIN_TOKEN, PARATRAIN_STORE_PORT, ...; docs/launch.md) plus
// PARATRAIN_SPAWNED_BY=<the parent's pid>. When such a child reaches spawn(), spawn() calls
// fn(RANK) and ends the process with its result; it never returns in a child. So:
//  - the code before spawn() runs in every process (as with Python's "spawn" start method):
//    call spawn() early in main, before anything expensive, and before starting threads
//    (spawn() sets environment variables for the children while the launcher runs);
//  - the code after spawn() runs only in the parent, once the job is over;
//  - a program calls spawn() once (a child runs the function of the first call it reaches;
//    a second call in one process is an InputError).
// The parent supervises like the launcher: children's output lines are prefixed "[rank] ",
// the first rank that exits non-zero or dies by a signal stops the others (SIGTERM, then
// SIGKILL after the grace period), SIGINT/SIGTERM/SIGHUP to the parent are forwarded, and a
// failure prints the launcher's summary table on stderr.
//
// Already a rank: when the environment says this process is one rank of a launched job
// (RANK/WORLD_SIZE from `paratrain launch` or torchrun; or mpirun's/PMI's/Slurm's variables
// with more than one task), spawn() starts nothing: it calls fn(rank) in this process and
// returns its result. So the same program runs unchanged under spawn() and under
// `paratrain launch --nproc-per-node N -- ./prog`, with the same results. The job's world
// size must equal nprocs (else InputError). A single-task mpirun/Slurm allocation (size 1)
// does not count as a job: spawn() starts its N ranks there.
//
// fn's result is the rank's exit status: 0..255 (other values count as 1). An exception
// escaping fn prints "error: <what>" on stderr and gives 2 for paratrain::InputError, 1 for
// anything else; this holds in a child and in the already-a-rank case alike.
//
// Thread-safety: call it from the main thread (the launcher's children get PR_SET_PDEATHSIG
// bound to the calling thread), one spawn() at a time, while no other thread reads or
// writes the environment. The launcher installs signal handlers only while it runs.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "paratrain/launch/options.h"

namespace paratrain {

struct SpawnOptions {
  // SIGTERM -> SIGKILL delay when stopping the other ranks after a failure.
  double grace_period_s = launch::kDefaultGracePeriodS;
  // "" = none; else DIR/rank_<r>.log (each rank's output, unprefixed) and DIR/rank_<r>.error.json
  // (TORCHELASTIC_ERROR_FILE), as `paratrain launch --log-dir`.
  std::string log_dir;
  // Extra KEY=VALUE variables for the children only (e.g. "PARATRAIN_BACKEND=tcp"); set in
  // this process's environment while the launcher runs and restored afterwards.
  std::vector<std::string> env;
};

// Runs fn on nprocs ranks as described above. In the parent returns the job's exit code: 0
// when every rank returned 0, else the first failing rank's status (its exit code, or 128 + s
// for a signal s), after the other ranks were stopped. In the already-a-rank case returns
// fn's status. In a spawned child never returns. Throws InputError for nprocs < 1, an empty
// fn, a job whose world size is not nprocs, a second call, a malformed SpawnOptions value
// (and what launch::Launcher::run() throws before any child starts); IoError when
// the program's own command line or executable cannot be read.
int spawn(int nprocs, const std::function<int(int rank)>& fn, const SpawnOptions& options = {});

// True in a process that spawn() started (PARATRAIN_SPAWNED_BY names this process's parent).
bool is_spawned_rank();

namespace launch {
using paratrain::spawn;
using paratrain::SpawnOptions;
}  // namespace launch

}  // namespace paratrain
