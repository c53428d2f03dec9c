#include "paratrain/launch/child_env.h"

#include <unistd.h>

#include <map>

extern char** environ;

namespace paratrain::launch {
namespace {

// Variables that would make a rank think it runs under mpirun or Slurm.
const char* const kRemoved[] = {
    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
    "SLURM_LOCALID"};

}  // namespace

std::string error_file_path(const std::string& dir, int rank) {
  return dir + "/rank_" + std::to_string(rank) + ".error.json";
}

std::vector<std::string> current_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) out.emplace_back(*e);
  return out;
}

std::vector<std::string> build_child_env(const std::vector<std::string>& base,
                                         const RankAssignment& who, const JobEnv& job) {
  std::vector<std::string> order;
  std::map<std::string, std::string> vars;
  for (const std::string& kv : base) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    std::string k = kv.substr(0, eq);
    if (!vars.count(k)) order.push_back(k);
    vars[k] = kv.substr(eq + 1);
  }
  for (const char* r : kRemoved) vars.erase(r);
  auto set = [&](const std::string& k, const std::string& v) {
    if (!vars.count(k)) order.push_back(k);
    vars[k] = v;
  };
  auto set_if_unset = [&](const std::string& k, const std::string& v) {
    auto it = vars.find(k);
    if (it == vars.end() || it->second.empty()) set(k, v);
  };
  set("RANK", std::to_string(who.rank));
  set("LOCAL_RANK", std::to_string(who.local_rank));
  set("WORLD_SIZE", std::to_string(who.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(who.local_world_size));
  set("GROUP_RANK", std::to_string(who.group_rank));
  set("GROUP_WORLD_SIZE", std::to_string(who.group_world_size));
  set("ROLE_RANK", std::to_string(who.rank));
  set("ROLE_WORLD_SIZE", std::to_string(who.world_size));
  set("ROLE_NAME", "default");
  set("MASTER_ADDR", job.master_addr);
  set("MASTER_PORT", std::to_string(job.master_port));  // the program's (PyTorch's rank 0 TCPStore)
  set("PARATRAIN_TOKEN", job.token);
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(job.restart_count));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(job.max_restarts));
  set("TORCHELASTIC_RUN_ID", job.run_id);
  // The launcher hosts no store on MASTER_PORT: rank 0 of a PyTorch program hosts its own
  // TCPStore there (as under torchrun's c10d rendezvous, which sets False as well).
  set("TORCHELASTIC_USE_AGENT_STORE", "False");
  // torch 1.x and 2.x spell it differently; torchrun keeps the caller's value, else 1.
  set_if_unset("NCCL_ASYNC_ERROR_HANDLING", "1");
  set_if_unset("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  if (!job.error_dir.empty())
    set("TORCHELASTIC_ERROR_FILE", error_file_path(job.error_dir, who.rank));
  else
    vars.erase("TORCHELASTIC_ERROR_FILE");  // the launcher's own (its parent's) is not the rank's
  // paratrain's ranks join the launcher's store on its own port, as clients.
  if (job.store_port > 0) set("PARATRAIN_STORE_PORT", std::to_string(job.store_port));
  else vars.erase("PARATRAIN_STORE_PORT");
  set("PARATRAIN_STORE_EXTERNAL", "1");  // comm: no rank hosts a store
  if (job.omp_threads > 0) set_if_unset("OMP_NUM_THREADS", std::to_string(job.omp_threads));
  set_if_unset("PARATRAIN_THREADS", std::to_string(job.paratrain_threads));
  std::vector<std::string> out;
  out.reserve(order.size());
  for (const std::string& k : order) {
    auto it = vars.find(k);
    if (it != vars.end()) out.push_back(k + "=" + it->second);
  }
  return out;
}

}  // namespace paratrain::launch
