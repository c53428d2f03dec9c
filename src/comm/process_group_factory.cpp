// Group construction: the environment contract (DESIGN.md) and the backend choice.
#include "comm/device_staging.h"
#include "comm/transport_process_group.h"
#include "paratrain/base/env.h"
#include "paratrain/base/log.h"
#include "paratrain/tensor/cuda.h"
#if PARATRAIN_HAVE_MPI
#include "comm/backends/mpi/mpi_process_group.h"
#endif
#if PARATRAIN_HAVE_CUDA
#include "comm/backends/nccl/nccl_process_group.h"
#endif

namespace paratrain::comm {

JobEnv read_job_env() {
  JobEnv e;
  auto first = [](std::initializer_list<const char*> names) -> std::optional<int64_t> {
    for (const char* n : names)
      if (auto v = env::raw_int(n)) return v;
    return std::nullopt;
  };
  e.under_mpi = env::raw("OMPI_COMM_WORLD_RANK").has_value() || env::raw("PMI_RANK").has_value();
  if (env::raw("RANK")) e.source = "torchrun";
  else if (env::raw("OMPI_COMM_WORLD_RANK")) e.source = "openmpi";
  else if (env::raw("PMI_RANK")) e.source = "pmi";
  else if (env::raw("SLURM_PROCID")) e.source = "slurm";
  else e.source = "default";
  e.rank = static_cast<int>(first({"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}).value_or(0));
  e.world_size = static_cast<int>(first({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}).value_or(1));
  e.local_rank = static_cast<int>(
      first({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}).value_or(e.rank));
  e.local_world_size = static_cast<int>(
      first({"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}).value_or(e.world_size));
  if (auto a = env::raw("MASTER_ADDR")) e.master_addr = *a;
  e.master_port = static_cast<int>(env::raw_int("MASTER_PORT").value_or(0));
  e.token = env::get_string("PARATRAIN_TOKEN");
  if (e.world_size < 1) PT_THROW(InputError, "WORLD_SIZE=", e.world_size, " must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    PT_THROW(InputError, "RANK=", e.rank, " is outside WORLD_SIZE=", e.world_size);
  return e;
}

namespace {
// Backend "nccl" in a build without CUDA: the InputError saying so.
void require_nccl_build(const ProcessGroupOptions& o) {
#if !PARATRAIN_HAVE_CUDA
  if (o.backend == "nccl") PT_THROW(InputError, "backend nccl: paratrain was built without CUDA");
#else
  (void)o;
#endif
}

// A host backend's group (shm, tcp, mpi), taking GPU buffers too in a build with CUDA:
// staged through host memory (device_staging.h).
std::shared_ptr<ProcessGroup> on_host(std::shared_ptr<ProcessGroup> pg) {
  return cuda::built() ? stage_device_buffers(std::move(pg)) : pg;
}

// The group of `size` ranks over `store` (prefixed "pg"), nccl or shm/tcp, holding `keep`.
std::shared_ptr<ProcessGroup> group_over(std::shared_ptr<Store> store, int rank, int size,
                                         const ProcessGroupOptions& o, std::vector<std::shared_ptr<void>> keep) {
  auto pg_store = std::make_shared<PrefixStore>("pg", std::move(store));
#if PARATRAIN_HAVE_CUDA
  if (o.backend == "nccl") return nccl::create_nccl_process_group(pg_store, rank, size, o, std::move(keep));
#endif
  auto pg = std::make_shared<TransportProcessGroup>(pg_store, rank, size, o);
  for (auto& k : keep) pg->hold(std::move(k));
  return on_host(std::move(pg));
}
}  // namespace

std::shared_ptr<ProcessGroup> create_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                   const ProcessGroupOptions& options) {
  ProcessGroupOptions o = resolve_options(options);
  require_nccl_build(o);
  bool use_mpi = o.backend == "mpi";
  if (o.backend == "auto" && read_job_env().under_mpi && !store) use_mpi = true;
  if (use_mpi) {
#if PARATRAIN_HAVE_MPI
    return on_host(mpi::create_mpi_process_group(o));
#else
    PT_THROW(InputError, "backend mpi: paratrain was built without MPI");
#endif
  }
  if (!store) PT_THROW(InputError, "create_process_group: backend ", o.backend, " needs a store");
  return group_over(std::move(store), rank, size, o, {});
}

std::shared_ptr<ProcessGroup> create_process_group_from_env(const ProcessGroupOptions& options) {
  ProcessGroupOptions o = resolve_options(options);
  require_nccl_build(o);
  JobEnv e = read_job_env();
  bool torchrun_vars = env::raw("MASTER_PORT").has_value();
  if (o.backend == "mpi" || (o.backend == "auto" && e.under_mpi && !torchrun_vars)) {
#if PARATRAIN_HAVE_MPI
    return on_host(mpi::create_mpi_process_group(o));
#else
    PT_THROW(InputError, "backend mpi: paratrain was built without MPI");
#endif
  }
  if (e.world_size == 1 && e.master_port == 0) {
    return group_over(std::make_shared<HashStore>(), 0, 1, o, {});
  }
  // Under `paratrain launch` the launcher hosts the store on its own port (PARATRAIN_STORE_PORT,
  // on MASTER_ADDR), leaving MASTER_PORT to the program; elsewhere (mpirun, srun, torchrun,
  // by hand) it is on MASTER_PORT, hosted by rank 0 unless PARATRAIN_STORE_EXTERNAL=1.
  const int64_t launcher_store_port = env::get_int("PARATRAIN_STORE_PORT");
  if (launcher_store_port < 0 || launcher_store_port > 65535)
    PT_THROW(InputError, "PARATRAIN_STORE_PORT=", launcher_store_port, " is not a TCP port (1..65535)");
  if (e.master_port == 0 && launcher_store_port == 0)
    PT_THROW(InputError, "MASTER_PORT is not set (needed with WORLD_SIZE=", e.world_size,
             "; or start the ranks with `paratrain launch` or mpirun)");
  const int store_port = launcher_store_port > 0 ? static_cast<int>(launcher_store_port) : e.master_port;
  std::shared_ptr<TcpStoreServer> server;
  if (e.rank == 0 && launcher_store_port == 0 && !env::get_bool("PARATRAIN_STORE_EXTERNAL")) {
    server = std::make_shared<TcpStoreServer>("", store_port, e.token);
    PT_LOG_DEBUG(kComm, "hosting the job's store on port ", server->port());
  }
  auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  PT_LOG_DEBUG(kComm, "connecting to the store at ", e.master_addr, ":", store_port,
               launcher_store_port > 0 ? " (hosted by the launcher)" : "", ", deadline ", o.timeout_s, " s");
  auto store = std::make_shared<TcpStore>(e.master_addr, store_port, e.token, timeout, timeout);
  PT_LOG_DEBUG(kComm, "store connected; rendezvous of ", e.world_size, " ranks (backend ", o.backend, ")");
  std::vector<std::shared_ptr<void>> keep = {store};
  if (server) keep.push_back(server);
  return group_over(store, e.rank, e.world_size, o, std::move(keep));
}

}  // namespace paratrain::comm
