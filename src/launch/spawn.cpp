// paratrain::spawn(): the three roles of one call (spawn.h). A spawned child runs fn and
// exits; a rank of an outside job runs fn in place; otherwise this process becomes the
// launcher of its own re-executed copies.
#include "paratrain/launch/spawn.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <utility>

#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/launch/launcher.h"

namespace paratrain {
namespace {

constexpr const char* kMarker = "PARATRAIN_SPAWNED_BY";

// A spawned child re-runs main() and runs the function of the first spawn() it reaches, so a
// process that gets to a second call would give its ranks the wrong function.
bool g_called = false;
void claim_the_one_call() {
  if (g_called)
    PT_THROW(InputError, "spawn: called a second time in this process; its ranks re-execute the program and "
                         "would run the first call's function: call spawn() once, early in main");
  g_called = true;
}

// fn(rank) as an exit status: exceptions become "error: ..." and 2 (InputError) or 1.
int run_rank(const std::function<int(int)>& fn, int rank) {
  int code = 1;
  try {
    code = fn(rank);
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = 1;
  } catch (...) {
    std::fprintf(stderr, "error: an exception that is not a std::exception escaped the rank's function\n");
    code = 1;
  }
  if (code < 0 || code > 255) code = 1;
  return code;
}

void check_world(const comm::JobEnv& job, int nprocs, const char* where) {
  if (job.world_size != nprocs)
    PT_THROW(InputError, "spawn(", nprocs, ", ...): ", where, " is rank ", job.rank, " of a job of ", job.world_size,
             " ranks (", job.source, " environment: WORLD_SIZE or its equivalent); start it with ", nprocs,
             " ranks or call spawn(", job.world_size, ", ...)");
}

// Whether the environment says this process is one rank of a job started from outside.
bool outside_rank(const comm::JobEnv& job) {
  if (job.source == "torchrun") return true;  // RANK is set: the launcher's/torchrun's contract
  if (job.source == "default") return false;
  return job.world_size > 1;  // mpirun/PMI/Slurm: a single-task allocation is no job
}

// The program's own command line, argv[1..] (argv[0] is replaced by the executable).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  if (!in) PT_THROW(IoError, "spawn: cannot read /proc/self/cmdline (the program's arguments for its ranks)");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find('\0', pos);
    if (end == std::string::npos) end = all.size();
    args.emplace_back(all, pos, end - pos);
    pos = end + 1;
  }
  if (!args.empty()) args.erase(args.begin());
  return args;
}

// The executable to re-execute: its path when that is still this very file (so the ranks'
// argv[0] is a real path), else /proc/self/exe (the file was replaced or deleted meanwhile).
std::string own_executable() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  struct stat self {}, named {};
  if (::stat("/proc/self/exe", &self) != 0)
    PT_THROW(IoError, "spawn: cannot find this program's executable (/proc/self/exe)");
  if (n > 0) {
    std::string path(buf, static_cast<size_t>(n));
    if (::stat(path.c_str(), &named) == 0 && named.st_dev == self.st_dev && named.st_ino == self.st_ino) return path;
  }
  return "/proc/self/exe";
}

// Sets variables for the children while it lives; puts the old values back when destroyed.
class EnvOverride {
 public:
  void set(const std::string& key, const std::string& value) {
    const char* old = std::getenv(key.c_str());
    saved_.emplace_back(key, old ? std::optional<std::string>(old) : std::nullopt);
    ::setenv(key.c_str(), value.c_str(), 1);
  }
  ~EnvOverride() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
      if (it->second) ::setenv(it->first.c_str(), it->second->c_str(), 1);
      else ::unsetenv(it->first.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

}  // namespace

// A process the rank itself starts inherits the variable but has another parent.
bool is_spawned_rank() {
  const int64_t by = env::get_int(kMarker);
  return by > 0 && by == static_cast<int64_t>(::getppid());
}

int spawn(int nprocs, const std::function<int(int rank)>& fn, const SpawnOptions& options) {
  if (nprocs < 1) PT_THROW(InputError, "spawn: nprocs must be at least 1 (got ", nprocs, ")");
  if (!fn) PT_THROW(InputError, "spawn: the rank function is empty");

  // ---- a child spawn() started: run the rank, end the process.
  if (is_spawned_rank()) {
    int code = 2;
    try {
      comm::JobEnv job = comm::read_job_env();
      check_world(job, nprocs, "this spawned process");
      code = run_rank(fn, job.rank);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
    }
    std::fflush(nullptr);
    std::cout.flush();
    std::cerr.flush();
    std::exit(code);
  }

  // ---- one rank of a job started from outside (paratrain launch, torchrun, mpirun, srun).
  comm::JobEnv job = comm::read_job_env();
  if (outside_rank(job)) {
    check_world(job, nprocs, "this process");
    claim_the_one_call();
    return run_rank(fn, job.rank);
  }

  // ---- the parent: launch nprocs copies of this program and supervise them.
  for (const std::string& kv : options.env) {
    const size_t eq = kv.find('=');
    if (eq == 0 || eq == std::string::npos)
      PT_THROW(InputError, "spawn: SpawnOptions::env entry '", kv, "' is not KEY=VALUE");
  }
  if (options.grace_period_s < 0)
    PT_THROW(InputError, "spawn: SpawnOptions::grace_period_s must be >= 0 (got ", options.grace_period_s, ")");
  claim_the_one_call();
  launch::LaunchOptions lo;
  lo.nproc_per_node = nprocs;
  lo.grace_period_s = options.grace_period_s;
  lo.log_dir = options.log_dir;
  lo.program.push_back(own_executable());
  for (std::string& a : own_arguments()) lo.program.push_back(std::move(a));

  std::fflush(nullptr);  // what the parent printed comes before its ranks' lines
  std::cout.flush();
  std::cerr.flush();
  EnvOverride vars;
  for (const std::string& kv : options.env) {
    const size_t eq = kv.find('=');
    vars.set(kv.substr(0, eq), kv.substr(eq + 1));
  }
  vars.set(kMarker, std::to_string(::getpid()));
  launch::Launcher launcher(std::move(lo));
  return launcher.run();
}

}  // namespace paratrain
