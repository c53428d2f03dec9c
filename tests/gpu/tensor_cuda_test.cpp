// cuda tensors: copies between host and GPU (pageable and pinned), between GPUs, strided and
// converting copies on a GPU (bit-identical to the CPU's), fills, and the per-GPU caching
// allocator's accounting, reuse, record_stream and out-of-memory message.
#include <cuda_runtime.h>

#include <algorithm>
#include <random>
#include <string>

#include "gpu/gpu_test_util.h"
#include "paratrain/tensor/cuda_allocator.h"
#include "paratrain/tensor/tensor.h"

using namespace paratrain;

namespace {
std::vector<float> random_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  v[0] = 1e30f;  // overflows f16
  if (n > 2) v[1] = -0.0f, v[2] = 1.0f + 1.0f / 256;  // a bf16 rounding tie
  return v;
}
std::vector<uint16_t> bits16(const Tensor& t) {
  Tensor c = t.is_cuda() ? t.to(DeviceSpec{}) : t;
  const uint16_t* p = c.contiguous().data<uint16_t>();
  return std::vector<uint16_t>(p, p + c.numel());
}
const DeviceSpec kGpu0{Device::CUDA, 0};
}  // namespace

// This build's code runs on every GPU here (require_device checks it on a device's first use),
// and the build's architectures name one this GPU runs: its own, an older one of its major
// version, or (PTX) any older one.
TEST(CudaTensor, ThisBuildHasCodeForEveryGpuHere) {
  PT_REQUIRE_GPU();
  const std::string built = cuda::built_architectures();
  for (int d = 0; d < cuda::device_count(); ++d) {
    EXPECT_EQ(cuda::kernel_image_problem(d), "") << "cuda:" << d;
    EXPECT_NO_THROW(cuda::require_device(d));
    const cuda::DeviceProperties p = cuda::properties(d);
    const int sm = p.sm_major * 10 + p.sm_minor;
    if (built.find_first_not_of("0123456789,") != std::string::npos) continue;  // "native", "all"
    bool runs = false;
    for (size_t i = 0; i < built.size();) {
      const size_t j = std::min(built.find(',', i), built.size());
      runs = runs || std::stoi(built.substr(i, j - i)) <= sm;
      i = j + 1;
    }
    EXPECT_TRUE(runs) << "cuda:" << d << " sm_" << sm << " and a build for " << built;
  }
}

TEST(CudaTensor, RoundTripsThroughTheGpu) {
  PT_REQUIRE_GPU();
  auto v = random_values(1000003, 1);
  Tensor h = Tensor::from_vector(v, {1000003});
  Tensor d = h.to(kGpu0);
  EXPECT_TRUE(d.is_cuda());
  EXPECT_EQ(d.device_index(), 0);
  EXPECT_EQ(d.to_string(), "Tensor[f32 1000003 cuda:0]");
  EXPECT_EQ(d.to_vector(), v);
  EXPECT_TRUE(d.to(kGpu0).shares_storage(d));
  Tensor one = Tensor::from_vector({42.5f}, {1}).to(kGpu0);
  EXPECT_EQ(one.item(), 42.5);
}

TEST(CudaTensor, PinnedCopiesMatchAndKeepTheirSourceAlive) {
  PT_REQUIRE_GPU();
  auto v = random_values(1 << 20, 2);
  Tensor d = Tensor::empty({1 << 20}, DType::F32, kGpu0);
  {
    Tensor pinned = Tensor::from_vector(v, {1 << 20}).pin_memory();
    EXPECT_TRUE(pinned.is_pinned());
    d.copy_(pinned);  // asynchronous; the pinned block is released after the copy ran
  }
  // A new pinned tensor must not reuse the block before the copy read it.
  Tensor other = Tensor::empty_pinned({1 << 20});
  other.fill_(-7.0);
  EXPECT_EQ(d.to_vector(), v);
}

