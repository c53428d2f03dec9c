// Devices on every build: parsing "cpu" / "cuda:N", what a build or machine without a GPU
// says when asked for one, and the caching allocator's retry when its source runs out.
#include <gtest/gtest.h>

#include <new>

#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_allocator.h"
#include "paratrain/tensor/tensor.h"

using namespace paratrain;

TEST(DeviceSpec, ParsesCpuCudaAndIndexedCuda) {
  EXPECT_EQ(parse_device("cpu"), (DeviceSpec{Device::CPU, -1}));
  EXPECT_EQ(parse_device("cuda"), (DeviceSpec{Device::CUDA, -1}));
  EXPECT_EQ(parse_device("cuda:3"), (DeviceSpec{Device::CUDA, 3}));
  EXPECT_EQ(parse_device("cuda:3").str(), "cuda:3");
  EXPECT_EQ(parse_device("cuda").str(), "cuda");
  EXPECT_EQ(parse_device("cpu").str(), "cpu");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:x", "CUDA", "cuda:1:2", "cpu:0"})
    EXPECT_THROW(parse_device(bad), InputError) << bad;
}

TEST(DeviceSpec, CpuTensorsReportTheirDevice) {
  Tensor t = Tensor::zeros({2, 3});
  EXPECT_EQ(t.device_spec(), (DeviceSpec{Device::CPU, -1}));
  EXPECT_FALSE(t.is_cuda());
  EXPECT_FALSE(t.is_pinned());
  EXPECT_EQ(t.to_string(), "Tensor[f32 2x3 cpu]");
  EXPECT_TRUE(t.to(DeviceSpec{}).shares_storage(t));
}

TEST(DeviceSpec, NoGpuIsAClearInputError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "this machine has a GPU (tests/gpu covers it)";
  EXPECT_FALSE(cuda::unavailable_reason().empty());
  try {
    Tensor::empty({4}, DType::F32, Device::CUDA, 0);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cuda:0 is not available"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Tensor::zeros({4}).to(parse_device("cuda")), InputError);
  EXPECT_THROW(Tensor::empty_pinned({4}), InputError);
  EXPECT_THROW(cuda::set_device(0), InputError);
  EXPECT_EQ(cuda::device_of(nullptr), -1);
}

// Host memory is no GPU's: device_of() says so (without asking a driver before a GPU was
// used), and the byte copies to and from a GPU refuse it with an InputError naming it.
TEST(DeviceSpec, ByteCopiesRefuseHostMemoryAsTheGpuSide) {
  float host[4] = {1, 2, 3, 4}, other[4] = {};
  EXPECT_EQ(cuda::device_of(host), -1);
  for (bool down : {true, false}) {
    try {
      if (down) cuda::copy_to_host(other, host, sizeof host);
      else cuda::copy_to_gpu(host, other, sizeof host);
      FAIL() << "expected InputError";
    } catch (const InputError& e) {
      const std::string m = e.what();
      if (cuda::built())
        EXPECT_NE(m.find("is not GPU memory of this process"), std::string::npos) << m;
      else
        EXPECT_NE(m.find("has no CUDA support"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(other[0], 0.0f);
}

// A GPU that this build has no code for fails at its first use (require_device) with this
// text: the GPU, its compute capability, the build's architectures and the option that adds it.
TEST(KernelImage, MessageNamesTheGpuTheBuildsArchitecturesAndTheOptionThatAddsIt) {
  auto has = [](const std::string& m, const std::string& part) { return m.find(part) != std::string::npos; };
  const std::string a100 = cuda::detail::no_kernel_image_message(1, "NVIDIA A100-SXM4-80GB", 8, 0, "90",
                                                                  "cudaErrorNoKernelImageForDevice: no kernel image");
  EXPECT_TRUE(has(a100, "cuda:1 (NVIDIA A100-SXM4-80GB) is compute capability 8.0")) << a100;
  EXPECT_TRUE(has(a100, "has GPU code for CUDA architectures 90 only (cudaErrorNoKernelImageForDevice")) << a100;
  EXPECT_TRUE(has(a100, "-DCMAKE_CUDA_ARCHITECTURES=\"80;90\" (or 80 alone)")) << a100;
  // A list extends with ';' (CMake's separator), whatever the build's text used.
  const std::string l4 = cuda::detail::no_kernel_image_message(0, "NVIDIA L4", 8, 9, "75,90");
  EXPECT_TRUE(has(l4, "architectures 75,90 only: rebuild")) << l4;
  EXPECT_TRUE(has(l4, "-DCMAKE_CUDA_ARCHITECTURES=\"89;75;90\"")) << l4;
  // "native" cannot be extended: the GPU's own architecture alone.
  const std::string native = cuda::detail::no_kernel_image_message(0, "NVIDIA A10", 8, 6, "native");
  EXPECT_TRUE(has(native, "-DCMAKE_CUDA_ARCHITECTURES=86, or on this machine")) << native;
  // Older than Turing: no option helps.
  const std::string p100 = cuda::detail::no_kernel_image_message(0, "Tesla P100-PCIE-16GB", 6, 0, "90");
  EXPECT_TRUE(has(p100, "is compute capability 6.0, and paratrain's GPU code needs 7.5 (Turing) or newer")) << p100;
  EXPECT_FALSE(has(p100, "CMAKE_CUDA_ARCHITECTURES")) << p100;
}

// The build's architectures reach the program (cmake/cuda.cmake -> kernel_image.cu).
TEST(KernelImage, BuiltArchitecturesAreTheBuilds) {
  if (!cuda::built()) {
    EXPECT_EQ(cuda::built_architectures(), "");
    return;
  }
  const std::string a = cuda::built_architectures();
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a.find(';'), std::string::npos) << a;  // a list reaches the program as "80,90"
}

TEST(CachingAllocatorSource, ReturnsCachedBlocksAndRetriesWhenTheSourceIsOut) {
  // A source with room for two 1 KiB blocks.
  int live = 0, taken = 0, given_back = 0;
  CachingAllocator a(CachingAllocator::Source{
      [&](size_t bytes) -> void* {
        if (live == 2) throw std::bad_alloc();
        ++live;
        ++taken;
        return ::operator new(bytes);
      },
      [&](void* p, size_t) {
        --live;
        ++given_back;
        ::operator delete(p);
      }});
  void* p1 = a.allocate(1024);
  void* p2 = a.allocate(1024);
  a.deallocate(p2, 1024);  // cached in the 1 KiB class
  // A 2 KiB block does not fit: the allocator returns the cached 1 KiB block and retries.
  void* p3 = a.allocate(2048);
  EXPECT_EQ(taken, 3);
  EXPECT_EQ(given_back, 1);
  EXPECT_EQ(a.stats().bytes_reserved, 1024 + 2048);
  EXPECT_EQ(a.stats().bytes_in_use, 1024 + 2048);
  // With nothing cached the failure reaches the caller, and the accounting is unchanged.
  EXPECT_THROW(a.allocate(4096), std::bad_alloc);
  EXPECT_EQ(a.stats().bytes_in_use, 1024 + 2048);
  a.deallocate(p1, 1024);
  a.deallocate(p3, 2048);
  a.empty_cache();
  EXPECT_EQ(live, 0);
  EXPECT_EQ(a.stats().bytes_reserved, 0);
}
