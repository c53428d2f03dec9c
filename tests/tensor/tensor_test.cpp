#include "paratrain/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "paratrain/tensor/random.h"

using namespace paratrain;

TEST(Tensor, FactoriesAndViews) {
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  EXPECT_EQ(t.numel(), 6);
  EXPECT_TRUE(t.is_contiguous());
  Tensor tt = t.transpose(0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_TRUE(tt.shares_storage(t));
  Tensor c = tt.contiguous();
  EXPECT_FALSE(c.shares_storage(t));
  EXPECT_EQ(c.view({6}).to_vector(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor n = t.narrow(1, 1, 2);
  EXPECT_EQ(n.to_vector(), (std::vector<float>{1, 2, 4, 5}));
  EXPECT_EQ(t.select(0, 1).to_vector(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(t.reshape({3, -1}).shape(), (Shape{3, 2}));
  EXPECT_THROW(t.view({4, 2}), InternalError);
  EXPECT_EQ(t.nbytes(), 24u);
  EXPECT_EQ(Tensor::full({}, 1.0f).nbytes(), 4u);  // a scalar holds one element
  EXPECT_EQ(Tensor().nbytes(), 0u);                // an undefined tensor holds nothing
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  Tensor t = Tensor::from_vector({1.0f, -2.5f, 3.140625f, 65280.0f}, {4});
  for (DType d : {DType::BF16, DType::F16, DType::F32}) {
    Tensor back = t.to(d).to(DType::F32);
    EXPECT_EQ(back.to_vector(), t.to_vector()) << dtype_name(d);
  }
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // ties to even
  Tensor i = t.to(DType::I64);
  EXPECT_EQ(i.to_vector_i64(), (std::vector<int64_t>{1, -2, 3, 65280}));
}

TEST(Allocator, SteadyStateReusesCachedBlocks) {
  Allocator& a = allocator_for(Device::CPU);
  auto step = [] {
    std::vector<Tensor> ts;
    for (int i = 1; i < 20; ++i) ts.push_back(Tensor::empty({i * 1000 + 7}));
    ts.push_back(Tensor::empty({3 << 20}));
  };
  step();
  auto before = a.stats();
  for (int i = 0; i < 5; ++i) step();
  auto after = a.stats();
  EXPECT_EQ(after.os_allocations, before.os_allocations);
  EXPECT_EQ(after.bytes_reserved, before.bytes_reserved);
  EXPECT_GT(after.cache_hits, before.cache_hits);
  EXPECT_GE(after.peak_bytes_in_use, 3 << 22);
}

TEST(Allocator, SizeClassesWasteAtMostAQuarter) {
  for (size_t n : {1ul, 63ul, 64ul, 65ul, 1000ul, 4097ul, 123457ul, 10000000ul}) {
    size_t c = CachingAllocator::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, std::max<size_t>(64, n + n / 4 + 64));
  }
}

TEST(Random, ReproducibleAndUnbiased) {
  Generator a(42), b(42);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  Tensor t = Tensor::empty({100000});
  Generator g(1);
  fill_normal(t, g, 0.0f, 2.0f);
  double s = 0, s2 = 0;
  for (float v : t.to_vector()) s += v, s2 += double(v) * v;
  EXPECT_NEAR(s / 1e5, 0.0, 0.03);
  EXPECT_NEAR(std::sqrt(s2 / 1e5), 2.0, 0.03);
}

// copy_ between strided views of one dtype (the tensor-parallel packs: permutes, selects and
// narrows with a dense innermost dimension) moves the bytes: every value, NaN payloads and -0
// included, lands where the element-by-element rule puts it; a copy between two views of one
// storage takes the general path.
TEST(Tensor, StridedCopiesOfOneDtypeMoveTheBytes) {
  Generator g(5);
  Tensor src = Tensor::empty({3, 4, 5});
  fill_normal(src, g, 0.0f, 1.0f);
  float* p = src.data<float>();
  uint32_t nan_bits = 0x7fc01234u;
  std::memcpy(&p[7], &nan_bits, 4);
  p[8] = -0.0f;
  for (DType dt : {DType::F32, DType::BF16, DType::I32}) {
    SCOPED_TRACE(dtype_name(dt));
    const Tensor s = dt == DType::F32 ? src : src.to(dt);
    // (3, 4, 5) -> (4, 3, 5), and back into a permuted destination.
    Tensor a = Tensor::empty({4, 3, 5}, dt);
    a.copy_(s.permute({1, 0, 2}));
    const size_t esz = dtype_size(dt);
    const auto* sb = static_cast<const char*>(s.data_ptr());
    const auto* ab = static_cast<const char*>(a.data_ptr());
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j)
        EXPECT_EQ(std::memcmp(ab + ((j * 3 + i) * 5) * esz, sb + ((i * 4 + j) * 5) * esz, 5 * esz), 0) << i << "," << j;
    Tensor b = Tensor::empty({3, 4, 5}, dt);
    b.permute({1, 0, 2}).copy_(a);
    EXPECT_EQ(std::memcmp(b.data_ptr(), s.data_ptr(), s.nbytes()), 0);
    // A select and a narrow of the last dimension.
    Tensor sel = Tensor::empty({3, 5}, dt);
    sel.copy_(s.select(1, 2));
    for (int64_t i = 0; i < 3; ++i)
      EXPECT_EQ(std::memcmp(static_cast<const char*>(sel.data_ptr()) + i * 5 * esz, sb + ((i * 4 + 2) * 5) * esz, 5 * esz), 0);
    Tensor nar = Tensor::empty({3, 4, 2}, dt);
    nar.copy_(s.narrow(2, 1, 2));
    for (int64_t r = 0; r < 12; ++r)
      EXPECT_EQ(std::memcmp(static_cast<const char*>(nar.data_ptr()) + r * 2 * esz, sb + (r * 5 + 1) * esz, 2 * esz), 0);
  }
  // Two views of one storage: the general path reads every element before writing any.
  Tensor t = Tensor::from_vector({0, 1, 2, 3, 4, 5}, {2, 3});
  t.narrow(1, 1, 2).copy_(t.narrow(1, 0, 2));
  EXPECT_EQ(t.to_vector(), (std::vector<float>{0, 0, 1, 3, 3, 4}));
}
