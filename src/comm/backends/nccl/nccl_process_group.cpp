#include "comm/backends/nccl/nccl_process_group.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

#include "comm/backends/nccl/rank_ordered.h"
#include "comm/transport_process_group.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "paratrain/tensor/cuda_allocator.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"
#include "paratrain/tensor/cuda_device_guard.h"

namespace paratrain::comm::nccl {
namespace {

using cuda::DeviceGuard;

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    default: PT_THROW(InputError, "nccl backend: dtype ", dtype_name(d), " is not supported (f32, bf16, f16, i32, i64)");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kAvg: return ncclAvg;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  PT_THROW(InputError, "nccl backend: unknown reduce op ", int(op));
}

// True for memory a kernel on a GPU may touch (device or managed); host memory, pinned or
// not, is false. A null pointer (an empty buffer) needs no staging.
bool device_memory(const void* p) {
  if (p == nullptr) return true;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unregistered host pointer on older runtimes
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

std::string to_hex(const ncclUniqueId& id) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (char c : id.internal) {
    const auto b = static_cast<unsigned char>(c);
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

ncclUniqueId from_hex(const std::string& s, const std::string& key) {
  ncclUniqueId id;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() != 2 * sizeof(id.internal))
    PT_THROW(CommError, "store key ", key, " holds ", s.size(), " characters, not an NCCL unique id (",
             2 * sizeof(id.internal), " hex digits): another program uses this store's keys?");
  for (size_t i = 0; i < sizeof(id.internal); ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) PT_THROW(CommError, "store key ", key, " does not hold an NCCL unique id (hex digits)");
    id.internal[i] = static_cast<char>(hi * 16 + lo);
  }
  return id;
}

ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

std::string error_text(ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string s = ncclGetErrorString(r);
  if (last && *last) s += detail::concat(" (", last, ")");
  return s;
}

}  // namespace

NcclWork::~NcclWork() {
  if (done_) cudaEventDestroy(done_);  // also fine while pending: released once it completes
}

void NcclWork::stream_wait(cuda::Stream stream) {
  if (!enqueued() && !is_completed() && flush_) flush_();
  if (std::exception_ptr e = error()) std::rethrow_exception(e);
  if (!enqueued())
    PT_THROW(CommError, description(), ": not enqueued on the comm stream after flush (the group is broken?)");
  cudaStream_t s = static_cast<cudaStream_t>(stream ? stream : cuda::compute_stream(device_));
  PT_CUDA_CHECK(cudaStreamWaitEvent(s, done_, 0));
}

NcclProcessGroup::NcclProcessGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)
    : recorder_(&FlightRecorder::instance()) {
  if (size < 1 || rank < 0 || rank >= size) PT_THROW(InputError, "bad rank ", rank, " for a group of size ", size);
  if (!store) PT_THROW(InputError, "backend nccl needs a store");
  if (cuda::device_count() == 0) PT_THROW(InputError, "backend nccl: no CUDA GPU: ", cuda::unavailable_reason());
  rank_ = rank;
  size_ = size;
  options_ = resolve_options(options);
  device_ = cuda::current_device();
  // The n-th nccl group this rank makes over this store meets the n-th of every other rank.
  const int64_t n = store->add("nccl/created/" + std::to_string(rank), 1);
  const std::string key = "nccl/" + std::to_string(n) + "/id";
  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) PT_THROW(CommError, "rank 0: ncclGetUniqueId failed: ", error_text(r, nullptr));
    store->set(key, to_hex(id));
  } else {
    id = from_hex(store->get(key), key);
  }
  DeviceGuard guard(device_);
  ncclConfig_t config = nonblocking_config();
  const Deadline deadline = Deadline::after_seconds(options_.timeout_s);
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  while (r == ncclInProgress && comm) {
    if (deadline.expired()) {
      ncclCommAbort(comm);
      PT_THROW(TimeoutError, "rank ", rank, ": NCCL communicator init (", size, " ranks, cuda:", device_,
               ") passed its deadline of ", options_.timeout_s,
               " s (PARATRAIN_COMM_TIMEOUT_S): not every rank of the group joined");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    ncclResult_t s = ncclCommGetAsyncError(comm, &r);
    if (s != ncclSuccess) r = s;
  }
  if (r != ncclSuccess) {
    std::string why = error_text(r, comm);
    if (comm) ncclCommAbort(comm);
    // NCCL takes one rank per GPU ("Duplicate GPU detected" is an ncclInvalidUsage).
    const char* hint = r == ncclInvalidUsage ? " (if ranks share a GPU: nccl takes one rank per GPU; backend shm "
                                               "stages GPU buffers through host memory and takes several)"
                                             : "";
    PT_THROW(CommError, "rank ", rank, ": NCCL communicator init (", size, " ranks, cuda:", device_, ") failed: ", why,
             hint);
  }
  comm_ = comm;
  // Init completes on rank 0 only once every rank joined, so every rank has read the id.
  if (rank == 0) store->delete_key(key);
  std::vector<int> global;
  for (int i = 0; i < size; ++i) global.push_back(i);
  try {
    start(std::move(global), "");
  } catch (...) {
    ncclCommAbort(comm_);
    throw;
  }
}

