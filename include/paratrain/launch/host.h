// What the launcher learns about the host it runs on: usable cores, core groups, GPUs,
// and the program it is asked to run (docs/launch.md).
//
// usable_cpu_count() honours the process's CPU affinity and a cgroup v2 cpu.max quota.
// A "core group" is the set of usable cores sharing one last-level cache (L3), falling
// back to NUMA nodes, falling back to all cores as one group; `--nproc-per-node auto`
// starts one rank per GPU when there are GPUs, else one rank per core group.
//
// Thread-safety: plain functions; they read /proc and /sys and may be called from any thread.
#pragma once

#include <string>
#include <vector>

namespace paratrain::launch {

// Cores this process may run on (affinity, cgroup quota), at least 1.
int usable_cpu_count();

// Usable cores grouped by shared last-level cache (or NUMA node); never empty.
std::vector<std::vector<int>> core_groups();

// NVIDIA GPUs visible here: entries of /proc/driver/nvidia/gpus (or /dev/nvidiaN),
// limited by CUDA_VISIBLE_DEVICES when it is set. 0 when there is no driver.
int gpu_count();

struct NprocChoice {
  int nproc = 1;
  std::string reason;  // e.g. "2 GPUs" or "1 core group of 16 cores (shared L3)"
};
// The meaning of `--nproc-per-node auto` on this host.
NprocChoice auto_nproc_per_node();

// Compute threads for each of `local_ranks` ranks sharing `cpus` cores: cpus/local_ranks, >= 1.
int threads_per_rank(int cpus, int local_ranks);

// A fresh job secret: 32 random bytes from /dev/urandom as 64 lowercase hex digits.
std::string make_token();

// The path to exec for `program`: a name with a '/' must be an executable regular file;
// a bare name is searched in PATH. InputError naming the program otherwise.
std::string resolve_program(const std::string& program);

// This host's name (gethostname), "localhost" if that fails.
std::string host_name();

}  // namespace paratrain::launch
