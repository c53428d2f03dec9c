#include "comm/device_staging.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_allocator.h"

namespace paratrain::comm {

DeviceMemory cuda_device_memory() {
  DeviceMemory m;  // without CUDA, device_of() is -1 for everything: nothing is staged
  m.holds = [](const void* p) { return cuda::device_of(p) >= 0; };
  m.to_host = [](void* host, const void* gpu, size_t n) { cuda::copy_to_host(host, gpu, n); };
  m.to_device = [](void* gpu, const void* host, size_t n) { cuda::copy_to_gpu(gpu, host, n); };
  m.host_buffer = [](size_t n) -> std::shared_ptr<void> {
    Allocator& pinned = cuda::pinned_allocator();
    return std::shared_ptr<void>(pinned.allocate(n), [&pinned, n](void* p) { pinned.deallocate(p, n); });
  };
  return m;
}

namespace {

bool overlap(const void* a, size_t na, const void* b, size_t nb) {
  const auto* x = static_cast<const char*>(a);
  const auto* y = static_cast<const char*>(b);
  return na > 0 && nb > 0 && x < y + nb && y < x + na;
}

// A call with GPU output: its host call, the staging memory that call uses, and the copy
// back to the GPU that completes it.
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr host_call, std::vector<std::shared_ptr<void>> staging, void* gpu_out, const void* host_out,
             size_t out_bytes, bool collective, std::shared_ptr<const DeviceMemory> memory)
      : Work([call = host_call] { return call->description() + " (GPU buffers staged through host memory)"; }),
        host_call_(std::move(host_call)), staging_(std::move(staging)), gpu_out_(gpu_out), host_out_(host_out),
        out_bytes_(out_bytes), collective_(collective), memory_(std::move(memory)) {
    // A waiter whose host call is done copies the result up itself; else Work::wait waits
    // (with its timeout) for the group's background thread to do it.
    set_helper([](Work* w) {
      auto* s = static_cast<StagedWork*>(w);
      if (s->host_call_done()) s->complete();
    });
  }

  bool host_call_done() const { return host_call_->is_completed(); }
  // A collective (not a recv) writing GPU memory that overlaps [p, p + n).
  bool collective_writing(const void* p, size_t n) const { return collective_ && overlap(gpu_out_, out_bytes_, p, n); }

  // Waits for the host call, copies its result up and finishes; the first caller does it,
  // a later one returns at once (finished or not).
  void complete() {
    if (claimed_.exchange(true)) return;
    std::exception_ptr error;
    try {
      host_call_->wait();
      memory_->to_device(gpu_out_, host_out_, out_bytes_);
    } catch (...) {
      error = std::current_exception();
    }
    staging_.clear();
    finish(error);
  }

  // complete(), then waits until the Work has finished (another thread may be completing it).
  void settle() {
    complete();
    wait_ignoring_failure();
  }

 private:
  WorkPtr host_call_;
  std::vector<std::shared_ptr<void>> staging_;
  void* gpu_out_;
  const void* host_out_;
  size_t out_bytes_;
  bool collective_;
  std::shared_ptr<const DeviceMemory> memory_;
  std::atomic<bool> claimed_{false};
};

// What the group and its background thread share, and what host calls poke when they finish
// (a callback may run after the group is gone, so it holds this, not the group).
struct StagingState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::shared_ptr<StagedWork>> staged;  // in issue order; dropped once finished
  struct Parked {
    WorkPtr host_call;
    std::shared_ptr<void> staging;
  };
  std::vector<Parked> parked;  // host calls with nothing to copy back, and the memory they read
  bool poked = false, stopping = false;

  void poke() {
    {
      std::lock_guard<std::mutex> l(mu);
      poked = true;
    }
    cv.notify_all();
  }
};

class StagedProcessGroup final : public ProcessGroup {
 public:
  StagedProcessGroup(std::shared_ptr<ProcessGroup> host_group, std::shared_ptr<const DeviceMemory> memory)
      : host_(std::move(host_group)), memory_(std::move(memory)), state_(std::make_shared<StagingState>()) {
    rank_ = host_->rank();
    size_ = host_->size();
    options_ = host_->options();
    record_group_ = host_->record_group();
  }