NcclProcessGroup::NcclProcessGroup(ncclComm_t comm, int device, const ProcessGroupOptions& options,
                                   std::vector<int> global_ranks, std::string name)
    : device_(device), recorder_(&FlightRecorder::instance()), comm_(comm) {
  options_ = options;
  try {
    ncclResult_t r = ncclCommUserRank(comm_, &rank_);
    if (r == ncclSuccess) r = ncclCommCount(comm_, &size_);
    if (r != ncclSuccess) PT_THROW(CommError, "ncclCommUserRank/ncclCommCount failed: ", error_text(r, comm_));
    start(std::move(global_ranks), std::move(name));
  } catch (...) {
    ncclCommAbort(comm_);
    throw;
  }
}

void NcclProcessGroup::start(std::vector<int> global_ranks, std::string name) {
  DeviceGuard guard(device_);
  PT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  PT_CUDA_CHECK(cudaMalloc(&barrier_buf_, sizeof(int32_t)));
  PT_CUDA_CHECK(cudaMemsetAsync(barrier_buf_, 0, sizeof(int32_t), static_cast<cudaStream_t>(cuda::comm_stream(device_))));
  global_ranks_ = std::move(global_ranks);
  record_group_ = recorder_->add_group(std::move(name), "nccl", rank_, size_, global_ranks_);
  if (const FlightGroup* g = recorder_->group(record_group_)) name_ = g->name;
  PT_LOG_DEBUG(kComm, "process group ", name_, " ready: backend nccl, rank ", rank_, " of ", size_, " on cuda:",
               device_);
  watchdog_ = std::thread([this] { watchdog(); });
}

