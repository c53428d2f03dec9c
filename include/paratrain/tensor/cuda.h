// The CUDA runtime as paratrain's layers see it: which GPUs there are, the current device,
// and the two streams every layer uses on it. Including this header needs no CUDA header;
// every function exists in every build (a build without CUDA has no devices).
//
//  - Devices: device_count() is the number of GPUs this process can use: 0 when paratrain
//    was built without CUDA, when there is no driver, or no GPU is visible; it never throws
//    and unavailable_reason() says why. A process works on one current device at a time
//    (set_device; `cuda:N` tensors name theirs), as LOCAL_RANK -> cuda:LOCAL_RANK.
//  - Streams: per device, one compute stream (kernels, copies, the allocator's reuse order)
//    and one communication stream (collectives; ordered after the compute stream with
//    events, see comm/backends/nccl). Both are created on first use and live as long as the
//    process; they are non-blocking CUDA streams, so nothing runs on the legacy stream.
//  - Errors: a failing CUDA call throws CudaError naming the call, the CUDA error and the
//    device; asking for a device that is not there is an InputError.
//
// Thread-safety: every function may be called from any thread. The current device is per
// thread, as in the CUDA runtime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "paratrain/base/error.h"

namespace paratrain::cuda {

// A CUDA runtime, cuBLAS or NCCL call failed.
class CudaError : public Error {
 public:
  explicit CudaError(const std::string& what) : Error(what) {}
};

// True when this build has the CUDA parts (cmake -DPARATRAIN_CUDA=auto|on).
bool built();
// GPUs visible to this process; 0 without a CUDA build, a driver or a GPU. Never throws.
int device_count();
// Why device_count() is 0 ("this build has no CUDA support", "no CUDA driver: ..."), or "".
std::string unavailable_reason();
// Throws InputError naming the device and why it is not there, unless 0 <= d < device_count(),
// or, on a device's first use, kernel_image_problem(d) when that is not "".
void require_device(int d);

// The CUDA architectures this build has GPU code for, as CMAKE_CUDA_ARCHITECTURES named them
// ("90", "80,90", "native"); "" in a build without CUDA.
std::string built_architectures();
// "" when this build's GPU code runs on cuda:d (a binary for its architecture, or PTX that the
// driver compiles for it); else why not and what to rebuild with. Asks the CUDA runtime
// (without calling require_device).
std::string kernel_image_problem(int d);

// True once this process has used a GPU through paratrain: require_device() passed (as
// set_device(), a stream and a device allocator do). Before that no GPU memory of this
// process can have come from paratrain, and checks of pointers need not ask the driver
// (which would create a CUDA context on a CPU-only run). Never throws.
bool gpu_in_use();

int current_device();
void set_device(int d);  // require_device(d), then makes d this thread's current device

// Opaque cudaStream_t / cudaEvent_t, so that layers above need no CUDA header.
using Stream = void*;
// The compute / communication stream of device d (-1: the current device).
Stream compute_stream(int d = -1);
Stream comm_stream(int d = -1);
// Waits until every stream of the current device is idle, then raises what its kernels
// recorded without a wait (tensor/cuda_device_errors.h).
void synchronize();
// Waits until `s` is idle.
void synchronize(Stream s);
// Makes later work on `waiter` wait for what is queued on `waited` now (an event, no host wait).
void stream_wait(Stream waiter, Stream waited);

// How many times this process's host has waited for a GPU since it started: every copy to the
// host, synchronize(), read-back of a reduction or flag, blocking wait for a collective or for
// memory the allocator must reclaim (any thread, any GPU; 0 in a build without CUDA). Training
// puts the count of each step in its metrics ("host_waits"), which shows that the step waits
// a fixed number of times, not once per micro-batch or per tensor. Never throws.
uint64_t host_waits();
// Counts one such wait; for paratrain code that waits for a GPU outside the functions above.
void note_host_wait();

// Copies `bytes` between host memory and memory of a GPU (cuda_allocator.h's device_of() >= 0)
// on that GPU's compute stream, after the work queued there, and return once the copy has
// run: the host bytes are there, or the host buffer may be reused and the GPU's later work
// sees the bytes. Any thread; InputError when `gpu` is not GPU memory of this process.
void copy_to_host(void* host, const void* gpu, size_t bytes);
void copy_to_gpu(void* gpu, const void* host, size_t bytes);

struct DeviceProperties {
  std::string name;            // "NVIDIA H200"
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  int64_t total_memory = 0;    // bytes
  double bf16_peak_tflops = 0;  // dense bf16 tensor-core peak from the datasheet, 0 if unknown
};
DeviceProperties properties(int d = -1);

namespace detail {
// kernel_image_problem()'s text for cuda:d, a `name` of compute capability major.minor that
// cannot run code built for `built` (built_architectures()); `cause` the CUDA error, if any.
std::string no_kernel_image_message(int d, const std::string& name, int major, int minor, const std::string& built,
                                    const std::string& cause = "");
}  // namespace detail

}  // namespace paratrain::cuda
