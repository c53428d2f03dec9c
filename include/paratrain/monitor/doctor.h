// `paratrain doctor` as a library: checks of the machine and, under a launcher, of the job.
//
// A Check is one finding: a dotted name ("cpu.vector", "comm.shm", "job.allreduce.tcp"), a
// status, the measured value as one line of text, the same facts as numbers/flags in
// `data`, and for a warning or a failure the fix in one line. Groups of checks:
//   host_checks()    cpu (model, cores, vector extensions, threads, frequency governor),
//                    memory (total, available, cgroup limit), clock (source, steady_clock,
//                    NTP synchronisation)
//   kernel_checks()  BLAS (oneDNN's version and ISA, a GEMM checked against a reference and
//                    timed) and which CPU kernels were chosen at run time from the CPU flags
//   comm_checks()    MPI (built in, mpirun), /dev/shm size and free space vs what a job of
//                    `local_ranks` ranks needs, free ports, hostname and tcp address
//   cuda_checks()    the build's CUDA support, and through dlopen (never linked): the
//                    driver (libcuda.so.1), the runtime, every GPU (model, memory, all the
//                    same?), peer-to-peer, NVLink (libnvidia-ml.so.1), NCCL (libnccl.so.2).
//                    No driver is a skip with the reason, not a failure
//   env_checks()     every PARATRAIN_* variable set: known ones with their value checked
//                    through base/env.h (malformed: fail), unknown ones a warning naming
//                    the nearest declared variable
//   job_checks()     only with WORLD_SIZE > 1: the store reachable (PARATRAIN_STORE_PORT,
//                    else MASTER_PORT), ranks and hosts, clock skew between ranks, and on
//                    every available backend (shm within one host, tcp, mpi under mpirun)
//                    a small all-reduce checked element by element and a timed all-reduce
//                    of `allreduce_bytes` with its bus bandwidth (nccl-tests: busbw = algbw
//                    x 2(n-1)/n). Collective over the job: every rank calls it.
// run() does all of them; under a launcher rank 0's report also holds every other rank's
// warnings and failures that rank 0 did not see itself (Check::rank names the rank), and
// every rank gets the same verdict.
//
// No function here throws for what it checks: a check that cannot run becomes a fail (or a
// skip, where the thing is optional) carrying the reason. Every wait has a deadline
// (Options::timeout_s). Thread-safety: call from one thread; job_checks()/run() are
// collective and must be called once per process at the same point on every rank.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace paratrain::monitor::doctor {

enum class Status { kPass, kWarn, kFail, kSkip };
// "pass" | "warn" | "fail" | "skip"
const char* status_name(Status s);

struct Check {
  std::string name;    // dotted: "<group>.<what>[.<detail>]"
  Status status = Status::kPass;
  std::string value;   // the measured value, one line
  std::string fix;     // one line; set for warn and fail (and a skip's reason may sit in value)
  nlohmann::json data = nlohmann::json::object();  // the value's facts as numbers and flags
  int rank = 0;        // the rank that made the check
};

struct Options {
  size_t allreduce_bytes = 4u << 20;  // size of the timed all-reduce of job_checks()
  int allreduce_iters = 5;            // timed iterations (after 2 untimed)
  double timeout_s = 30;              // deadline of every store wait and collective
  int local_ranks = 0;                // ranks per host the comm checks size /dev/shm for; 0 = LOCAL_WORLD_SIZE, else the cores
};

struct Report {
  int rank = 0;
  int world_size = 1;
  std::string host;
  std::vector<Check> checks;
  bool job_failed = false;  // under a launcher: rank 0's verdict for the whole job
  bool failed() const;      // job_failed, or any check failed
  int count(Status s) const;
};

std::vector<Check> host_checks();
std::vector<Check> kernel_checks();
std::vector<Check> comm_checks(const Options& options = {});
std::vector<Check> cuda_checks();
std::vector<Check> env_checks();
// Collective over the job found in the environment (comm::read_job_env()); empty when
// WORLD_SIZE is 1. Each rank gets its own view (run() gathers them to rank 0).
std::vector<Check> job_checks(const Options& options = {});

// Everything; under a launcher collective, rank 0 holding the job's report (above).
Report run(const Options& options = {});

// The PARATRAIN_* variables in effect: every declared one (its value, or its default) and
// every unknown one set. PARATRAIN_TOKEN's value is never shown, only its length.
nlohmann::json variables_json();

// One JSON document (schema in docs/doctor.md): version, rank, world_size, host, ok,
// summary counts, checks, variables.
nlohmann::json to_json(const Report& report);
// The human table: a header, then exactly one line per check ("STATUS  name  value"), each
// warning's or failure's fix on the check's own line after "fix:", then a summary line and
// the variables.
std::string format_table(const Report& report);

}  // namespace paratrain::monitor::doctor
