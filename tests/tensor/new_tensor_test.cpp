// Tensor::new_empty/new_zeros/new_full (fresh tensors on this tensor's device), Tensor::full
// on a DeviceSpec, and the in-place move (Storage::take_over, Tensor::move_to_) on the CPU.
// Their GPU side is in tests/gpu/train_on_gpu_test.cpp.
#include <gtest/gtest.h>

#include <cmath>

#include "paratrain/tensor/tensor.h"

using namespace paratrain;

TEST(NewTensor, NewEmptyZerosFullTakeShapeDtypeAndDeviceOfTheirTensor) {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}).transpose(0, 1);  // a non-contiguous view
  Tensor e = t.new_empty({4, 5});
  EXPECT_EQ(e.shape(), (Shape{4, 5}));
  EXPECT_EQ(e.dtype(), DType::F32);
  EXPECT_EQ(e.device_spec(), (DeviceSpec{Device::CPU, -1}));
  EXPECT_TRUE(e.is_contiguous());
  EXPECT_FALSE(e.shares_storage(t));
  EXPECT_EQ(t.new_empty({3}, DType::I32).dtype(), DType::I32);

  Tensor z = t.new_zeros({2, 2}, DType::BF16);
  EXPECT_EQ(z.dtype(), DType::BF16);
  EXPECT_EQ(z.to_vector(), (std::vector<float>{0, 0, 0, 0}));
  EXPECT_EQ(t.new_zeros({3}).to_vector(), (std::vector<float>{0, 0, 0}));

  Tensor f = t.new_full({3}, 2.5);
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.to_vector(), (std::vector<float>{2.5f, 2.5f, 2.5f}));
  Tensor h = t.new_full({2}, 1.0 / 3.0, DType::F16);
  EXPECT_EQ(h.dtype(), DType::F16);
  EXPECT_EQ(h.to_vector()[1], f16_to_f32(f32_to_f16(1.0f / 3.0f)));  // rounded once, as fill_ does
  Tensor s = t.new_full({}, -7.0, DType::I64);
  EXPECT_EQ(s.to_vector_i64(), (std::vector<int64_t>{-7}));

  // No autograd state travels: a fresh tensor is a leaf that requires nothing.
  Tensor p = Tensor::zeros({2});
  p.set_requires_grad(true);
  EXPECT_FALSE(p.new_zeros({2}).requires_grad());
}

TEST(NewTensor, FullOnADeviceSpecMatchesFullOnTheHost) {
  Tensor a = Tensor::full({2, 3}, 0.1, DType::BF16, DeviceSpec{});
  Tensor b = Tensor::full({2, 3}, 0.1, DType::BF16);
  EXPECT_EQ(a.device_spec(), (DeviceSpec{Device::CPU, -1}));
  EXPECT_EQ(a.to_vector(), b.to_vector());
}

TEST(NewTensor, MoveToCpuOfACpuTensorChangesNothing) {
  Tensor t = Tensor::from_vector({1, 2, 3, 4}, {2, 2});
  t.set_requires_grad(true);
  t.set_name("w");
  Tensor alias = t;
  const void* before = t.data_ptr();
  t.move_to_(DeviceSpec{});
  EXPECT_EQ(t.data_ptr(), before);
  EXPECT_TRUE(alias.shares_storage(t));
  EXPECT_EQ(alias.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_TRUE(t.requires_grad());
  EXPECT_EQ(t.name(), "w");
}

TEST(NewTensor, TakeOverGivesEveryViewOfAStorageTheNewMemory) {
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor view = t.narrow(1, 1, 2);  // offset 1, strides {3, 1}
  Tensor other = Tensor::from_vector({10, 20, 30, 40, 50, 60}, {6});
  const void* other_memory = other.data_ptr();
  t.storage()->take_over(*other.storage());
  EXPECT_EQ(t.data_ptr(), other_memory);
  EXPECT_EQ(t.to_vector(), (std::vector<float>{10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(view.to_vector(), (std::vector<float>{20, 30, 50, 60}));
  EXPECT_EQ(other.storage()->data(), nullptr);  // `from` is left pointing at nothing
  other = Tensor();                              // and frees nothing when it dies
  EXPECT_EQ(t.to_vector()[5], 60.0f);
}
