// The GPU and pinned-host caching allocators (tensor/cuda_allocator.h).
#include "paratrain/tensor/cuda_allocator.h"

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/cuda_device_guard.h"

namespace paratrain::cuda {

namespace {

std::string mib(int64_t b) { return std::to_string(b / (1 << 20)) + " MiB"; }

// One GPU's allocator: a CachingAllocator over cudaMalloc, plus blocks whose reuse waits for
// events on other streams (record_stream).
class DeviceAllocator final : public Allocator {
 public:
  explicit DeviceAllocator(int device)
      : device_(device),
        cache_(CachingAllocator::Source{[device](size_t bytes) -> void* {
                                          DeviceGuard g(device);
                                          void* p = nullptr;
                                          cudaError_t e = cudaMalloc(&p, bytes);
                                          if (e == cudaErrorMemoryAllocation) {
                                            cudaGetLastError();
                                            throw std::bad_alloc();
                                          }
                                          PT_CUDA_CHECK(e);
                                          return p;
                                        },
                                        [device](void* p, size_t) {
                                          DeviceGuard g(device);
                                          cudaFree(p);
                                        }}) {}

  void* allocate(size_t nbytes) override {
    reclaim_finished();
    try {
      return cache_.allocate(nbytes);
    } catch (const std::bad_alloc&) {
      // Blocks waiting for other streams may be free by now: wait for them and retry once.
      reclaim_all();
      try {
        return cache_.allocate(nbytes);
      } catch (const std::bad_alloc&) {
        AllocatorStats s = cache_.stats();
        size_t free_b = 0, total_b = 0;
        {
          DeviceGuard g(device_);
          cudaMemGetInfo(&free_b, &total_b);
        }
        PT_THROW(CudaError, "out of memory on cuda:", device_, ": asked for ", nbytes, " bytes with ",
                 mib(s.bytes_in_use), " in use and ", mib(s.bytes_reserved), " reserved by paratrain, ",
                 mib(static_cast<int64_t>(free_b)), " free of ", mib(static_cast<int64_t>(total_b)),
                 " on the GPU: use a smaller --micro-batch, --recompute, or ZeRO");
      }
    }
  }

  void deallocate(void* p, size_t nbytes) override {
    if (!p) return;
    std::vector<cudaStream_t> streams;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = used_on_.find(p);
      if (it != used_on_.end()) {
        streams = std::move(it->second);
        used_on_.erase(it);
      }
    }
    if (streams.empty()) {
      cache_.deallocate(p, nbytes);
      return;
    }
    Pending pending{p, nbytes, {}};
    DeviceGuard g(device_);
    for (cudaStream_t s : streams) {
      cudaEvent_t ev;
      PT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
      PT_CUDA_CHECK(cudaEventRecord(ev, s));
      pending.events.push_back(ev);
    }
    std::lock_guard<std::mutex> l(mu_);
    pending_.push_back(std::move(pending));
  }

  void record_stream(const void* p, cudaStream_t s) {
    if (s == static_cast<cudaStream_t>(compute_stream(device_))) return;
    std::lock_guard<std::mutex> l(mu_);
    auto& v = used_on_[const_cast<void*>(p)];
    for (cudaStream_t x : v)
      if (x == s) return;
    v.push_back(s);
  }

  AllocatorStats stats() const override { return cache_.stats(); }
  void reset_peak() override { cache_.reset_peak(); }
  void empty_cache() override {
    reclaim_all();
    cache_.empty_cache();
  }

 private:
  struct Pending {
    void* p;
    size_t nbytes;
    std::vector<cudaEvent_t> events;
  };

  // Returns to the cache every pending block whose events have all completed (wait=false),
  // or every pending block after waiting for its events (wait=true).
  void reclaim(bool wait) {
    std::deque<Pending> ready;
    {
      std::lock_guard<std::mutex> l(mu_);
      for (auto it = pending_.begin(); it != pending_.end();) {
        bool done = true;
        for (cudaEvent_t ev : it->events) {
          cudaError_t e = wait ? cudaEventSynchronize(ev) : cudaEventQuery(ev);
          if (e == cudaErrorNotReady) {
            cudaGetLastError();
            done = false;
            break;
          }
          PT_CUDA_CHECK(e);
        }
        if (done) {
          ready.push_back(std::move(*it));
          it = pending_.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (Pending& r : ready) {
      for (cudaEvent_t ev : r.events) cudaEventDestroy(ev);
      cache_.deallocate(r.p, r.nbytes);
    }
  }
  void reclaim_finished() {
    if (has_pending()) reclaim(false);
  }
  void reclaim_all() {
    if (!has_pending()) return;
    cuda::note_host_wait();
    reclaim(true);
  }
  bool has_pending() {
    std::lock_guard<std::mutex> l(mu_);
    return !pending_.empty();
  }

  const int device_;
  CachingAllocator cache_;
  std::mutex mu_;
  std::unordered_map<void*, std::vector<cudaStream_t>> used_on_;
  std::deque<Pending> pending_;
};

std::vector<DeviceAllocator*>& allocators() {
  // Never destroyed: tensors in static objects may outlive any destruction order.
  static auto* all = [] {
    auto* v = new std::vector<DeviceAllocator*>();
    for (int d = 0; d < device_count(); ++d) v->push_back(new DeviceAllocator(d));
    return v;
  }();
  return *all;
}

}  // namespace

Allocator& device_allocator(int d) {
  if (d < 0) d = current_device();
  require_device(d);
  return *allocators()[static_cast<size_t>(d)];
}

int device_of(const void* p) {
  if (!p || !gpu_in_use()) return -1;  // no GPU touched yet: no need to ask the driver
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return a.type == cudaMemoryTypeDevice ? a.device : -1;
}

void record_stream(const void* p, Stream s) {
  int d = device_of(p);
  if (d < 0) PT_THROW(InputError, "record_stream: ", p, " is not GPU memory of this process");
  allocators()[static_cast<size_t>(d)]->record_stream(p, static_cast<cudaStream_t>(s));
}

Allocator& pinned_allocator() {
  static auto* pinned = new CachingAllocator(CachingAllocator::Source{
      [](size_t bytes) -> void* {
        void* p = nullptr;
        cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault);
        if (e == cudaErrorMemoryAllocation) {
          cudaGetLastError();
          throw std::bad_alloc();
        }
        PT_CUDA_CHECK(e);
        return p;
      },
      [](void* p, size_t) { cudaFreeHost(p); }});
  if (device_count() == 0) PT_THROW(InputError, "pinned host memory needs a CUDA GPU: ", unavailable_reason());
  return *pinned;
}

}  // namespace paratrain::cuda