NcclProcessGroup::~NcclProcessGroup() {
  {
    std::lock_guard<std::mutex> l(mu_);
    flush_locked();
  }
  {
    // Each pending Work completes or fails at its deadline (the watchdog).
    std::unique_lock<std::mutex> l(pending_mu_);
    pending_cv_.wait(l, [&] { return pending_.empty(); });
    stop_ = true;
  }
  pending_cv_.notify_all();
  watchdog_.join();
  try {
    DeviceGuard guard(device_);
    std::lock_guard<std::mutex> c(comm_mu_);
    if (comm_) {
      const Deadline deadline = Deadline::after_seconds(options_.timeout_s);
      ncclResult_t r = ncclCommFinalize(comm_);
      while (r == ncclInProgress && !deadline.expired()) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        ncclResult_t s = ncclCommGetAsyncError(comm_, &r);
        if (s != ncclSuccess) r = s;
      }
      if (r == ncclSuccess) r = ncclCommDestroy(comm_);
      if (r != ncclSuccess) {
        PT_LOG_WARN(kComm, "rank ", rank_, ": closing the NCCL communicator of group ", name_, " failed (",
                    error_text(r, comm_), "); aborting it");
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (barrier_buf_) PT_CUDA_CHECK(cudaFree(barrier_buf_));
    if (ready_) PT_CUDA_CHECK(cudaEventDestroy(ready_));
  } catch (const std::exception& e) {
    PT_LOG_WARN(kComm, "rank ", rank_, ": closing nccl group ", name_, ": ", e.what());
  }
}

std::string NcclProcessGroup::describe(const Call& c, uint64_t seq) {
  std::string s = detail::concat(op_type_name(c.op), " #", seq);
  if (c.op == OpType::kBarrier) return s;
  s += detail::concat(" (", dtype_name(c.dtype), " x ", c.count, ", ", c.count * dtype_size(c.dtype), " bytes");
  if (c.op == OpType::kAllreduce || c.op == OpType::kReduce || c.op == OpType::kReduceScatter)
    s += detail::concat(", ", reduce_op_name(c.reduce_op));
  if (c.op == OpType::kBroadcast || c.op == OpType::kReduce) s += detail::concat(", root ", c.peer);
  if (c.op == OpType::kSend) s += detail::concat(", to rank ", c.peer, ", tag ", c.tag);
  if (c.op == OpType::kRecv) s += detail::concat(", from rank ", c.peer, ", tag ", c.tag);
  return s + ")";
}

std::string NcclProcessGroup::nccl_error(ncclResult_t r) {
  std::lock_guard<std::mutex> c(comm_mu_);
  return error_text(r, comm_);
}

void NcclProcessGroup::check_rank(int r, const char* what) const {
  if (r < 0 || r >= size_) PT_THROW(InputError, what, " rank ", r, " is outside the group of size ", size_);
}

std::shared_ptr<NcclWork> NcclProcessGroup::make_work(const Call& c) {
  const uint64_t seq = seq_++;
  auto w = std::make_shared<NcclWork>(std::function<std::string()>([c, seq] { return describe(c, seq); }), device_,
                                      Deadline::after_seconds(options_.timeout_s));
  const uint64_t rec = recorder_->record(record_group_, seq, c.op, c.dtype, c.count, c.reduce_op, c.peer, c.tag);
  if (rec) w->set_record(recorder_, rec);
  w->set_helper([this](Work* x) { help_wait(static_cast<NcclWork*>(x)); });
  w->flush_ = [this] { flush(); };
  return w;
}

bool NcclProcessGroup::admit(const std::shared_ptr<NcclWork>& w) {
  std::string why;
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    if (!broken_) {
      pending_.push_back(w);
      pending_cv_.notify_all();
      return true;
    }
    why = broken_why_;
  }
  w->complete(std::make_exception_ptr(CommError(detail::concat(
      "rank ", rank_, ": ", w->description(), " failed: the group is unusable after an earlier failure: ", why))));
  return false;
}

WorkPtr NcclProcessGroup::collective(const Call& c, std::vector<Launch> stages) {
  if (c.op != OpType::kBarrier) nccl_type(c.dtype);  // InputError before anything is recorded
  std::lock_guard<std::mutex> l(mu_);
  flush_locked();  // the sends/recvs called before go first
  auto w = make_work(c);
  if (admit(w)) enqueue_locked({w}, stages);
  return w;
}

WorkPtr NcclProcessGroup::point_to_point(const Call& c, void* buf) {
  nccl_type(c.dtype);
  std::lock_guard<std::mutex> l(mu_);
  auto w = make_work(c);
  if (admit(w)) batch_.push_back({w, c, buf});
  return w;
}

void NcclProcessGroup::flush() {
  std::lock_guard<std::mutex> l(mu_);
  flush_locked();
}

void NcclProcessGroup::flush_locked() {
  if (batch_.empty()) return;
  std::vector<P2p> batch;
  batch.swap(batch_);
  if (broken_) return;  // fail_all failed them
  std::vector<std::shared_ptr<NcclWork>> works;
  for (const P2p& p : batch) works.push_back(p.work);
  enqueue_locked(works, {[&batch](ncclComm_t comm, cudaStream_t s) {
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const P2p& p : batch) {
      const ncclDataType_t t = nccl_type(p.call.dtype);
      r = p.call.op == OpType::kSend ? ncclSend(p.buf, p.call.count, t, p.call.peer, comm, s)
                                     : ncclRecv(p.buf, p.call.count, t, p.call.peer, comm, s);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  }});
}

ncclResult_t NcclProcessGroup::settle(ncclResult_t r) {
  // Every work being enqueued is pending with a deadline: the watchdog aborts the
  // communicator when it passes, which ends this loop.
  while (r == ncclInProgress) {
    std::this_thread::yield();
    std::lock_guard<std::mutex> c(comm_mu_);
    if (!comm_) return ncclInProgress;
    ncclResult_t s = ncclCommGetAsyncError(comm_, &r);
    if (s != ncclSuccess) r = s;
  }
  return r;
}

