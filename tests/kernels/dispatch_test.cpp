// The kernels' dispatch point: a kernel is found by (device, dtype), and a missing one is an
// error naming the kernel, the device and the dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/kernels/registry.h"
#include "support/error_of.h"
#include "paratrain/tensor/cuda.h"

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
    r.gemm.at(Device::CUDA, DType::I64);
    FAIL() << "no build registers an i64 GEMM";
  } catch (const kernels::NoKernelError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'gemm'"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda"), std::string::npos) << m;
    EXPECT_NE(m.find("i64"), std::string::npos) << m;
  }
  // It is an InputError: the CLI turns it into one line and exit 2.
  EXPECT_THROW(r.softmax_row_max.at(Device::CUDA, DType::F32), InputError);  // a CPU-only row primitive
  // With CUDA, the GPU kernels are in the same tables; without, none are.
  EXPECT_EQ(r.gemm.has(Device::CUDA, DType::BF16), cuda::built());
  EXPECT_EQ(r.attention_forward.has(Device::CUDA, DType::F32), cuda::built());
  EXPECT_EQ(r.conv2d_forward.has(Device::CUDA, DType::F32), cuda::built());
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

// Cross-entropy on half-type logits is the f32 kernel on the widened logits: the same losses
// and log-sum-exp to the bit, and the f32 gradient rounded once to the half type.
TEST(KernelDispatch, HalfCrossEntropyIsTheF32KernelOnWidenedLogits) {
  const Registry& r = kernels::registry();
  const int64_t N = 5, V = 37;
  std::vector<int32_t> targets = {0, 36, 5, kernels::cpu::kIgnoreIndex, 17};
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> logits(N * V), dlog(N * V);
    std::vector<float> wide(N * V);
    for (int64_t i = 0; i < N * V; ++i) {
      const float x = static_cast<float>((i * 7919) % 97) / 16.0f - 3.0f;  // exact in both types
      logits[i] = t == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      wide[i] = x;
    }
    std::vector<float> loss_h(N), lse_h(N), loss_f(N), lse_f(N), dl(N, 0.25f), dlog_f(N * V);
    r.crossentropy_forward.at(Device::CPU, t)(loss_h.data(), lse_h.data(), logits.data(), targets.data(), N, V, V);
    kernels::cpu::crossentropy_forward(loss_f.data(), lse_f.data(), wide.data(), targets.data(), N, V, V);
    EXPECT_EQ(loss_h, loss_f) << dtype_name(t);
    EXPECT_EQ(lse_h, lse_f) << dtype_name(t);
    r.crossentropy_backward.at(Device::CPU, t)(dlog.data(), dl.data(), logits.data(), lse_h.data(), targets.data(), N, V, V);
    kernels::cpu::crossentropy_backward(dlog_f.data(), dl.data(), wide.data(), lse_f.data(), targets.data(), N, V, V);
    for (int64_t i = 0; i < N * V; ++i)
      ASSERT_EQ(dlog[i], t == DType::BF16 ? f32_to_bf16(dlog_f[i]) : f32_to_f16(dlog_f[i])) << dtype_name(t) << " " << i;
  }
}

// The same with rows ld > V apart: the compact results, the padding columns untouched.
TEST(KernelDispatch, HalfCrossEntropyWithARowStride) {
  const Registry& r = kernels::registry();
  const int64_t N = 3, V = 37, ld = 64;
  std::vector<int32_t> targets = {36, kernels::cpu::kIgnoreIndex, 2};
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<uint16_t> compact(N * V), strided(N * ld, 0x7fc0);  // NaN padding: never read
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < V; ++c) {
        const float x = static_cast<float>((n * V + c) * 31 % 89) / 8.0f - 5.0f;
        compact[n * V + c] = strided[n * ld + c] = t == DType::BF16 ? f32_to_bf16(x) : f32_to_f16(x);
      }
    std::vector<float> loss_c(N), lse_c(N), loss_s(N), lse_s(N), dl = {0.5f, 0.5f, -2.0f};
    r.crossentropy_forward.at(Device::CPU, t)(loss_c.data(), lse_c.data(), compact.data(), targets.data(), N, V, V);
    r.crossentropy_forward.at(Device::CPU, t)(loss_s.data(), lse_s.data(), strided.data(), targets.data(), N, V, ld);
    EXPECT_EQ(loss_s, loss_c) << dtype_name(t);
    EXPECT_EQ(lse_s, lse_c) << dtype_name(t);
    std::vector<uint16_t> d_c(N * V), d_s(N * ld, 0x1234);
    r.crossentropy_backward.at(Device::CPU, t)(d_c.data(), dl.data(), compact.data(), lse_c.data(), targets.data(), N,
                                               V, V);
    r.crossentropy_backward.at(Device::CPU, t)(d_s.data(), dl.data(), strided.data(), lse_s.data(), targets.data(), N,
                                               V, ld);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < V; ++c) ASSERT_EQ(d_s[n * ld + c], d_c[n * V + c]) << dtype_name(t) << " " << n << "," << c;
      for (int64_t c = V; c < ld; ++c) ASSERT_EQ(d_s[n * ld + c], 0x1234) << dtype_name(t) << " padding " << n << "," << c;
    }
    // A row stride below V: each kernel names itself.
    const std::pair<const char*, std::function<void()>> short_rows[] = {
        {"crossentropy_forward", [&] {
           r.crossentropy_forward.at(Device::CPU, t)(loss_s.data(), lse_s.data(), strided.data(), targets.data(), N,
                                                     V, V - 1);
         }},
        {"crossentropy_backward", [&] {
           r.crossentropy_backward.at(Device::CPU, t)(d_s.data(), dl.data(), strided.data(), lse_s.data(),
                                                      targets.data(), N, V, V - 1);
         }}};
    for (const auto& [who, call] : short_rows) {
      const std::string message = paratrain::testing::error_of<InputError>(call);
      EXPECT_NE(message.find(std::string(who) + ": row stride ld=36 is below the row length V=37"), std::string::npos)
          << dtype_name(t) << ": " << message;
    }
  }
}

