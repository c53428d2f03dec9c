// For tests/gpu: PT_REQUIRE_GPU() skips the test with "no CUDA GPU: <why>" where this process
// sees no GPU (ctest reports it skipped); elsewhere the test runs on cuda:0. test::DevBuf: a
// raw device buffer for the kernel tests. test::one_rank_nccl(): a one-rank nccl group on the
// current GPU (the data-parallel wrappers' device-side tests).
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"

#define PT_REQUIRE_GPU()                                                              \
  do {                                                                                \
    if (::paratrain::cuda::device_count() == 0)                                       \
      GTEST_SKIP() << "no CUDA GPU: " << ::paratrain::cuda::unavailable_reason();     \
    ::paratrain::cuda::set_device(0);                                                 \
  } while (0)

// For a test of two ranks on GPUs (one each where the machine has two, else both on cuda:0):
// skips where they would share cuda:0 and its compute mode takes one process only.
#define PT_REQUIRE_TWO_RANKS()                                                                             \
  do {                                                                                                     \
    int mode = cudaComputeModeDefault;                                                                     \
    PT_CUDA_CHECK(cudaDeviceGetAttribute(&mode, cudaDevAttrComputeMode, 0));                               \
    if (::paratrain::cuda::device_count() < 2 && mode != cudaComputeModeDefault)                           \
      GTEST_SKIP() << "two ranks would share cuda:0, whose compute mode (" << mode << ") takes one process"; \
  } while (0)

namespace paratrain::test {

// The `paratrain` flags that put two ranks on GPUs: a GPU each over nccl where the machine has
// two, else both on cuda:0 over shm, which stages the GPU buffers through host memory
// (comm/device_staging.h; NCCL refuses two ranks on one GPU). Either way every tensor of the
// run is on a GPU.
inline std::string two_ranks_on_gpus() {
  return ::paratrain::cuda::device_count() >= 2 ? " --device cuda" : " --device cuda:0 --backend shm";
}

// A raw device buffer of `bytes` on the current GPU, optionally filled from a host vector;
// get<V>() waits for the device and copies it back.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t b) : bytes(b) {
    if (bytes) PT_CUDA_CHECK(cudaMalloc(&p, bytes));
  }
  template <typename V>
  explicit DevBuf(const std::vector<V>& host) : DevBuf(host.size() * sizeof(V)) {
    if (bytes) PT_CUDA_CHECK(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  template <typename V>
  std::vector<V> get() const {
    PT_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<V> host(bytes / sizeof(V));
    if (bytes) PT_CUDA_CHECK(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost));
    return host;
  }
};

inline std::shared_ptr<comm::ProcessGroup> one_rank_nccl() {
  comm::ProcessGroupOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  return comm::create_process_group(std::make_shared<comm::HashStore>(), 0, 1, o);
}

}  // namespace paratrain::test