void NcclProcessGroup::enqueue_locked(const std::vector<std::shared_ptr<NcclWork>>& works,
                                      const std::vector<Launch>& stages) {
  if (works.empty()) return;
  std::string why;
  try {
    DeviceGuard guard(device_);
    auto compute = static_cast<cudaStream_t>(cuda::compute_stream(device_));
    auto comm = static_cast<cudaStream_t>(cuda::comm_stream(device_));
    // The comm stream waits for what the compute stream has queued (the buffers' producers).
    PT_CUDA_CHECK(cudaEventRecord(ready_, compute));
    PT_CUDA_CHECK(cudaStreamWaitEvent(comm, ready_, 0));
    ncclResult_t r = ncclSuccess;
    // A non-blocking communicator takes its next call only once the last one settled.
    for (size_t i = 0; i < stages.size() && r == ncclSuccess; ++i) {
      {
        std::lock_guard<std::mutex> c(comm_mu_);
        if (!comm_) return;  // broken meanwhile: fail_all failed the works
        r = stages[i](comm_, comm);
      }
      r = settle(r);
      if (r == ncclInProgress) return;  // broken meanwhile
    }
    if (r != ncclSuccess) {
      why = detail::concat("rank ", rank_, ": ", works[0]->description(),
                           works.size() > 1 ? " (and the sends/recvs batched with it)" : "",
                           ": NCCL did not accept the call on cuda:", device_, ": ", nccl_error(r));
    } else {
      for (const auto& w : works) {
        PT_CUDA_CHECK(cudaEventCreateWithFlags(&w->done_, cudaEventDisableTiming));
        PT_CUDA_CHECK(cudaEventRecord(w->done_, comm));
        recorder_->started(w->record_id());
        w->enqueued_.store(true, std::memory_order_release);
      }
    }
  } catch (const std::exception& e) {
    why = detail::concat("rank ", rank_, ": ", works[0]->description(), " on cuda:", device_, ": ", e.what());
  }
  if (!why.empty()) fail_all(why, nullptr, false);
}

void NcclProcessGroup::help_wait(NcclWork* w) {
  if (w->is_completed()) return;
  cuda::note_host_wait();  // Work::wait(): the host blocks until the call has run
  if (!w->enqueued() && !w->is_completed()) flush();
  // Poll the completion event on the waiting thread for up to 1 ms (a short call then needs
  // no hand-off from the watchdog); then Work::wait() blocks, bounded by its own timeout,
  // until the watchdog completes or fails the Work.
  const auto until = Clock::now() + std::chrono::milliseconds(1);
  while (!w->is_completed() && w->enqueued() && Clock::now() < until) {
    const cudaError_t q = cudaEventQuery(w->done_);
    if (q == cudaSuccess) {
      w->complete();
      return;
    }
    if (q != cudaErrorNotReady) return;  // the watchdog reports it
    std::this_thread::yield();
  }
}

