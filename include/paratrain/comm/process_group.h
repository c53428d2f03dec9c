// ProcessGroup: collective communication among a fixed set of ranks, over raw buffers.
//
// A group has `size()` ranks numbered 0..size-1; this process is `rank()`. Every call is
// asynchronous and returns a Work (work.h); collectives execute one at a time, in the order
// they were made, on the group's background thread, so every rank must make the same
// sequence of collective calls (send/recv: see below). Buffers are `count` elements of
// `dtype` (f32, bf16, f16, i32, i64); bf16/f16 are reduced in f32. Counts may be 0. Buffers
// must stay valid until the Work is completed.
//
// Backends: "shm" (processes on one host, POSIX shared memory), "tcp" (any hosts), "mpi"
// (an MPI library's own engine; ranks from mpirun), "auto" (mpi under mpirun unless told
// otherwise, else shm between ranks on one host and tcp across hosts), "nccl" (CUDA builds:
// NCCL on device buffers; its send/recv and stream rules: docs/comm.md). The algorithms
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
// Point-to-point (send/recv), on every backend:
//  - Non-blocking: the call returns a Work at once. The operation starts once every earlier
//    collective of this group has completed and every earlier send/recv has started (so a
//    send carries what a collective before it wrote, with no wait in between), and then
//    progresses in the background: later calls (sends, recvs, collectives) do not wait for
//    it. So a program waits for a recv's Work before a later call uses its buffer.
//  - Completion: any set of posted sends and recvs, between any ranks and of any size,
//    completes as long as every send's matching recv is posted eventually, in whatever
//    order the two sides post them (both send first, then receive, is fine). A send
//    completes once its data has left the buffer (shm/tcp: up to 64 KiB as soon as it is
//    sent, a larger one once the receiver posted the matching recv and the data went out;
//    mpi: as the MPI library does it); a recv when its data is in the buffer.
//  - Matching: a send to `dst` with tag t matches a recv on `dst` from this rank with tag t.
//    Per (source, destination, tag) messages match in posting order: the k-th send from a
//    to b with tag t meets the k-th recv on b from a with tag t (FIFO). Different tags
//    match independently: a recv on tag 2 completes while an earlier message on tag 1 waits
//    for its recv. The two must agree on dtype and count; shm/tcp: else the recv fails with
//    a CommError naming both sides, and so does the send of a message over 64 KiB (it is
//    told, or at the latest fails at its deadline; a smaller one had completed already);
//    mpi: the MPI library's error (a truncation).
//  - Deadline: each send/recv must complete within the call deadline from its start, else
//    it fails with a TimeoutError naming the rank, the op, its sequence number, dtype,
//    count, bytes, the peer, the tag and what it waited for (e.g. "rank 1: recv #4 (f32 x
//    10, 40 bytes, from rank 0, tag 6) passed its deadline of 300 s ...: rank 0 sent no
//    message with this tag"). A failure of one fails the others pending in the group.
//  - shm/tcp run them on pairs of their own (no collective's data is ever behind them) with
//    one progress thread per group; mpi uses MPI_Isend/MPI_Irecv (MPI's own matching, the
//    same rules), completed by a poller thread.
//
// Thread-safety: calls may be made from several threads, but their order defines the
// collective order (and the matching order of sends and recvs on one tag), so a program
// should issue a group's calls from one thread.
// Lifetime: destroying a group waits for queued work and pending sends/recvs (each up to
// its deadline) and releases
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
  std::string backend = "";             // auto|shm|tcp|mpi|nccl; "" = PARATRAIN_BACKEND
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

// How a backend pairs a peer's sends with recvs.
enum class P2pMatching {
  ByTag,           // per (peer, tag), FIFO; sends progress in the background (shm, tcp, mpi)
  InPostingOrder,  // per peer in posting order, tags only recorded; a send/recv starts only
                   // once the program waits for it, in batches (nccl: nccl_process_group.h)
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;
  // How send/recv match (P2pMatching): code that posts messages out of order asks.
  virtual P2pMatching p2p_matching() const { return P2pMatching::ByTag; }

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
  // Point-to-point, non-blocking (see the top of this file): starts after the collectives
  // before it, never holds back the calls after it; matched per (peer, tag) in FIFO order with the
  // peer's recv / send of the same count and dtype. Never blocks on the peer, whatever the
  // size: both ranks may send first and receive afterwards. tag: any int.
  virtual WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag = 0) = 0;
  virtual WorkPtr barrier() = 0;

  // A group of some of this group's ranks (their ranks in this group, ascending, unique).
  // Collective over this group: every rank calls it with the same list, in the same order
  // relative to other new_group calls. Returns nullptr on ranks not in the list.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;

  const ProcessGroupOptions& options() const { return options_; }
  // This group's id in FlightRecorder::instance() (-1: not recorded), e.g. for its traffic().
  int record_group() const { return record_group_; }

 protected:
  int rank_ = 0;
  int size_ = 1;
  ProcessGroupOptions options_;
  int record_group_ = -1;
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
