// The per-GPU asynchronous error records (tensor/cuda_device_errors.h).
#include "paratrain/tensor/cuda_device_errors.h"

#include <cuda_runtime.h>

#include <mutex>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"

namespace paratrain::cuda {
namespace {

struct Records {
  std::mutex mu;
  std::vector<DeviceErrorRecord*> host, device;  // per GPU: the host view and the kernels' pointer
};

Records& records() {
  static Records* r = new Records();  // never destroyed: CUDA may be torn down first
  return *r;
}

int resolve(int d) { return d < 0 ? current_device() : d; }

}  // namespace

DeviceErrorRecord* device_error_record(int d) {
  d = resolve(d);
  Records& r = records();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.host.size() <= static_cast<size_t>(d)) r.host.resize(d + 1, nullptr), r.device.resize(d + 1, nullptr);
  if (!r.host[d]) {
    void* p = nullptr;
    PT_CUDA_CHECK(cudaHostAlloc(&p, sizeof(DeviceErrorRecord), cudaHostAllocMapped | cudaHostAllocPortable));
    auto* rec = static_cast<DeviceErrorRecord*>(p);
    *rec = DeviceErrorRecord{0, 0, 0, 0, nullptr, nullptr, nullptr};
    void* dev = nullptr;
    PT_CUDA_CHECK(cudaHostGetDevicePointer(&dev, p, 0));
    r.host[d] = rec;
    r.device[d] = static_cast<DeviceErrorRecord*>(dev);
  }
  return r.device[d];
}

void raise_device_errors(int d) {
  d = resolve(d);
  Records& r = records();
  DeviceErrorRecord seen{};
  {
    std::lock_guard<std::mutex> lock(r.mu);
    if (r.host.size() <= static_cast<size_t>(d) || !r.host[d]) return;  // no kernel ever asked for it
    volatile DeviceErrorRecord* rec = r.host[d];
    if (rec->code == 0) return;
    seen.position = rec->position, seen.value = rec->value, seen.bound = rec->bound;
    seen.who = rec->who, seen.what = rec->what, seen.range = rec->range;
    rec->code = 0;
  }
  PT_THROW(InputError, seen.who ? seen.who : "a CUDA kernel", ": ", seen.what ? seen.what : "value", " ", seen.value,
           " at position ", seen.position, " is outside ", seen.range ? seen.range : "the range", " [0,", seen.bound,
           ") (found on cuda:", d, " and reported at the next wait for its results)");
}

}  // namespace paratrain::cuda