void NcclProcessGroup::watchdog() {
  try {
    PT_CUDA_CHECK(cudaSetDevice(device_));
  } catch (const std::exception& e) {
    PT_LOG_WARN(kComm, "rank ", rank_, ": nccl watchdog of group ", name_, ": ", e.what());
  }
  std::vector<std::shared_ptr<NcclWork>> live;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(pending_mu_);
      pending_cv_.wait(l, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stop_
      live = pending_;
    }
    std::string why;
    const NcclWork* culprit = nullptr;
    bool timeout = false;
    if (!broken_) {
      ncclResult_t state = ncclSuccess;
      {
        std::lock_guard<std::mutex> c(comm_mu_);
        if (comm_) {
          ncclResult_t s = ncclCommGetAsyncError(comm_, &state);
          if (s != ncclSuccess) state = s;
        }
      }
      if (state != ncclSuccess && state != ncclInProgress)
        why = detail::concat("rank ", rank_, ": NCCL reported an asynchronous error on cuda:", device_, " (group ", name_,
                             "): ", nccl_error(state));
    }
    size_t completed = 0;
    for (const auto& w : live) {
      if (w->is_completed()) {
        ++completed;
        continue;
      }
      if (w->enqueued()) {
        const cudaError_t q = cudaEventQuery(w->done_);
        if (q == cudaSuccess) {
          w->complete();
          ++completed;
          continue;
        }
        if (q != cudaErrorNotReady && why.empty())
          why = detail::concat("rank ", rank_, ": ", w->description(), " on cuda:", device_, ": CUDA error ",
                               cudaGetErrorName(q), " (", cudaGetErrorString(q), ")");
      }
      if (why.empty() && w->deadline_.expired()) {
        why = detail::concat(
            "rank ", rank_, ": ", w->description(), " passed its deadline of ", options_.timeout_s,
            " s (PARATRAIN_COMM_TIMEOUT_S) on cuda:", device_, " (nccl, group ", name_, "): ",
            w->enqueued() ? "the NCCL call did not complete (a rank of the group did not make the matching call, or is "
                            "stuck)"
                          : "it was never enqueued (a send/recv is enqueued when the program waits for it, calls "
                            "stream_wait() or flush(), or makes a later collective call on this group)",
            "; the communicator was aborted");
        culprit = w.get();
        timeout = true;
      }
    }
    live.clear();
    if (completed > 0) {
      std::lock_guard<std::mutex> l(pending_mu_);
      pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& w) { return w->is_completed(); }),
                     pending_.end());
      pending_cv_.notify_all();
    }
    if (!why.empty()) fail_all(why, culprit, timeout);
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void NcclProcessGroup::fail_all(const std::string& why, const NcclWork* culprit, bool timeout) {
  std::vector<std::shared_ptr<NcclWork>> failed;
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    if (!broken_) {
      broken_why_ = why;
      broken_ = true;
    }
    failed.swap(pending_);
  }
  {
    std::lock_guard<std::mutex> c(comm_mu_);
    if (comm_) {
      ncclCommAbort(comm_);  // ends the kernels of pending calls; frees the communicator
      comm_ = nullptr;
    }
  }
  PT_LOG_ERROR(kComm, why);
  for (const auto& w : failed) {
    if (w.get() == culprit && timeout) w->complete(std::make_exception_ptr(TimeoutError(why)));
    else if (w.get() == culprit) w->complete(std::make_exception_ptr(CommError(why)));
    else
      w->complete(std::make_exception_ptr(CommError(detail::concat(
          "rank ", rank_, ": ", w->description(), " failed: the group is unusable after a failure: ", why))));
  }
  {
    std::lock_guard<std::mutex> l(pending_mu_);
    pending_cv_.notify_all();
  }
}

WorkPtr NcclProcessGroup::staged(const void* in, size_t in_bytes, void* out, size_t out_bytes,
                                 const std::function<WorkPtr(const void*, void*)>& call) {
  DeviceGuard guard(device_);
  const bool in_place = in == out;
  Tensor d_in, d_out;
  const void* din = in;
  void* dout = out;
  if (!device_memory(in)) {
    d_in = Tensor::empty({static_cast<int64_t>(std::max<size_t>(in_bytes, 1))}, DType::U8, Device::CUDA, device_);
    // On the compute stream: the collective's comm stream waits for it (the call's event).
    PT_CUDA_CHECK(cudaMemcpyAsync(d_in.data_ptr(), in, in_bytes, cudaMemcpyHostToDevice,
                                  static_cast<cudaStream_t>(cuda::compute_stream(device_))));
    din = d_in.data_ptr();
    if (in_place) dout = d_in.data_ptr();
  }
  if (!in_place && !device_memory(out)) {
    d_out = Tensor::empty({static_cast<int64_t>(std::max<size_t>(out_bytes, 1))}, DType::U8, Device::CUDA, device_);
    dout = d_out.data_ptr();
  }
  WorkPtr w = call(din, dout);
  w->wait();  // the group's deadline; throws the call's failure
  if (dout != out) {  // the legacy stream does not wait for the (non-blocking) comm stream: done already
    cuda::note_host_wait();
    PT_CUDA_CHECK(cudaMemcpy(out, dout, out_bytes, cudaMemcpyDeviceToHost));
  }
  return w;
}