  ~StagedProcessGroup() override {
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->stopping = true;
    }
    state_->cv.notify_all();
    if (finisher_.joinable()) finisher_.join();
    for (auto& w : state_->staged) w->settle();
    for (auto& p : state_->parked) p.host_call->wait_ignoring_failure();
  }

  std::string backend_name() const override { return host_->backend_name(); }
  P2pMatching p2p_matching() const override { return host_->p2p_matching(); }

  WorkPtr allreduce(void* buf, size_t count, DType dt, ReduceOp op) override {
    const size_t n = count * dtype_size(dt);
    return staged(buf, n, buf, n, true, [&](const void*, void* out) { return host_->allreduce(out, count, dt, op); });
  }
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) override {
    const size_t n = count * dtype_size(dt);
    return staged(in, n * size_, out, n, true,
                  [&](const void* i, void* o) { return host_->reduce_scatter(i, o, count, dt, op); });
  }
  WorkPtr allgather(const void* in, void* out, size_t count, DType dt) override {
    const size_t n = count * dtype_size(dt);
    return staged(in, n, out, n * size_, true,
                  [&](const void* i, void* o) { return host_->allgather(i, o, count, dt); });
  }
  WorkPtr broadcast(void* buf, size_t count, DType dt, int root) override {
    const size_t n = count * dtype_size(dt);
    if (rank_ == root)  // read, left as it is
      return staged(buf, n, nullptr, 0, true,
                    [&](const void* i, void*) { return host_->broadcast(const_cast<void*>(i), count, dt, root); });
    return staged(nullptr, 0, buf, n, true, [&](const void*, void* o) { return host_->broadcast(o, count, dt, root); });
  }
  WorkPtr reduce(void* buf, size_t count, DType dt, ReduceOp op, int root) override {
    const size_t n = count * dtype_size(dt);
    return staged(buf, n, rank_ == root ? buf : nullptr, rank_ == root ? n : 0, true, [&](const void* i, void*) {
      return host_->reduce(const_cast<void*>(i), count, dt, op, root);
    });
  }
  WorkPtr all_to_all(const void* in, void* out, size_t count, DType dt) override {
    const size_t n = count * dtype_size(dt) * size_;
    return staged(in, n, out, n, true, [&](const void* i, void* o) { return host_->all_to_all(i, o, count, dt); });
  }
  WorkPtr send(const void* buf, size_t count, DType dt, int dst, int tag) override {
    return staged(buf, count * dtype_size(dt), nullptr, 0, false,
                  [&](const void* i, void*) { return host_->send(i, count, dt, dst, tag); });
  }
  WorkPtr recv(void* buf, size_t count, DType dt, int src, int tag) override {
    return staged(nullptr, 0, buf, count * dtype_size(dt), false,
                  [&](const void*, void* o) { return host_->recv(o, count, dt, src, tag); });
  }
  WorkPtr barrier() override { return host_->barrier(); }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    auto sub = host_->new_group(ranks);
    return sub ? std::make_shared<StagedProcessGroup>(std::move(sub), memory_) : nullptr;
  }

 private:
  // Runs `call(host_in, host_out)` on host memory: `in` (in_bytes, read by the call) and
  // `out` (out_bytes, written by it; may be `in`: in place) staged where they are GPU memory.
  // `collective`: a collective (false for send/recv).
  template <typename Call>
  WorkPtr staged(const void* in, size_t in_bytes, void* out, size_t out_bytes, bool collective, Call&& call) {
    const bool in_gpu = in_bytes > 0 && memory_->holds(in);
    const bool out_gpu = out_bytes > 0 && memory_->holds(out);
    if (!in_gpu && !out_gpu) return call(in, out);
    // Stream order, as nccl keeps it: what an earlier collective writes into these GPU buffers
    // lands first (its copy up), so this call reads it and its own result lands after it.
    if (in_gpu) settle_collectives_writing(in, in_bytes);
    if (out_gpu) settle_collectives_writing(out, out_bytes);
    std::vector<std::shared_ptr<void>> staging;
    const void* host_in = in;
    void* host_out = out;
    if (in_gpu) {
      staging.push_back(memory_->host_buffer(std::max(in_bytes, in == out ? out_bytes : 0)));
      memory_->to_host(staging.back().get(), in, in_bytes);
      host_in = staging.back().get();
    }
    if (out_gpu && !(in_gpu && in == out)) staging.push_back(memory_->host_buffer(out_bytes));
    if (out_gpu) host_out = staging.back().get();
    WorkPtr host_call = call(host_in, host_out);
    if (!out_gpu) {  // nothing comes back: the caller gets the host call's Work
      std::lock_guard<std::mutex> l(state_->mu);
      std::erase_if(state_->parked, [](const StagingState::Parked& p) { return p.host_call->is_completed(); });
      state_->parked.push_back({host_call, staging.front()});
      return host_call;
    }
    auto w = std::make_shared<StagedWork>(host_call, std::move(staging), out, host_out, out_bytes, collective, memory_);
    {
      std::lock_guard<std::mutex> l(state_->mu);
      state_->staged.push_back(w);
      if (!finisher_.joinable()) finisher_ = std::thread([s = state_] { finish_in_background(*s); });
    }
    host_call->on_finished([s = state_] { s->poke(); });
    return w;
  }

  // Completes, in issue order, the pending staged collectives that write into [p, p + n).
  void settle_collectives_writing(const void* p, size_t n) {
    std::vector<std::shared_ptr<StagedWork>> earlier;
    {
      std::lock_guard<std::mutex> l(state_->mu);
      for (const auto& w : state_->staged)
        if (!w->is_completed() && w->collective_writing(p, n)) earlier.push_back(w);
    }
    for (const auto& w : earlier) w->settle();
  }

  // The background thread: completes the staged Works whose host calls have finished (each
  // host call pokes the state when it does), whether or not anyone waits for them. A Work
  // leaves the list only once it has finished, so settle_collectives_writing() always sees
  // one whose result is not yet on the GPU.
  static void finish_in_background(StagingState& s) {
    std::unique_lock<std::mutex> l(s.mu);
    while (true) {
      s.cv.wait(l, [&] { return s.poked || s.stopping; });
      if (s.stopping) return;
      s.poked = false;
      std::vector<std::shared_ptr<StagedWork>> ready;
      for (const auto& w : s.staged)
        if (!w->is_completed() && w->host_call_done()) ready.push_back(w);
      l.unlock();
      for (const auto& w : ready) w->complete();
      l.lock();
      std::erase_if(s.staged, [](const std::shared_ptr<StagedWork>& w) { return w->is_completed(); });
    }
  }

  std::shared_ptr<ProcessGroup> host_;
  std::shared_ptr<const DeviceMemory> memory_;
  std::shared_ptr<StagingState> state_;
  std::thread finisher_;
};

}  // namespace

std::shared_ptr<ProcessGroup> stage_device_buffers(std::shared_ptr<ProcessGroup> host_group, DeviceMemory memory) {
  return std::make_shared<StagedProcessGroup>(std::move(host_group),
                                              std::make_shared<const DeviceMemory>(std::move(memory)));
}

}  // namespace paratrain::comm
