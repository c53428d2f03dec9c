// The nccl backend: ProcessGroup calls mapped onto NCCL's own collectives, on GPU buffers.
// Compiled only in a CUDA build (cmake/cuda.cmake); create groups through
// create_process_group*() with backend "nccl".
//
// Buffers: device pointers on the group's device, which is the creating thread's current
// device (paratrain::cuda::current_device(), e.g. cuda:LOCAL_RANK) at construction; every
// call and sub-group uses that device, whatever the calling thread's current device.
// Collectives also take host buffers (pageable or pinned), for the small once-per-step
// figures a training loop agrees on (flags, losses, memory): they are staged through device
// memory and the call blocks until the result is back in the host buffer (the returned Work
// is complete; a failure throws from the call). Send/recv of host buffers is an InputError.
//
// Bootstrap: rank 0 calls ncclGetUniqueId and sets the id (hex) in the store under
// "nccl/<n>/id", n = how many nccl groups this rank created over this store (add() on
// "nccl/created/<rank>", so the n-th world group of every rank meets the same key); the
// others get() it (the store's deadline). The communicator is non-blocking (config.blocking
// = 0): ncclCommInitRankConfig and every later NCCL call return at once and the group polls
// ncclCommGetAsyncError until it leaves ncclInProgress, so each can be aborted at its deadline
// (options timeout_s = PARATRAIN_COMM_TIMEOUT_S). Init past the deadline: TimeoutError naming
// the rank and the ranks expected; rank 0 deletes the key once init completed.
//
// Every call: an event recorded on the compute stream (paratrain::cuda::compute_stream()) makes
// the comm stream (cuda::comm_stream()) wait for the work queued before the call (no host
// wait), the NCCL call is enqueued on the comm stream, then a completion event is recorded
// after it; the call returns an NcclWork. dtypes f32/bf16/f16/i32/i64 map to ncclFloat32/
// ncclBfloat16/ncclFloat16/ncclInt32/ncclInt64; ReduceOp sum/avg/max/min to ncclSum/ncclAvg/
// ncclMax/ncclMin. Differences from shm/tcp: NCCL rounds bf16/f16 partial results to the half
// type at every step (shm/tcp add in f32 and round once); avg is NCCL's ncclAvg;
// PARATRAIN_DEBUG=detail fingerprints are not compared.
//
// Rank-ordered mode (options.deterministic, groups of two or more ranks): allreduce,
// reduce_scatter and reduce give every element the in-order result x_0 op x_1 op ... op
// x_(n-1), in shm/tcp's accumulator (f32 for f32/bf16/f16) rounded once, so the same bits
// as the shm/tcp rank-ordered algorithm (docs/algorithms.md) and the same on every run and
// for every placement of the ranks. Each is the plan of comm/algorithms/rank_ordered_plan.h,
// enqueued on the comm stream as NCCL's own grouped sends/recvs and one kernel
// (rank_ordered.h), with no host wait:
//  - allreduce: chunk c of the buffer (n balanced chunks, as shm/tcp) is owned by rank c;
//    every rank sends chunk c to its owner (one ncclGroupStart/End), the owner combines the
//    n contributions in rank order into its chunk, then every owner sends its chunk to every
//    rank (a second group). Each rank sends and receives 2(n-1)/n of the buffer, as a ring.
//  - reduce_scatter: block c goes to rank c, which combines the n blocks in rank order.
//  - reduce: every rank sends its buffer to the root, which combines them in rank order
//    (shm/tcp's chain rounds a bf16/f16 partial sum at every hop; here it is rounded once).
// The contributions are received into scratch memory from the device's caching allocator
// (about the buffer's size; marked as used by the comm stream). allgather, broadcast,
// all_to_all and send/recv move data unchanged and are NCCL's in either mode.
//
// Completion: Work::wait() blocks the host until the completion event has passed (the waiting
// thread polls it for 1 ms, then the watchdog's poll, every ~50 us, completes the Work); the
// data is then in the buffers for any stream and the host.
// NcclWork::stream_wait() instead makes a stream (default: the compute stream of the group's
// device) wait for it on the GPU, without blocking the host. A watchdog thread per group
// polls the pending completion events and ncclCommGetAsyncError: a completed call finishes
// its Work (and its flight record); a call past its deadline aborts the communicator
// (ncclCommAbort) and fails with a TimeoutError naming the rank, op, sequence number, dtype,
// count and bytes; an asynchronous NCCL error aborts it and fails with a CommError quoting
// ncclGetErrorString and ncclGetLastError. Either way every pending Work fails, and so does
// every later call (the group is unusable; create a new one).
//
// Flight recorder: record() at the call, started() once NCCL accepted the call (enqueued on
// the comm stream), finished() on completion or failure; group backend "nccl".
//
// Send/recv (NCCL has neither tags nor background progress of its own):
//  - A send/recv is not enqueued at its call: consecutive sends and recvs collect in a batch,
//    enqueued as one ncclGroupStart/ncclSend|ncclRecv.../ncclGroupEnd (so a batch never
//    deadlocks on itself: both ranks may send first and receive afterwards, and a rank may
//    send to itself) when the program waits for one of them (wait(), stream_wait()), makes a
//    collective call or new_group() on this group, calls flush(), or destroys the group.
//    Polling is_completed() does not enqueue it; one left unenqueued past its deadline fails
//    with a TimeoutError saying so. Every Work of a batch completes when the whole batch did.
//  - Tags: messages to/from one peer match in posting order, whatever their tags (the tag is
//    only recorded): both sides must post a peer's sends and recvs in the same order.
//  - A batch runs on the comm stream in call order: a collective after it waits for it, and
//    it waits for the batches before it. So a send must meet a recv the peer enqueues before
//    anything that waits for this rank's later calls (shm/tcp progress p2p in the background
//    and have no such limit).
//
// Streams: the comm stream is per device (shared by every group on the device), so calls of
// all of a device's groups run in the order they were made.
// Thread-safety: calls may come from several threads (serialised in call order; a program
// should issue a group's calls from one thread). Lifetime: the destructor enqueues the batch,
// waits for pending work (each up to its deadline), then ncclCommFinalize + ncclCommDestroy
// (ncclCommAbort after a failure or when finalising passes the deadline).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/algorithms/rank_ordered_plan.h"
#include "comm/deadline.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::comm::nccl {

