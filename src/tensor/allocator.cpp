#include "paratrain/tensor/allocator.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <new>
#include <string>

#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda_allocator.h"

namespace paratrain {

namespace {
constexpr size_t kMinBlock = 64;
constexpr size_t kHugeThreshold = size_t{2} << 20;
}  // namespace

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

CachingAllocator::CachingAllocator() : CachingAllocator(Source{&os_alloc, &os_free}) {}
CachingAllocator::CachingAllocator(Source source) : source_(std::move(source)) {}
CachingAllocator::~CachingAllocator() { empty_cache(); }

size_t CachingAllocator::size_class(size_t nbytes) {
  if (nbytes <= kMinBlock) return kMinBlock;
  // Round up to a multiple of a quarter of the enclosing power of two: waste <= 25%.
  size_t pow2 = std::bit_floor(nbytes);
  size_t quarter = std::max<size_t>(pow2 / 4, kMinBlock);
  return (nbytes + quarter - 1) / quarter * quarter;
}

void* CachingAllocator::os_alloc(size_t bytes) {
  if (bytes >= kHugeThreshold) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);
    return p;
  }
  void* p = std::aligned_alloc(kMinBlock, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void CachingAllocator::os_free(void* p, size_t bytes) {
  if (bytes >= kHugeThreshold)
    munmap(p, bytes);
  else
    std::free(p);
}

void* CachingAllocator::allocate(size_t nbytes) {
  const size_t block = size_class(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(block);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.cache_hits++;
      count_in_use_locked(block);
      return p;
    }
  }
  // Fresh memory, outside the lock (see give_back_all).
  void* p = nullptr;
  try {
    p = source_.take(block);
  } catch (const std::bad_alloc&) {
    std::map<size_t, std::vector<void*>> cached;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cached = take_cached_locked();
    }
    give_back_all(cached);
    p = source_.take(block);
  }
  std::lock_guard<std::mutex> lock(mu_);
  stats_.os_allocations++;
  stats_.bytes_reserved += static_cast<int64_t>(block);
  stats_.peak_bytes_reserved = std::max(stats_.peak_bytes_reserved, stats_.bytes_reserved);
  count_in_use_locked(block);
  return p;
}

void CachingAllocator::count_in_use_locked(size_t block) {
  stats_.bytes_in_use += static_cast<int64_t>(block);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
}

void CachingAllocator::deallocate(void* p, size_t nbytes) {
  if (p == nullptr) return;
  size_t block = size_class(nbytes);
  std::lock_guard<std::mutex> lock(mu_);
  free_[block].push_back(p);
  stats_.bytes_in_use -= static_cast<int64_t>(block);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_bytes_in_use = stats_.bytes_in_use;
  stats_.peak_bytes_reserved = stats_.bytes_reserved;
}

void CachingAllocator::empty_cache() {
  std::map<size_t, std::vector<void*>> cached;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cached = take_cached_locked();
  }
  give_back_all(cached);
}

std::map<size_t, std::vector<void*>> CachingAllocator::take_cached_locked() {
  std::map<size_t, std::vector<void*>> cached;
  cached.swap(free_);
  for (auto& [block, ptrs] : cached) stats_.bytes_reserved -= static_cast<int64_t>(block * ptrs.size());
  return cached;
}

// Outside the lock: a source's give_back may wait for work (cudaFreeHost for queued copies)
// that itself frees blocks into this allocator.
void CachingAllocator::give_back_all(const std::map<size_t, std::vector<void*>>& cached) {
  for (const auto& [block, ptrs] : cached)
    for (void* p : ptrs) source_.give_back(p, block);
}

Allocator& allocator_for(Device d, int index) {
  // Never destroyed: tensors in static objects may outlive any destruction order.
  static CachingAllocator* cpu = new CachingAllocator();
  if (d == Device::CPU) return *cpu;
  return cuda::device_allocator(index);
}

std::string DeviceSpec::str() const {
  if (kind == Device::CPU) return "cpu";
  return index < 0 ? "cuda" : "cuda:" + std::to_string(index);
}

DeviceSpec parse_device(const std::string& text) {
  if (text == "cpu") return {Device::CPU, -1};
  if (text == "cuda") return {Device::CUDA, -1};
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      text.find_first_not_of("0123456789", 5) == std::string::npos)
    return {Device::CUDA, std::stoi(text.substr(5))};
  PT_THROW(InputError, "device '", text, "': use cpu, cuda or cuda:N");
}

}  // namespace paratrain
