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
  DeviceMemory m;
  if (!cuda::built()) {
    m.holds = [](const void*) { return false; };
    return m;
  }
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

// A call with GPU buffers: its host call, the staging memory that call uses, and the copy
// back to the GPU that completes it.
class StagedWork final : public Work {
 public:
  StagedWork(WorkPtr host_call, std::vector<std::shared_ptr<void>> staging, void* gpu_out, const void* host_out,
             size_t out_bytes, const DeviceMemory& memory)
      : Work([call = host_call] { return call->description() + " (GPU buffers staged through host memory)"; }),
        host_call_(std::move(host_call)), staging_(std::move(staging)), gpu_out_(gpu_out), host_out_(host_out),
        out_bytes_(out_bytes), memory_(memory) {
    set_helper([](Work* w) { static_cast<StagedWork*>(w)->complete(); });
  }

  bool host_call_done() const { return host_call_->is_completed(); }

  // Waits for the host call, copies its result up and finishes; the first caller does it,
  // a second returns at once (Work::wait then waits for the first).
  void complete() {
    if (claimed_.exchange(true)) return;
    std::exception_ptr error;
    try {
      host_call_->wait();
      if (out_bytes_) memory_.to_device(gpu_out_, host_out_, out_bytes_);
    } catch (...) {
      error = std::current_exception();
    }
    staging_.clear();
    finish(error);
  }

 private:
  WorkPtr host_call_;
  std::vector<std::shared_ptr<void>> staging_;
  void* gpu_out_;
  const void* host_out_;
  size_t out_bytes_;
  const DeviceMemory& memory_;  // the group's, which completes every Work before it goes
  std::atomic<bool> claimed_{false};
};

class StagedProcessGroup final : public ProcessGroup {
 public:
  StagedProcessGroup(std::shared_ptr<ProcessGroup> host_group, DeviceMemory memory)
      : host_(std::move(host_group)), memory_(std::move(memory)) {
    rank_ = host_->rank();
    size_ = host_->size();
    options_ = host_->options();
    record_group_ = host_->record_group();
  }

  ~StagedProcessGroup() override {
    std::vector<std::shared_ptr<StagedWork>> staged;
    std::vector<Parked> parked;
    {
      std::lock_guard<std::mutex> l(mu_);
      staged.swap(staged_);
      parked.swap(parked_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (finisher_.joinable()) finisher_.join();
    for (auto& w : staged) w->complete();
    for (auto& p : parked) wait_quietly(p.host_call);
  }

  std::string backend_name() const override { return host_->backend_name(); }
  P2pMatching p2p_matching() const override { return host_->p2p_matching(); }

  WorkPtr allreduce(void* buf, size_t count, DType dt, ReduceOp op) override {
    const size_t n = count * dtype_size(dt);
    return staged(buf, n, buf, n, [&](const void*, void* out) { return host_->allreduce(out, count, dt, op); });
  }
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dt, ReduceOp op) override {
    const size_t n = count * dtype_size(dt);
    return staged(in, n * size_, out, n,
                  [&](const void* i, void* o) { return host_->reduce_scatter(i, o, count, dt, op); });
  }
  WorkPtr allgather(const void* in, void* out, size_t count, DType dt) override {
    const size_t n = count * dtype_size(dt);
    return staged(in, n, out, n * size_, [&](const void* i, void* o) { return host_->allgather(i, o, count, dt); });
  }
  WorkPtr broadcast(void* buf, size_t count, DType dt, int root) override {
    const size_t n = count * dtype_size(dt);
    if (rank_ == root)  // read, left as it is
      return staged(buf, n, nullptr, 0,
                    [&](const void* i, void*) { return host_->broadcast(const_cast<void*>(i), count, dt, root); });
    return staged(nullptr, 0, buf, n, [&](const void*, void* o) { return host_->broadcast(o, count, dt, root); });
  }
  WorkPtr reduce(void* buf, size_t count, DType dt, ReduceOp op, int root) override {
    const size_t n = count * dtype_size(dt);
    return staged(buf, n, rank_ == root ? buf : nullptr, rank_ == root ? n : 0, [&](const void* i, void*) {
      return host_->reduce(const_cast<void*>(i), count, dt, op, root);
    });
  }
  WorkPtr all_to_all(const void* in, void* out, size_t count, DType dt) override {
    const size_t n = count * dtype_size(dt) * size_;
    return staged(in, n, out, n, [&](const void* i, void* o) { return host_->all_to_all(i, o, count, dt); });
  }
  WorkPtr send(const void* buf, size_t count, DType dt, int dst, int tag) override {
    return staged(buf, count * dtype_size(dt), nullptr, 0,
                  [&](const void* i, void*) { return host_->send(i, count, dt, dst, tag); });
  }
  WorkPtr recv(void* buf, size_t count, DType dt, int src, int tag) override {
    return staged(nullptr, 0, buf, count * dtype_size(dt),
                  [&](const void*, void* o) { return host_->recv(o, count, dt, src, tag); });
  }
  WorkPtr barrier() override { return host_->barrier(); }

  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    auto sub = host_->new_group(ranks);
    return sub ? std::make_shared<StagedProcessGroup>(std::move(sub), memory_) : nullptr;
  }