class NcclProcessGroup;

// The Work of an nccl call: Work plus its completion event on the comm stream.
class NcclWork : public Work {
 public:
  NcclWork(std::function<std::string()> describe, int device, Deadline deadline)
      : Work(std::move(describe)), device_(device), deadline_(deadline) {}
  ~NcclWork() override;
  // Makes later work on `stream` (nullptr: the compute stream of the group's device) wait for
  // this call on the GPU; the host does not wait. Enqueues the call first if it is a send/recv
  // still in its batch. Throws the call's failure if it already failed; a later failure
  // aborts the communicator (its kernels end, so the stream goes on, with unusable data):
  // it shows at wait() or error().
  void stream_wait(cuda::Stream stream = nullptr);
  // Work::wait_on_device: stream_wait() on the compute stream (the watchdog keeps the deadline).
  void wait_on_device(std::chrono::milliseconds) override { stream_wait(); }
  // The group's device (the buffers').
  int device() const { return device_; }
  // True once the NCCL call was enqueued on the comm stream (its event recorded).
  bool enqueued() const { return enqueued_.load(std::memory_order_acquire); }

 private:
  friend class NcclProcessGroup;
  // Finishes the Work once (the watchdog, a waiter and a failure may race to it).
  void complete(std::exception_ptr error = nullptr) {
    if (!completed_.exchange(true)) finish(error);
  }
  int device_;
  Deadline deadline_;
  cudaEvent_t done_ = nullptr;  // written before enqueued_ is set
  std::atomic<bool> enqueued_{false};
  std::atomic<bool> completed_{false};
  std::function<void()> flush_;  // enqueues the group's batch (set by the group)
};

