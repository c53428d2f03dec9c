// The environment each rank starts with: torchrun's variables plus paratrain's own
// (docs/launch.md has the table).
//
// build_child_env() starts from the launcher's environment, removes variables that would
// make a rank believe it runs under mpirun or Slurm (OMPI_COMM_WORLD_*, PMI_RANK/SIZE,
// SLURM_PROCID/NTASKS/LOCALID: RANK and friends are the truth under the launcher), and sets
// what torchrun sets: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT (left to
// the program: its rank 0 hosts a store there, e.g. PyTorch's TCPStore),
// TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,
// TORCHELASTIC_USE_AGENT_STORE=False, NCCL_ASYNC_ERROR_HANDLING and
// TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set), TORCHELASTIC_ERROR_FILE (with an error
// directory; removed otherwise), OMP_NUM_THREADS (omp_threads when > 0 and not already set);
// and paratrain's own: PARATRAIN_TOKEN, PARATRAIN_STORE_PORT (the port of the launcher's
// store on MASTER_ADDR, fresh for every attempt; paratrain ranks join it as clients),
// PARATRAIN_STORE_EXTERNAL=1 (no rank hosts a store), PARATRAIN_THREADS (kept when set).
//
// Thread-safety: a pure function of its arguments.
#pragma once

#include <string>
#include <vector>

namespace paratrain::launch {

// Who one rank is in the job.
struct RankAssignment {
  int rank = 0;              // global rank, 0..world_size-1
  int local_rank = 0;        // index on this node
  int world_size = 1;
  int local_world_size = 1;  // ranks on this node
  int group_rank = 0;        // node index (torchrun's GROUP_RANK)
  int group_world_size = 1;  // number of nodes
};

// What every rank of one attempt shares.
struct JobEnv {
  std::string master_addr;
  int master_port = 0;
  std::string token;
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;
  int store_port = 0;         // the launcher's store for paratrain ranks on master_addr (0: none)
  std::string error_dir;      // TORCHELASTIC_ERROR_FILE goes there (empty: not set)
  int omp_threads = 1;        // used when OMP_NUM_THREADS is not already set; 0: leave it unset
  int paratrain_threads = 1;  // used when PARATRAIN_THREADS is not already set
};

// DIR/rank_<rank>.error.json: where rank `rank` writes its error (TORCHELASTIC_ERROR_FILE).
std::string error_file_path(const std::string& dir, int rank);

// `base` is KEY=VALUE entries (the launcher's environ); returns the child's KEY=VALUE list.
std::vector<std::string> build_child_env(const std::vector<std::string>& base,
                                         const RankAssignment& who, const JobEnv& job);

// The current process's environment as KEY=VALUE entries.
std::vector<std::string> current_environment();

}  // namespace paratrain::launch
