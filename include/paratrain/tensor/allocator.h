// Caching allocators with byte accounting, one per device.
//
// A CachingAllocator hands out 64-byte-aligned blocks and keeps freed blocks in size-class
// free lists instead of returning them to the OS, so a training step that repeats the
// allocation pattern of the previous one takes no fresh memory from the OS (first touch of a
// page is expensive: ~11 us per 4 KiB on the VMs we test on). Blocks of 2 MiB and more are
// mapped with MADV_HUGEPAGE. It accounts current and peak bytes in use (rounded block sizes)
// and bytes reserved from the OS, per device. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "paratrain/tensor/device.h"

namespace paratrain {

struct AllocatorStats {
  int64_t bytes_in_use = 0;         // blocks handed out, rounded to their size class
  int64_t peak_bytes_in_use = 0;    // max of bytes_in_use since the last reset_peak()
  int64_t bytes_reserved = 0;       // in use + cached, i.e. taken from the OS
  int64_t peak_bytes_reserved = 0;
  int64_t os_allocations = 0;       // number of times memory was taken from the OS
  int64_t cache_hits = 0;           // allocations served from the cache
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t nbytes) = 0;
  // `nbytes` must be the size passed to allocate().
  virtual void deallocate(void* p, size_t nbytes) = 0;
  virtual AllocatorStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached blocks to the OS.
  virtual void empty_cache() = 0;
};

class CachingAllocator final : public Allocator {
 public:
  // Where blocks come from: `take(bytes)` returns fresh memory or throws std::bad_alloc;
  // `give_back(p, bytes)` returns it. An allocation whose take() fails returns the cached
  // blocks and tries once more before rethrowing. Both are called without the allocator's
  // lock held, so they may be called from several threads at once.
  struct Source {
    std::function<void*(size_t)> take;
    std::function<void(void*, size_t)> give_back;
  };
  // Memory from the OS (aligned_alloc; mmap with MADV_HUGEPAGE from 2 MiB).
  CachingAllocator();
  explicit CachingAllocator(Source source);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes) override;
  void deallocate(void* p, size_t nbytes) override;
  AllocatorStats stats() const override;
  void reset_peak() override;
  void empty_cache() override;

  // The block size a request of `nbytes` is rounded to (size classes 1/4 of a power of two apart).
  static size_t size_class(size_t nbytes);

 private:
  static void* os_alloc(size_t bytes);
  static void os_free(void* p, size_t bytes);
  // Empties the free lists (accounting included) for give_back_all() outside the lock.
  std::map<size_t, std::vector<void*>> take_cached_locked();
  void give_back_all(const std::map<size_t, std::vector<void*>>& cached);
  void count_in_use_locked(size_t block);

  Source source_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  AllocatorStats stats_;
};

// The process-wide allocator of a device: CPU, a CachingAllocator; CUDA, the caching
// allocator of GPU `index` (-1: the current device; tensor/cuda_allocator.h). InputError
// when the device is not there (no CUDA build, driver or GPU).
Allocator& allocator_for(Device d, int index = -1);

}  // namespace paratrain