// The CPU's gemm_bias is its gemm, then its bias_add, bit for bit, in f32 and the half types
// (linear layers call it; the CUDA one is the bias epilogue: tests/gpu/basic_kernels_test).
TEST(KernelDispatch, CpuGemmBiasGeluIsTheGemmBiasThenTheGelu) {
  const Registry& r = kernels::registry();
  const int64_t M = 6, N = 8, K = 11;
  std::vector<float> A(M * K), B(K * N), bias(N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.37f * static_cast<float>(i));
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.71f * static_cast<float>(i));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.5f * static_cast<float>(i) - 2.0f;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (bool trans_b : {false, true}) {
      const Tensor a = Tensor::from_vector(A, {M, K}).to(t), b = Tensor::from_vector(B, {K, N}).to(t),
                   c = Tensor::from_vector(bias, {N}).to(t);
      Tensor pre = Tensor::empty({M, N}, t), out = Tensor::empty({M, N}, t), two_pre = Tensor::empty({M, N}, t),
             two_out = Tensor::empty({M, N}, t);
      r.gemm_bias_gelu.at(Device::CPU, t)(trans_b, M, N, K, a.data_ptr(), b.data_ptr(), c.data_ptr(), pre.data_ptr(),
                                          out.data_ptr());
      r.gemm_bias.at(Device::CPU, t)(trans_b, M, N, K, a.data_ptr(), b.data_ptr(), c.data_ptr(), two_pre.data_ptr());
      r.gelu_forward.at(Device::CPU, t)(two_out.data_ptr(), two_pre.data_ptr(), M * N);
      const std::vector<float> p = pre.to(DType::F32).to_vector(), o = out.to(DType::F32).to_vector(),
                               wp = two_pre.to(DType::F32).to_vector(), wo = two_out.to(DType::F32).to_vector();
      for (size_t i = 0; i < p.size(); ++i) {
        ASSERT_EQ(p[i], wp[i]) << dtype_name(t) << " trans_b " << trans_b << " pre " << i;
        ASSERT_EQ(o[i], wo[i]) << dtype_name(t) << " trans_b " << trans_b << " out " << i;
      }
      // the GELU is applied: out = pre * Phi(pre) (tanh form), not pre
      const double x = p[1], want = 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
      if (t == DType::F32) EXPECT_NEAR(o[1], want, 1e-5) << "trans_b " << trans_b;
      EXPECT_NE(o[1], p[1]);
    }
}

TEST(KernelDispatch, CpuGemmBiasIsTheGemmThenTheBiasAdd) {
  const Registry& r = kernels::registry();
  const int64_t M = 5, N = 7, K = 9;
  std::vector<float> A(M * K), B(K * N), bias(N);
  for (size_t i = 0; i < A.size(); ++i) A[i] = std::sin(0.3f * static_cast<float>(i));
  for (size_t i = 0; i < B.size(); ++i) B[i] = std::cos(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = 0.25f * static_cast<float>(i) - 1.0f;
  for (DType t : {DType::F32, DType::BF16, DType::F16})
    for (bool trans_b : {false, true}) {
      const Tensor a = Tensor::from_vector(A, {M, K}).to(t), b = Tensor::from_vector(B, {K, N}).to(t),
                   c = Tensor::from_vector(bias, {N}).to(t);
      Tensor fused = Tensor::empty({M, N}, t), two = Tensor::empty({M, N}, t);
      r.gemm_bias.at(Device::CPU, t)(trans_b, M, N, K, a.data_ptr(), b.data_ptr(), c.data_ptr(), fused.data_ptr());
      r.gemm.at(Device::CPU, t)(false, trans_b, M, N, K, 1.0f, a.data_ptr(), K, b.data_ptr(), trans_b ? K : N, 0.0f,
                                two.data_ptr(), N);
      r.bias_add.at(Device::CPU, t)(two.data_ptr(), c.data_ptr(), M, N);
      const std::vector<float> f = fused.to(DType::F32).to_vector(), w = two.to(DType::F32).to_vector();
      for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(f[i], w[i]) << dtype_name(t) << " trans_b " << trans_b << " " << i;
      // and not only the GEMM: the bias is in it
      const double g00 = f[0];
      double dot = 0;
      for (int64_t k = 0; k < K; ++k) dot += static_cast<double>(A[k]) * (trans_b ? B[k] : B[k * N]);
      if (t == DType::F32) EXPECT_NEAR(g00, dot + bias[0], 1e-4) << "trans_b " << trans_b;
    }
}
