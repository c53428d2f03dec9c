// The kernels' dispatch point: a kernel is found by (device, dtype), and a missing one is an
// error naming the kernel, the device and the dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "paratrain/kernels/registry.h"

using namespace paratrain;
using kernels::Registry;

TEST(KernelDispatch, FindsTheCpuF32KernelOfEveryTable) {
  const Registry& r = kernels::registry();
  float x[5] = {-2.0f, -0.5f, 0.0f, 0.5f, 3.0f}, viaTable[5], direct[5];
  r.gelu_forward.at(Device::CPU, DType::F32)(viaTable, x, 5);
  kernels::cpu::gelu_forward(direct, x, 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(viaTable[i], direct[i]) << i;
  // Tensor form: the tensor's device and dtype pick the kernel.
  Tensor t = Tensor::from_vector({1.0f, 2.0f, 3.0f}, {3});
  EXPECT_DOUBLE_EQ(kernels::kernel(&Registry::sum, t)(t.data_ptr(), 3), 6.0);
  EXPECT_TRUE(r.gemm.has(Device::CPU, DType::F32));
  EXPECT_TRUE(r.adamw_update.has(Device::CPU, DType::F32));
}

TEST(KernelDispatch, AMissingKernelNamesTheKernelDeviceAndDtype) {
  const Registry& r = kernels::registry();
  try {
    r.layernorm_forward.at(Device::CPU, DType::I64);
    FAIL() << "no i64 LayerNorm exists";
  } catch (const kernels::NoKernelError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("layernorm_forward"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("i64"), std::string::npos) << m;
  }
  try {
    r.gemm.at(Device::CUDA, DType::BF16);
    FAIL() << "this build registers no CUDA kernels";
  } catch (const kernels::NoKernelError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'gemm'"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda"), std::string::npos) << m;
    EXPECT_NE(m.find("bf16"), std::string::npos) << m;
  }
  // It is an InputError: the CLI turns it into one line and exit 2.
  EXPECT_THROW(r.gelu_forward.at(Device::CUDA, DType::F32), InputError);
}

TEST(KernelDispatch, CastsAreKeyedByTheHalfType) {
  const Registry& r = kernels::registry();
  const float in[4] = {1.0f, -2.5f, 3.140625f, 65504.0f};
  uint16_t half[4];
  float back[4];
  for (DType t : {DType::BF16, DType::F16}) {
    r.cast_from_f32.at(Device::CPU, t)(half, in, 4);
    r.cast_to_f32.at(Device::CPU, t)(back, half, 4);
    for (int i = 0; i < 4; ++i) {
      const float expect = t == DType::BF16 ? bf16_to_f32(f32_to_bf16(in[i])) : f16_to_f32(f32_to_f16(in[i]));
      EXPECT_EQ(back[i], expect) << dtype_name(t) << " " << in[i];
    }
  }
  EXPECT_EQ(half[3], f32_to_f16(65504.0f));  // the last pass was f16: its largest finite value
}