TEST(CudaTensor, ConversionsOnTheGpuAreBitIdenticalToTheCpu) {
  PT_REQUIRE_GPU();
  auto v = random_values(4099, 3);
  Tensor h = Tensor::from_vector(v, {4099});
  Tensor d = h.to(kGpu0);
  for (DType t : {DType::BF16, DType::F16}) {
    EXPECT_EQ(bits16(d.to(t)), bits16(h.to(t))) << dtype_name(t);
    // and back to f32 on the GPU
    EXPECT_EQ(d.to(t).to(DType::F32).to_vector(), h.to(t).to(DType::F32).to_vector()) << dtype_name(t);
  }
  // host f32 -> device bf16 converts on the host, device -> host bf16 -> f32 on the host
  Tensor db = Tensor::empty({4099}, DType::BF16, kGpu0);
  db.copy_(h);
  EXPECT_EQ(bits16(db), bits16(h.to(DType::BF16)));
  Tensor hf = Tensor::empty({4099}, DType::F32);
  hf.copy_(db);
  EXPECT_EQ(hf.to_vector(), h.to(DType::BF16).to(DType::F32).to_vector());
  // integers
  std::vector<int64_t> ids = {0, 1, -5, (int64_t{1} << 53) + 1, 50256};
  Tensor hi = Tensor::from_vector_i64(ids, {5});
  EXPECT_EQ(hi.to(kGpu0).to_vector_i64(), ids);
}

TEST(CudaTensor, StridedCopiesOnTheGpuMatchTheCpu) {
  PT_REQUIRE_GPU();
  auto v = random_values(2 * 3 * 5 * 7, 4);
  Tensor h = Tensor::from_vector(v, {2, 3, 5, 7});
  Tensor d = h.to(kGpu0);
  Tensor hp = h.permute({3, 1, 0, 2});
  Tensor dp = d.permute({3, 1, 0, 2});
  EXPECT_FALSE(dp.is_contiguous());
  EXPECT_EQ(dp.contiguous().to_vector(), hp.contiguous().to_vector());
  EXPECT_EQ(dp.to_vector(), hp.to_vector());  // device -> host of a strided view
  // into a strided destination on the GPU, from the host and from the GPU
  Tensor dst = Tensor::zeros({7, 5}, DType::F32, kGpu0);
  Tensor col = dst.transpose(0, 1);  // (5, 7), strided
  Tensor src = h.select(0, 1).select(0, 2);  // (5, 7)
  col.copy_(src);
  EXPECT_EQ(dst.to_vector(), src.transpose(0, 1).contiguous().to_vector());
  Tensor dst2 = Tensor::zeros({7, 5}, DType::BF16, kGpu0);
  dst2.transpose(0, 1).copy_(src.to(kGpu0));
  EXPECT_EQ(bits16(dst2), bits16(src.transpose(0, 1).contiguous().to(DType::BF16)));
  // narrow views keep their offset
  EXPECT_EQ(d.narrow(2, 1, 3).to_vector(), h.narrow(2, 1, 3).to_vector());
}

TEST(CudaTensor, FillsAndZeros) {
  PT_REQUIRE_GPU();
  Tensor z = Tensor::zeros({3, 1000}, DType::F32, kGpu0);
  EXPECT_EQ(z.to_vector(), std::vector<float>(3000, 0.f));
  z.narrow(1, 10, 5).fill_(2.5);
  std::vector<float> want(3000, 0.f);
  for (int r = 0; r < 3; ++r)
    for (int c = 10; c < 15; ++c) want[r * 1000 + c] = 2.5f;
  EXPECT_EQ(z.to_vector(), want);
  Tensor b = Tensor::empty({17}, DType::BF16, kGpu0);
  b.fill_(1.0 / 3);
  Tensor hb = Tensor::empty({17}, DType::BF16);
  hb.fill_(1.0 / 3);
  EXPECT_EQ(bits16(b), bits16(hb));
}