WorkPtr NcclProcessGroup::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  if (!device_memory(buf)) {
    const size_t bytes = count * dtype_size(dtype);
    return staged(buf, bytes, buf, bytes, [=, this](const void*, void* d) { return allreduce(d, count, dtype, op); });
  }
  if (options_.deterministic && size_ > 1)
    return rank_ordered({OpType::kAllreduce, dtype, count, -1, op, 0},
                        algorithms::rank_ordered_allreduce_plan(size_, rank_, count), buf, buf);
  const ncclRedOp_t o = nccl_op(op);
  return collective({OpType::kAllreduce, dtype, count, -1, op, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(buf, buf, count, nccl_type(dtype), o, comm, s);
  });
}

WorkPtr NcclProcessGroup::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  if (!device_memory(in) || !device_memory(out)) {
    const size_t bytes = count * dtype_size(dtype);
    return staged(in, bytes * size_, out, bytes,
                  [=, this](const void* i, void* o) { return reduce_scatter(i, o, count, dtype, op); });
  }
  if (options_.deterministic && size_ > 1)
    return rank_ordered({OpType::kReduceScatter, dtype, count, -1, op, 0},
                        algorithms::rank_ordered_reduce_scatter_plan(size_, rank_, count), in, out);
  const ncclRedOp_t o = nccl_op(op);
  return collective({OpType::kReduceScatter, dtype, count, -1, op, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclReduceScatter(in, out, count, nccl_type(dtype), o, comm, s);
  });
}

// ---- the rank-ordered mode (the header's "Rank-ordered mode") ----

namespace {

// Appends one grouped set of sends and recvs (skipping empty ones: both sides know the
// lengths) to a launch. Each entry: (peer, pointer, count).
struct P2pList {
  std::vector<std::tuple<int, const void*, size_t>> sends;
  std::vector<std::tuple<int, void*, size_t>> recvs;
  ncclResult_t launch(DType dtype, ncclComm_t comm, cudaStream_t s) const {
    const ncclDataType_t t = nccl_type(dtype);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (const auto& [peer, p, n] : sends)
      if (n > 0 && (r = ncclSend(p, n, t, peer, comm, s)) != ncclSuccess) break;
    if (r == ncclSuccess)
      for (const auto& [peer, p, n] : recvs)
        if (n > 0 && (r = ncclRecv(p, n, t, peer, comm, s)) != ncclSuccess) break;
    const ncclResult_t e = ncclGroupEnd();
    return r != ncclSuccess ? r : e;
  }
};

}  // namespace

Tensor NcclProcessGroup::contribution_slots(size_t bytes) {
  DeviceGuard guard(device_);
  Tensor t = Tensor::empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::U8, Device::CUDA, device_);
  // Freed when the call is enqueued; reused only once the comm stream has run it.
  cuda::record_stream(t.data_ptr(), cuda::comm_stream(device_));
  return t;
}

WorkPtr NcclProcessGroup::rank_ordered(const Call& call, const algorithms::RankOrderedPlan& plan, const void* in,
                                       void* out) {
  using algorithms::PlanBuffer;
  const int n = size_, r = rank_;
  const DType dtype = call.dtype;
  const ReduceOp op = call.reduce_op;
  const size_t es = dtype_size(dtype);
  Tensor slots = contribution_slots(plan.slot_elements * es);
  char* const slot = static_cast<char*>(slots.data_ptr());
  auto at = [&](PlanBuffer b, size_t offset) -> char* {
    char* base = b == PlanBuffer::kSlots ? slot
                 : b == PlanBuffer::kInput ? static_cast<char*>(const_cast<void*>(in))
                                            : static_cast<char*>(out);
    return base + offset * es;
  };
  std::vector<Launch> stages;
  for (const algorithms::PlanStep& step : plan.steps) {
    if (step.combines) {
      const algorithms::Combine c = step.combine;
      const char* own = at(PlanBuffer::kInput, c.own_offset);
      char* dst = at(PlanBuffer::kOutput, c.out_offset);
      stages.push_back([=](ncclComm_t, cudaStream_t s) {
        reduce_in_rank_order(own, r, slot, c.slot_stride, n, dst, c.count, dtype, op, s);
        return ncclSuccess;
      });
      continue;
    }
    P2pList list;
    for (const auto& t : step.sends) list.sends.emplace_back(t.peer, at(t.buffer, t.offset), t.count);
    for (const auto& t : step.recvs) list.recvs.emplace_back(t.peer, at(t.buffer, t.offset), t.count);
    stages.push_back([=](ncclComm_t comm, cudaStream_t s) { return list.launch(dtype, comm, s); });
  }
  return collective(call, std::move(stages));
}

