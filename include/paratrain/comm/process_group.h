// ProcessGroup: collective communication among a fixed set of ranks, over raw buffers.
//
// A group has `size()` ranks numbered 0..size-1; this process is `rank()`. Every call is
// asynchronous and returns a Work (work.h); calls execute one at a time, in the order they
// were made, on the group's background thread, so every rank must make the same sequence of
// collective calls. Buffers are `count` elements of `dtype` (f32, bf16, f16, i32, i64);
// bf16/f16 are reduced in f32. Counts may be 0. Buffers must stay valid until the Work is
// completed.
//
// Backends: "shm" (processes on one host, POSIX shared memory), "tcp" (any hosts), "mpi"
// (an MPI library's own engine; ranks from mpirun), "auto" (mpi under mpirun unless told
// otherwise, else shm between ranks on one host and tcp across hosts). The algorithms
// (ring, rank-ordered deterministic, recursive doubling, chains, direct) are shared by
// shm and tcp; docs/algorithms.md lists them, docs/comm.md the env variables.
//
// Failures: a dead peer fails the pending and every later call within
// PARATRAIN_PEER_TIMEOUT_S (default 10 s) with a CommError naming the rank; each call has a
// deadline (PARATRAIN_COMM_TIMEOUT_S, default 300 s) after which it fails with a
// TimeoutError naming the operation, its sequence number, its size and the ranks not heard
// from. After any failure the group is unusable (later calls fail at once); create a new
// one. With PARATRAIN_DEBUG=detail, ranks compare (op, dtype, count, root) before each
// collective and a mismatch is a CommError on every rank naming both sides.
//
// Thread-safety: calls may be made from several threads, but their order defines the
// collective order, so a program should issue a group's collectives from one thread.
// Lifetime: destroying a group waits for queued work (up to its deadline) and releases
// shared memory and sockets; sub-groups are independent objects.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/comm/store.h"
#include "paratrain/comm/types.h"
#include "paratrain/comm/work.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm {

struct ProcessGroupOptions {
  std::string backend = "";             // auto|shm|tcp|mpi; "" = PARATRAIN_BACKEND
  bool deterministic = false;           // allreduce/reduce_scatter/reduce sum in rank order 0..N-1
  double timeout_s = 0;                 // per-call deadline; 0 = PARATRAIN_COMM_TIMEOUT_S
  double peer_timeout_s = 0;            // dead-peer detection; 0 = PARATRAIN_PEER_TIMEOUT_S
  size_t segment_bytes = 0;             // pipelining segment; 0 = PARATRAIN_SEGMENT_BYTES or automatic
  size_t shm_staging_bytes = 0;         // per peer and direction; 0 = PARATRAIN_SHM_STAGING_BYTES
  int tcp_streams = 0;                  // 0 = PARATRAIN_TCP_STREAMS
  std::optional<bool> debug_fingerprint;  // unset = PARATRAIN_DEBUG=detail
  size_t small_message_bytes = 0;       // recursive-doubling threshold; 0 = automatic (64 KiB)
};

// Where this process sits in its job, as found in the environment.
struct JobEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 = not set
  std::string token;
  bool under_mpi = false;  // OMPI_COMM_WORLD_* or PMI_* present
  std::string source;      // "torchrun", "openmpi", "pmi", "slurm", "default"
};

// Reads RANK/WORLD_SIZE/... then OMPI_COMM_WORLD_*, PMI_*, SLURM_*; InputError if malformed.
JobEnv read_job_env();

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // buf[count] on every rank becomes the reduction over ranks, in place.
  virtual WorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op = ReduceOp::kSum) = 0;
  // in[size*count] on every rank; out[count] gets block rank() of the reduction.
  virtual WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype,
                                 ReduceOp op = ReduceOp::kSum) = 0;
  // in[count] from every rank; out[size*count] holds rank r's input at block r.
  virtual WorkPtr allgather(const void* in, void* out, size_t count, DType dtype) = 0;
  // buf[count] of root is copied to every rank.
  virtual WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) = 0;
  // buf[count] of root becomes the reduction; other ranks' buffers are left unchanged.
  virtual WorkPtr reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) = 0;
  // in[size*count]: block p goes to rank p; out[size*count]: block p came from rank p.
  virtual WorkPtr all_to_all(const void* in, void* out, size_t count, DType dtype) = 0;
  // Point-to-point, ordered with the collectives of this group. The receiver must post the
  // matching recv (same count, dtype, tag); a message larger than the staging area
  // completes only when it is being received.
  virtual WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag = 0) = 0;
  virtual WorkPtr barrier() = 0;

  // A group of some of this group's ranks (their ranks in this group, ascending, unique).
  // Collective over this group: every rank calls it with the same list, in the same order
  // relative to other new_group calls. Returns nullptr on ranks not in the list.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

  const ProcessGroupOptions& options() const { return options_; }

 protected:
  int rank_ = 0;
  int size_ = 1;
  ProcessGroupOptions options_;
};

// A group over `store` (every rank passes a store of the same key space) with the given
// rank and size. Backend "mpi" ignores the store and uses MPI_COMM_WORLD's ranks.
std::shared_ptr<ProcessGroup> create_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                   const ProcessGroupOptions& options = {});

// A group from the environment (read_job_env()): under mpirun with backend auto|mpi it uses
// MPI; with PARATRAIN_STORE_PORT set (by `paratrain launch`, which hosts the store there)
// every rank joins MASTER_ADDR:PARATRAIN_STORE_PORT and none hosts one; otherwise rank 0
// hosts a TcpStoreServer on MASTER_ADDR:MASTER_PORT unless PARATRAIN_STORE_EXTERNAL=1 (an
// external store is there), and all ranks join it with PARATRAIN_TOKEN. The returned group
// keeps the store (and server) alive.
std::shared_ptr<ProcessGroup> create_process_group_from_env(const ProcessGroupOptions& options = {});

}  // namespace paratrain::comm
