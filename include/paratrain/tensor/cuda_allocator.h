// GPU memory: one caching allocator per GPU, and a caching allocator of pinned host memory.
//
// Device memory is stream-ordered, as in PyTorch: a block belongs to its device's compute
// stream (tensor/cuda.h), where every kernel and copy of the tensor layers runs, so a block
// freed on the host is reused at once by the next allocation: any work still queued on that
// stream uses it before the new owner does. A block that another stream also used (the
// communication stream of an all-reduce) is marked with record_stream(); when freed, it is
// reused only after what was queued on those streams at the time of the free has finished
// (an event per stream). Freed blocks are cached in the same size classes as the CPU's
// CachingAllocator and never returned to the driver unless empty_cache() is called or an
// allocation fails, which empties the cache and retries once before throwing CudaError
// ("out of memory on cuda:N: ... in use, ... reserved").
//
// Accounting (AllocatorStats, per device): bytes_in_use is what torch.cuda.memory_allocated
// reports (rounded to size classes), bytes_reserved what torch.cuda.memory_reserved does.
//
// Pinned host memory (cudaHostAlloc) lets host-to-device copies run asynchronously beside
// compute: the data loader's batches come from pinned_allocator().
//
// Thread-safety: every function may be called from any thread. Lifetime: the allocators
// live until the process exits (tensors in static objects may outlive any order).
#pragma once

#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/cuda.h"

namespace paratrain::cuda {

// The allocator of GPU d (-1: the current device); InputError when there is no such GPU.
Allocator& device_allocator(int d = -1);
// The GPU whose device memory `p` is (device_allocator()'s or another cudaMalloc of this
// process); -1 for host and managed memory. Always -1, without asking the driver, until
// gpu_in_use() (tensor/cuda.h): memory cudaMalloc'ed before paratrain used a GPU (set_device,
// a stream, an allocator) is not recognised.
int device_of(const void* p);
// The block holding `p` (from device_allocator()) is also used by stream `s`: when it is
// freed, it is reused only after the work queued on `s` at that time.
void record_stream(const void* p, Stream s);
// Pinned (page-locked) host memory, cached like the CPU allocator.
Allocator& pinned_allocator();

}  // namespace paratrain::cuda