WorkPtr NcclProcessGroup::allgather(const void* in, void* out, size_t count, DType dtype) {
  if (!device_memory(in) || !device_memory(out)) {
    const size_t bytes = count * dtype_size(dtype);
    return staged(in, bytes, out, bytes * size_, [=, this](const void* i, void* o) { return allgather(i, o, count, dtype); });
  }
  return collective({OpType::kAllgather, dtype, count, -1, ReduceOp::kSum, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclAllGather(in, out, count, nccl_type(dtype), comm, s);
  });
}

WorkPtr NcclProcessGroup::broadcast(void* buf, size_t count, DType dtype, int root) {
  if (!device_memory(buf)) {
    const size_t bytes = count * dtype_size(dtype);
    return staged(buf, bytes, buf, bytes, [=, this](const void*, void* d) { return broadcast(d, count, dtype, root); });
  }
  check_rank(root, "broadcast: root");
  return collective({OpType::kBroadcast, dtype, count, root, ReduceOp::kSum, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclBroadcast(buf, buf, count, nccl_type(dtype), root, comm, s);
  });
}

WorkPtr NcclProcessGroup::reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  if (!device_memory(buf)) {
    const size_t bytes = count * dtype_size(dtype);
    return staged(buf, bytes, buf, bytes, [=, this](const void*, void* d) { return reduce(d, count, dtype, op, root); });
  }
  check_rank(root, "reduce: root");
  if (options_.deterministic && size_ > 1)
    return rank_ordered({OpType::kReduce, dtype, count, root, op, 0},
                        algorithms::rank_ordered_reduce_plan(size_, rank_, count, root), buf, buf);
  const ncclRedOp_t o = nccl_op(op);
  // recvbuff is only written on the root: the other ranks' buffers stay as they were.
  return collective({OpType::kReduce, dtype, count, root, op, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    return ncclReduce(buf, buf, count, nccl_type(dtype), o, root, comm, s);
  });
}

WorkPtr NcclProcessGroup::all_to_all(const void* in, void* out, size_t count, DType dtype) {
  if (!device_memory(in) || !device_memory(out)) {
    const size_t bytes = count * dtype_size(dtype) * size_;
    return staged(in, bytes, out, bytes, [=, this](const void* i, void* o) { return all_to_all(i, o, count, dtype); });
  }
  const int n = size_;
  return collective({OpType::kAllToAll, dtype, count, -1, ReduceOp::kSum, 0}, [=](ncclComm_t comm, cudaStream_t s) {
    const ncclDataType_t t = nccl_type(dtype);
    const size_t block = count * dtype_size(dtype);
    ncclResult_t r = ncclGroupStart();
    if (r != ncclSuccess) return r;
    for (int p = 0; p < n; ++p) {
      r = ncclSend(static_cast<const char*>(in) + p * block, count, t, p, comm, s);
      if (r == ncclSuccess) r = ncclRecv(static_cast<char*>(out) + p * block, count, t, p, comm, s);
      if (r != ncclSuccess) {
        ncclGroupEnd();
        return r;
      }
    }
    return ncclGroupEnd();
  });
}

WorkPtr NcclProcessGroup::send(const void* buf, size_t count, DType dtype, int dst, int tag) {
  if (!device_memory(buf))
    PT_THROW(InputError, "nccl backend: send of a host buffer (give it a buffer on cuda:", device_, ")");
  check_rank(dst, "send: destination");
  return point_to_point({OpType::kSend, dtype, count, dst, ReduceOp::kSum, tag}, const_cast<void*>(buf));
}

WorkPtr NcclProcessGroup::recv(void* buf, size_t count, DType dtype, int src, int tag) {
  if (!device_memory(buf))
    PT_THROW(InputError, "nccl backend: recv into a host buffer (give it a buffer on cuda:", device_, ")");
  check_rank(src, "recv: source");
  return point_to_point({OpType::kRecv, dtype, count, src, ReduceOp::kSum, tag}, buf);
}