class NcclProcessGroup : public ProcessGroup {
 public:
  // The world group of `size` ranks meeting over `store`; on this thread's current device.
  // InputError without a GPU or for a bad rank.
  NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options);
  ~NcclProcessGroup() override;
  std::string backend_name() const override { return "nccl"; }
  P2pMatching p2p_matching() const override { return P2pMatching::InPostingOrder; }

  WorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr allgather(const void* in, void* out, size_t count, DType dtype) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override;
  WorkPtr reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) override;
  WorkPtr all_to_all(const void* in, void* out, size_t count, DType dtype) override;
  // Batched (see the top of this file); dst/src may be this rank.
  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag) override;
  WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag) override;
  WorkPtr barrier() override;
  // ncclCommSplit of this communicator (collective over this group, ordered with its calls).
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;

  // Enqueues the batched sends/recvs now.
  void flush();
  int device() const { return device_; }
  // Keeps an object (e.g. the store and its server) alive as long as the group.
  void hold(std::shared_ptr<void> keep) { held_.push_back(std::move(keep)); }

  // A sub-group over a communicator made by ncclCommSplit (use new_group()).
  NcclProcessGroup(ncclComm_t comm, int device, const ProcessGroupOptions& options, std::vector<int> global_ranks,
                   std::string name);

 private:
  struct Call {
    OpType op;
    DType dtype;
    size_t count;
    int peer;  // root, destination or source; -1 none
    ReduceOp reduce_op;
    int tag;
  };
  struct P2p {
    std::shared_ptr<NcclWork> work;
    Call call;
    void* buf;
  };
  // One NCCL call (or group of calls), or a kernel, enqueued on the comm stream.
  using Launch = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;
  void start(std::vector<int> global_ranks, std::string name);  // after comm_ exists
  static std::string describe(const Call& call, uint64_t seq);
  std::shared_ptr<NcclWork> make_work(const Call& call);       // mu_ held
  // Adds `w` to pending_; false (and `w` failed) when the group is broken.
  bool admit(const std::shared_ptr<NcclWork>& w);
  // One call made of `stages`, enqueued one after another (each settled before the next).
  WorkPtr collective(const Call& call, std::vector<Launch> stages);
  WorkPtr collective(const Call& call, Launch launch) { return collective(call, std::vector<Launch>{std::move(launch)}); }
  // A rank-ordered collective (the top of this file): `plan`'s steps
  // (comm/algorithms/rank_ordered_plan.h) over device buffers `in` and `out`; size_ > 1.
  WorkPtr rank_ordered(const Call& call, const algorithms::RankOrderedPlan& plan, const void* in, void* out);
  // Device memory for `bytes` of received contributions, reusable once the comm stream is past them.
  Tensor contribution_slots(size_t bytes);
  WorkPtr point_to_point(const Call& call, void* buf);
  // A collective on host buffers: `call` runs on device copies (`in` copied up first, `out`
  // copied back after it completed); blocks until then.
  WorkPtr staged(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                 const std::function<WorkPtr(const void*, void*)>& call);
  void flush_locked();  // mu_ held
  // Enqueues `stages` for `works` (already pending) on the comm stream; mu_ held.
  void enqueue_locked(const std::vector<std::shared_ptr<NcclWork>>& works, const std::vector<Launch>& stages);
  // Polls the communicator while `r` is ncclInProgress; returns the final state, or
  // ncclInProgress if the group broke meanwhile.
  ncclResult_t settle(ncclResult_t r);
  void help_wait(NcclWork* w);
  void watchdog();
  // Marks the group broken, aborts the communicator and fails every pending Work (`culprit`
  // with `why` as a TimeoutError if `timeout`, the others with a CommError quoting it).
  void fail_all(const std::string& why, const NcclWork* culprit, bool timeout);
  std::string nccl_error(ncclResult_t r);  // comm_mu_ not held
  void check_rank(int r, const char* what) const;

  int device_ = 0;
  FlightRecorder* recorder_;
  std::vector<int> global_ranks_;
  std::string name_;
  std::vector<std::shared_ptr<void>> held_;

  std::mutex mu_;  // the call order: every enqueue, the batch, new_group
  uint64_t seq_ = 0;
  int next_group_id_ = 0;
  std::vector<P2p> batch_;
  cudaEvent_t ready_ = nullptr;  // re-recorded on the compute stream by every enqueue
  void* barrier_buf_ = nullptr;  // one int32 on the device

  std::mutex comm_mu_;  // held around every NCCL call on comm_ (short: non-blocking communicator)
  ncclComm_t comm_ = nullptr;  // nullptr once aborted or destroyed

  std::mutex pending_mu_;
  std::condition_variable pending_cv_;  // pending_ changed, or stop_
  std::vector<std::shared_ptr<NcclWork>> pending_;  // called, not completed (enqueued or batched)
  bool stop_ = false;
  std::atomic<bool> broken_{false};
  std::string broken_why_;  // pending_mu_
  std::thread watchdog_;
};

// create_process_group(store, rank, size, {backend "nccl"}): InputError "backend nccl: no CUDA
// GPU: <why>" where there is none. `keep`: objects the group holds (store, server).
std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options,
                                                        std::vector<std::shared_ptr<void>> keep = {});

}  // namespace paratrain::comm::nccl