 private:
  // A host call with nothing to copy back, and the staging memory it reads until it completes.
  struct Parked {
    WorkPtr host_call;
    std::shared_ptr<void> staging;
  };

  static void wait_quietly(const WorkPtr& w) {
    try {
      w->wait();
    } catch (...) {  // the caller's Work reports it
    }
  }

  // Runs `call(host_in, host_out)` on host memory: `in` (in_bytes, read by the call) and
  // `out` (out_bytes, written by it; may be `in`: in place) staged where they are GPU memory.
  template <typename Call>
  WorkPtr staged(const void* in, size_t in_bytes, void* out, size_t out_bytes, Call&& call) {
    const bool in_gpu = in_bytes > 0 && memory_.holds(in);
    const bool out_gpu = out_bytes > 0 && memory_.holds(out);
    if (!in_gpu && !out_gpu) return call(in, out);
    std::vector<std::shared_ptr<void>> staging;
    const void* host_in = in;
    void* host_out = out;
    if (in_gpu) {
      staging.push_back(memory_.host_buffer(std::max(in_bytes, in == out ? out_bytes : 0)));
      memory_.to_host(staging.back().get(), in, in_bytes);
      host_in = staging.back().get();
    }
    if (out_gpu) {
      if (in_gpu && in == out) {
        host_out = staging.back().get();
      } else {
        staging.push_back(memory_.host_buffer(out_bytes));
        host_out = staging.back().get();
      }
    }
    WorkPtr host_call = call(host_in, host_out);
    prune_parked();
    if (!out_gpu) {  // nothing comes back: the caller gets the host call's Work
      std::lock_guard<std::mutex> l(mu_);
      parked_.push_back({host_call, staging.front()});
      return host_call;
    }
    auto w = std::make_shared<StagedWork>(std::move(host_call), std::move(staging), out, host_out, out_bytes, memory_);
    {
      std::lock_guard<std::mutex> l(mu_);
      staged_.push_back(w);
      if (!finisher_.joinable()) finisher_ = std::thread([this] { finish_in_background(); });
    }
    cv_.notify_all();
    return w;
  }

  // Releases the staging memory of parked host calls that have completed.
  void prune_parked() {
    std::lock_guard<std::mutex> l(mu_);
    parked_.erase(std::remove_if(parked_.begin(), parked_.end(), [](const Parked& p) { return p.host_call->is_completed(); }),
                  parked_.end());
  }

  // Completes the staged Works nobody waits for, as their host calls complete.
  void finish_in_background() {
    std::unique_lock<std::mutex> l(mu_);
    while (!stopping_) {
      if (staged_.empty()) {
        cv_.wait(l, [&] { return stopping_ || !staged_.empty(); });
        continue;
      }
      std::vector<std::shared_ptr<StagedWork>> ready, pending;
      for (auto& w : staged_) (w->is_completed() || w->host_call_done() ? ready : pending).push_back(std::move(w));
      staged_.swap(pending);
      l.unlock();
      for (auto& w : ready) w->complete();
      l.lock();
      if (ready.empty()) cv_.wait_for(l, std::chrono::microseconds(200));
    }
  }

  std::shared_ptr<ProcessGroup> host_;
  DeviceMemory memory_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<StagedWork>> staged_;  // not yet completed by the background thread
  std::vector<Parked> parked_;
  bool stopping_ = false;
  std::thread finisher_;
};

}  // namespace

std::shared_ptr<ProcessGroup> stage_device_buffers(std::shared_ptr<ProcessGroup> host_group, DeviceMemory memory) {
  return std::make_shared<StagedProcessGroup>(std::move(host_group), std::move(memory));
}

}  // namespace paratrain::comm