TEST(CudaTensor, CopiesBetweenGpus) {
  PT_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << cuda::device_count();
  auto v = random_values(100000, 5);
  Tensor h = Tensor::from_vector(v, {100, 1000});
  Tensor d0 = h.to(kGpu0);
  Tensor d1 = d0.to(DeviceSpec{Device::CUDA, 1});
  EXPECT_EQ(d1.device_index(), 1);
  EXPECT_EQ(d1.to_vector(), v);
  Tensor t1 = Tensor::empty({1000, 100}, DType::BF16, Device::CUDA, 1);
  t1.copy_(d0.transpose(0, 1));
  EXPECT_EQ(bits16(t1), bits16(h.transpose(0, 1).contiguous().to(DType::BF16)));
}

TEST(CudaAllocator, AccountsAndReusesBlocksPerDevice) {
  PT_REQUIRE_GPU();
  Allocator& a = cuda::device_allocator(0);
  a.empty_cache();
  const AllocatorStats s0 = a.stats();
  void* first = nullptr;
  {
    Tensor t = Tensor::empty({1 << 20}, DType::F32, kGpu0);  // 4 MiB, a size class of its own
    first = t.data_ptr();
    EXPECT_EQ(cuda::device_of(first), 0);
    EXPECT_EQ(a.stats().bytes_in_use - s0.bytes_in_use, 4 << 20);
    EXPECT_GE(a.stats().peak_bytes_in_use, s0.bytes_in_use + (4 << 20));
  }
  EXPECT_EQ(a.stats().bytes_in_use, s0.bytes_in_use);
  EXPECT_EQ(a.stats().bytes_reserved - s0.bytes_reserved, 4 << 20);  // cached, not returned
  const int64_t hits = a.stats().cache_hits;
  Tensor again = Tensor::empty({1 << 20}, DType::F32, kGpu0);
  EXPECT_EQ(again.data_ptr(), first);  // the same block, no cudaMalloc
  EXPECT_EQ(a.stats().cache_hits, hits + 1);
  EXPECT_EQ(Tensor().device_spec().str(), "cpu");
}

TEST(CudaAllocator, RecordStreamDefersReuseUntilTheOtherStreamRan) {
  PT_REQUIRE_GPU();
  Allocator& a = cuda::device_allocator(0);
  cudaStream_t comm = static_cast<cudaStream_t>(cuda::comm_stream(0));
  void* p = a.allocate(8 << 20);
  // Keep the communication stream busy, mark the block as used there, and free it.
  volatile int* flag = nullptr;
  ASSERT_EQ(cudaHostAlloc((void**)&flag, sizeof(int), cudaHostAllocMapped), cudaSuccess);
  *flag = 0;
  // A host function blocks the stream until the test releases it.
  ASSERT_EQ(cudaLaunchHostFunc(comm, [](void* f) { while (!*static_cast<volatile int*>(f)) {} }, (void*)flag), cudaSuccess);
  cuda::record_stream(p, comm);
  a.deallocate(p, 8 << 20);
  void* q = a.allocate(8 << 20);
  EXPECT_NE(q, p);  // p waits for the communication stream
  *flag = 1;
  cuda::synchronize(comm);
  a.deallocate(q, 8 << 20);
  void* r1 = a.allocate(8 << 20);
  void* r2 = a.allocate(8 << 20);
  EXPECT_TRUE(r1 == p || r2 == p);  // reclaimed once the stream passed the free
  a.deallocate(r1, 8 << 20);
  a.deallocate(r2, 8 << 20);
  cudaFreeHost((void*)flag);
}

TEST(CudaAllocator, OutOfMemoryNamesTheDeviceAndTheFigures) {
  PT_REQUIRE_GPU();
  try {
    Tensor::empty({int64_t{1} << 46}, DType::F32, kGpu0);  // 256 TiB
    FAIL() << "expected CudaError";
  } catch (const cuda::CudaError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("out of memory on cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("reserved"), std::string::npos) << m;
  }
  Tensor ok = Tensor::zeros({16}, DType::F32, kGpu0);  // still usable afterwards
  EXPECT_EQ(ok.to_vector(), std::vector<float>(16, 0.f));
}