WorkPtr NcclProcessGroup::barrier() {
  void* buf = barrier_buf_;
  return collective({OpType::kBarrier, DType::U8, 0, -1, ReduceOp::kSum, 0}, [buf](ncclComm_t comm, cudaStream_t s) {
    return ncclAllReduce(buf, buf, 1, ncclInt32, ncclSum, comm, s);
  });
}

std::shared_ptr<ProcessGroup> NcclProcessGroup::new_group(const std::vector<int>& ranks) {
  if (ranks.empty()) PT_THROW(InputError, "new_group: empty rank list");
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_rank(ranks[i], "new_group:");
    if (i > 0 && ranks[i] <= ranks[i - 1]) PT_THROW(InputError, "new_group: ranks must be ascending and unique");
  }
  const bool member = std::find(ranks.begin(), ranks.end(), rank_) != ranks.end();
  std::lock_guard<std::mutex> l(mu_);
  const int id = next_group_id_++;
  flush_locked();
  if (broken_) {
    std::lock_guard<std::mutex> p(pending_mu_);
    PT_THROW(CommError, "rank ", rank_, ": new_group failed: the group is unusable after an earlier failure: ",
             broken_why_);
  }
  DeviceGuard guard(device_);
  ncclConfig_t config = nonblocking_config();
  const Deadline deadline = Deadline::after_seconds(options_.timeout_s);
  ncclComm_t sub = nullptr;
  ncclResult_t r;
  {
    std::lock_guard<std::mutex> c(comm_mu_);
    if (!comm_) PT_THROW(CommError, "rank ", rank_, ": new_group failed: the communicator was aborted");
    r = ncclCommSplit(comm_, member ? 0 : NCCL_SPLIT_NOCOLOR, rank_, &sub, &config);
  }
  // The split of a non-blocking communicator reports its progress on the new one, and on
  // the parent (all a rank outside the list has). A state: ncclInProgress at the deadline.
  auto state_of = [&](ncclComm_t c, bool parent) -> ncclResult_t {
    for (;;) {
      ncclResult_t state = ncclInProgress;
      {
        std::unique_lock<std::mutex> lock(comm_mu_, std::defer_lock);
        if (parent) {
          lock.lock();
          c = comm_;
          if (!c) return ncclInvalidUsage;  // aborted meanwhile
        }
        ncclResult_t s = ncclCommGetAsyncError(c, &state);
        if (s != ncclSuccess) return s;
      }
      if (state != ncclInProgress || deadline.expired()) return state;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  if (r == ncclSuccess || r == ncclInProgress) {
    r = sub ? state_of(sub, false) : ncclSuccess;
    if (r == ncclSuccess) r = state_of(nullptr, true);
  }
  if (r != ncclSuccess) {
    std::string why =
        r == ncclInProgress
            ? detail::concat("rank ", rank_, ": new_group (ncclCommSplit of group ", name_, ", ", ranks.size(),
                             " ranks) passed its deadline of ", options_.timeout_s,
                             " s (PARATRAIN_COMM_TIMEOUT_S): a rank of the group did not call new_group")
            : detail::concat("rank ", rank_, ": new_group (ncclCommSplit of group ", name_, ") failed: ",
                             error_text(r, sub));
    if (sub) ncclCommAbort(sub);
    fail_all(why, nullptr, false);
    if (r == ncclInProgress) throw TimeoutError(why);
    throw CommError(why);
  }
  if (!member) return nullptr;
  std::vector<int> global;
  for (int x : ranks) global.push_back(global_ranks_[static_cast<size_t>(x)]);
  return std::make_shared<NcclProcessGroup>(sub, device_, options_, std::move(global),
                                            name_.empty() ? "" : name_ + "/" + std::to_string(id));
}

std::shared_ptr<ProcessGroup> create_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                        const ProcessGroupOptions& options,
                                                        std::vector<std::shared_ptr<void>> keep) {
  auto pg = std::make_shared<NcclProcessGroup>(std::move(store), rank, size, options);
  for (auto& k : keep) pg->hold(std::move(k));
  return pg;
}

}  // namespace paratrain::comm::nccl
