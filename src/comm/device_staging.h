// GPU buffers on the host backends (shm, tcp, mpi): a group that stages them through host
// memory, so that every backend takes what nccl takes. This is how several ranks share one
// GPU (NCCL refuses two ranks of a communicator on one device: "Duplicate GPU detected") and
// how a GPU run works where NCCL does not.
//
// stage_device_buffers(group) wraps a host group. A call whose buffers are all host memory
// goes straight to it (the same Work, no copy). A call with GPU buffers:
//  - first completes the earlier staged collectives that write into its GPU buffers (their
//    copies up, in issue order): what nccl's stream order gives, e.g. allreduce(x) then
//    send(x) with no wait in between sends the sum;
//  - copies each buffer the call reads to a host buffer at once, after the work queued on its
//    GPU's compute stream (the call waits for the GPU: there is no overlap with compute);
//  - runs the host group's call on the host buffers;
//  - once that completes, copies what the call wrote back to the GPU (on the compute stream,
//    waited for) before the returned Work completes, so the caller's wait() or
//    wait_on_device() sees the result. A waiter whose host call is done does that copy
//    itself; otherwise the group's background thread does it when the host call finishes
//    (Work::on_finished wakes it; nothing polls), so wait(timeout) keeps its timeout.
// Send/recv keep their rules: a staged send never waits for its receiver.
// Failures of the host call are the Work's failures; a failed copy down throws from the call,
// a failed copy up is the Work's CudaError. The staging memory (page-locked on a GPU:
// cuda::pinned_allocator) is held until the host call has completed. Sub-groups (new_group)
// are staged the same way.
//
// DeviceMemory says which pointers are GPU memory and copies them; cuda_device_memory() is
// the real one: memory of a GPU this process has used through paratrain (cuda_allocator.h's
// device_of, after cuda::gpu_in_use()); managed memory counts as host memory. Tests pass a
// stand-in. Thread-safety: as ProcessGroup. Lifetime: destroying the group first completes
// every call it staged (each within its host call's deadline).
#pragma once

#include <functional>
#include <memory>

#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct DeviceMemory {
  std::function<bool(const void*)> holds;                      // p is GPU memory
  std::function<void(void*, const void*, size_t)> to_host;     // (host, gpu, bytes), returns when done
  std::function<void(void*, const void*, size_t)> to_device;   // (gpu, host, bytes), returns when done
  std::function<std::shared_ptr<void>(size_t)> host_buffer;    // staging memory of at least `bytes`
};

// The GPUs of this process (tensor/cuda.h); holds() is false for everything in a build
// without CUDA or before any GPU memory was taken.
DeviceMemory cuda_device_memory();

std::shared_ptr<ProcessGroup> stage_device_buffers(std::shared_ptr<ProcessGroup> host_group,
                                                   DeviceMemory memory = cuda_device_memory());

}  // namespace paratrain::comm
