// gpu_kernels_bench: paratrain's CUDA kernels on cuda:0, through the kernel dispatch as the
// layers call them, for gpt2-124m's shapes (B=8, T=1024, C=768, NH=12, V=50257): every
// GEMM of a block and the LM head in bf16 (A, B, C bf16; f32 accumulation) and f32, c_fc with
// its GELU fused and not, the
// bf16 peak (8192^3), causal attention forward + backward (the tables' form and every other one: flash in
// every dtype, tiles, GEMMs with bf16 products), the tied
// LM head with its loss (ops::linear_cross_entropy, and matmul then cross_entropy), LayerNorm. Prints one JSON line per kernel:
//   {"kernel": ..., "dtype": ..., "ms": ..., "tflops": ...}
// Timing: CUDA events around `iters` launches after 3 warm-up launches; the median of 5
// repetitions. bench/torch_gpu_kernels.py measures the same shapes in PyTorch;
// bench/gpu_check.sh prints the two side by side. Built only with CUDA (cmake/cuda.cmake).
//
// Usage: gpu_kernels_bench [--quick]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cuda/layers.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/kernels/attention_by_gemm.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/tensor.h"

using namespace paratrain;

namespace {

const Device kGpu = Device::CUDA;

Tensor random_on_gpu(const Shape& shape, DType dtype, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = d(rng);
  return Tensor::from_vector(v, shape).to(dtype).to(DeviceSpec{kGpu, 0});
}

// The flash kernels in the attention tables' signatures (the f32-arithmetic ones on the CUDA
// cores for f32, or for any dtype when `F32Arithmetic`; else the tensor-core ones); a shape they
// do not take is an error.
template <bool F32Arithmetic>
constexpr kernels::cuda::FlashKernels kFlashKernels =
    F32Arithmetic ? kernels::cuda::FlashKernels::kF32Arithmetic : kernels::cuda::FlashKernels::kTensorCores;
template <DType D, bool F32Arithmetic = D == DType::F32>
void flash_forward(void* o, void* l, const void* x, int64_t b, int64_t t, int64_t c, int64_t nh) {
  if (!kernels::cuda::attention_forward_flash(kFlashKernels<F32Arithmetic>, D, o, static_cast<float*>(l), x, b, t,
                                              c, nh))
    throw std::runtime_error("the flash forward does not take this shape on this GPU");
}
template <DType D, bool F32Arithmetic = D == DType::F32>
void flash_backward(void* d, const void* g, const void* x, const void* o, const void* l, int64_t b, int64_t t,
                    int64_t c, int64_t nh) {
  if (!kernels::cuda::attention_backward_flash(kFlashKernels<F32Arithmetic>, D, d, g, x, o,
                                               static_cast<const float*>(l), b, t, c, nh))
    throw std::runtime_error("the flash backward does not take this shape on this GPU");
}

// Median milliseconds of one call of f.
double time_ms(const std::function<void()>& f, int iters, int reps) {
  cudaStream_t s = static_cast<cudaStream_t>(cuda::compute_stream());
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  PT_CUDA_CHECK(cudaEventCreate(&a));
  PT_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    PT_CUDA_CHECK(cudaEventRecord(a, s));
    for (int i = 0; i < iters; ++i) f();
    PT_CUDA_CHECK(cudaEventRecord(b, s));
    PT_CUDA_CHECK(cudaEventSynchronize(b));
    float t = 0;
    PT_CUDA_CHECK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t / iters);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void report(const std::string& kernel, DType dt, double ms, double flops) {
  std::printf("{\"kernel\": \"%s\", \"dtype\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f}\n", kernel.c_str(),
              dtype_name(dt), ms, flops > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
  std::fflush(stdout);
}

struct Gemm {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
  int64_t lda = 0, ldc = 0;  // 0: dense (A's and C's rows as long as they are)
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  if (cuda::device_count() == 0) {
    std::fprintf(stderr, "gpu_kernels_bench: no CUDA GPU: %s\n", cuda::unavailable_reason().c_str());
    return 2;
  }
  try {
    cuda::set_device(0);
    const auto& reg = kernels::registry();
    const int iters = quick ? 3 : 20, reps = quick ? 2 : 5;
    const int64_t B = 8, T = 1024, C = 768, NH = 12, V = 50257, BT = B * T;
    // GEMMs: forward (x @ W), backward input (dy @ W^T) and weight (x^T @ dy) of c_attn and
    // c_fc, the LM head's three (logits = x W^T, dx = dlogits W, dW = dlogits^T x) with rows of
    // V = 50257 (as PyTorch runs them) and with ops::linear_cross_entropy's rows of
    // logits_row_stride(V) = 50304 (16-byte aligned), and the peak shape.
    const int64_t Vp = ops::logits_row_stride(V);
    const std::vector<Gemm> gemms = {
        {"peak 8192^3", false, false, 8192, 8192, 8192},
        {"c_attn fwd", false, false, BT, 3 * C, C},   {"c_attn bwd dx", false, true, BT, C, 3 * C},
        {"c_attn bwd dw", true, false, C, 3 * C, BT}, {"c_fc fwd", false, false, BT, 4 * C, C},
        {"c_proj(mlp) fwd", false, false, BT, C, 4 * C},
        {"lm_head fwd", false, true, BT, V, C}, {"lm_head bwd dx", false, false, BT, C, V},
        {"lm_head bwd dw", true, false, V, C, BT},
        {"lm_head fwd (rows 50304)", false, true, BT, V, C, 0, Vp},
        {"lm_head bwd dx (rows 50304)", false, false, BT, C, V, Vp, 0},
        {"lm_head bwd dw (rows 50304)", true, false, V, C, BT, Vp, 0}};
    for (DType dt : {DType::BF16, DType::F32}) {
      for (const Gemm& g : gemms) {
        if (dt == DType::F32 && g.M == 8192 && g.K == 8192 && quick) continue;
        const int64_t lda = g.lda ? g.lda : g.ta ? g.M : g.K, ldb = g.tb ? g.K : g.N, ldc = g.ldc ? g.ldc : g.N;
        Tensor a = random_on_gpu(g.ta ? Shape{g.K, lda} : Shape{g.M, lda}, dt, 1);
        Tensor b = random_on_gpu(g.tb ? Shape{g.N, g.K} : Shape{g.K, g.N}, dt, 2);
        Tensor c = Tensor::empty({g.M, ldc}, dt, kGpu, 0);
        auto fn = reg.gemm.at(kGpu, dt);
        double ms = time_ms([&] { fn(g.ta, g.tb, g.M, g.N, g.K, 1.f, a.data_ptr(), lda, b.data_ptr(), ldb, 0.f,
                                     c.data_ptr(), ldc); },
                            iters, reps);
        report(std::string("gemm ") + g.name, dt, ms, 2.0 * g.M * g.N * g.K);
      }
    }
    // c_fc with its bias and the GELU after it, as the MLP runs it: one GEMM with cuBLASLt's
    // GELU_AUX_BIAS epilogue (gemm_bias_gelu), beside the GEMM with the bias epilogue then the
    // gelu kernel: whether the fusion pays on this GPU.
    for (DType dt : {DType::BF16, DType::F32}) {
      Tensor x = random_on_gpu({BT, C}, dt, 8), w = random_on_gpu({C, 4 * C}, dt, 9, 0.02f);
      Tensor bias = random_on_gpu({4 * C}, dt, 10), pre = Tensor::empty({BT, 4 * C}, dt, kGpu, 0);
      Tensor out = Tensor::empty({BT, 4 * C}, dt, kGpu, 0);
      const double flops = 2.0 * BT * 4 * C * C;
      auto fused = reg.gemm_bias_gelu.at(kGpu, dt);
      report("c_fc+gelu fwd", dt, time_ms([&] {
        fused(false, BT, 4 * C, C, x.data_ptr(), w.data_ptr(), bias.data_ptr(), pre.data_ptr(), out.data_ptr());
      }, iters, reps), flops);
      auto gemm_bias = reg.gemm_bias.at(kGpu, dt);
      auto gelu = reg.gelu_forward.at(kGpu, dt);
      report("c_fc+gelu fwd (unfused)", dt, time_ms([&] {
        gemm_bias(false, BT, 4 * C, C, x.data_ptr(), w.data_ptr(), bias.data_ptr(), pre.data_ptr());
        gelu(out.data_ptr(), pre.data_ptr(), BT * 4 * C);
      }, iters, reps), flops);
    }
    for (DType dt : {DType::BF16, DType::F16, DType::F32}) {
      // Causal attention: 4*B*NH*T*T*hs flops forward (QK^T and PV, halved for the mask)
      // and 2.5x that backward, as FlashAttention counts them.
      Tensor qkv = random_on_gpu({B, T, 3 * C}, dt, 3);
      Tensor out = Tensor::empty({B, T, C}, dt, kGpu, 0);
      Tensor lse = Tensor::empty({B, NH, T}, DType::F32, kGpu, 0);
      Tensor dout = random_on_gpu({B, T, C}, dt, 4);
      Tensor dqkv = Tensor::zeros({B, T, 3 * C}, dt, kGpu, 0);
      const double fwd_flops = 4.0 * B * NH * T * T * (C / NH) / 2;
      // The tables' attention (PARATRAIN_CUDA_ATTENTION's form, batched f32 GEMMs by default),
      // then the others named, in the same run: side by side.
      const bool bf16 = dt == DType::BF16;
      using Fwd = decltype(reg.attention_forward.at(kGpu, dt));
      using Bwd = decltype(reg.attention_backward.at(kGpu, dt));
      std::vector<std::pair<std::string, std::pair<Fwd, Bwd>>> impls = {
          {"", {reg.attention_forward.at(kGpu, dt), reg.attention_backward.at(kGpu, dt)}}};
      if (bf16) {
        impls.push_back({" (gemm, bf16 products)",
                         {[](void* o, void* l, const void* x, int64_t b, int64_t t, int64_t c, int64_t nh) {
                            kernels::attention_by_gemm_forward<Device::CUDA, DType::BF16>(o, l, x, b, t, c, nh, 0, true);
                          },
                          [](void* d, const void* g, const void* x, const void* o, const void* l, int64_t b, int64_t t,
                             int64_t c, int64_t nh) {
                            kernels::attention_by_gemm_backward<Device::CUDA, DType::BF16>(d, g, x, o, l, b, t, c, nh, 0,
                                                                                         true);
                          }}});
      }
      // The flash kernels (kernels/cuda/layers.h); gpt2-124m's head size 64 is theirs.
      if (bf16) impls.push_back({" (flash)", {&flash_forward<DType::BF16>, &flash_backward<DType::BF16>}});
      if (dt == DType::F16) impls.push_back({" (flash)", {&flash_forward<DType::F16>, &flash_backward<DType::F16>}});
      if (dt == DType::F32) impls.push_back({" (flash)", {&flash_forward<DType::F32>, &flash_backward<DType::F32>}});
      // The f32-arithmetic flash kernels on 16-bit buffers (what tiles runs for head size 64).
      if (bf16)
        impls.push_back({" (flash, f32 arithmetic)",
                         {&flash_forward<DType::BF16, true>, &flash_backward<DType::BF16, true>}});
      if (dt == DType::F16)
        impls.push_back({" (flash, f32 arithmetic)",
                         {&flash_forward<DType::F16, true>, &flash_backward<DType::F16, true>}});
      for (const auto& [suffix, fns] : impls) {
        const auto fwd = fns.first;
        const auto bwd = fns.second;
        try {  // a form that fails is named, and the others still run
          double ms_f = time_ms([&] { fwd(out.data_ptr(), lse.data_ptr(), qkv.data_ptr(), B, T, C, NH); }, iters, reps);
          report("attention fwd" + suffix, dt, ms_f, fwd_flops);
          double ms_b = time_ms([&] {
            bwd(dqkv.data_ptr(), dout.data_ptr(), qkv.data_ptr(), out.data_ptr(), lse.data_ptr(), B, T, C, NH);
          }, iters, reps);
          report("attention bwd" + suffix, dt, ms_b, 2.5 * fwd_flops);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "gpu_kernels_bench: attention%s (%s): %s\n", suffix.c_str(), dtype_name(dt), e.what());
        }
      }
    }
    {
      // The tied LM head and its loss, forward and backward, as a bf16 GPT runs them:
      // ops::linear_cross_entropy (logits rows of 50304, 16-byte aligned) beside
      // cross_entropy(matmul(x, wte^T)) (rows of 50257: the path before it, and PyTorch's).
      // 3 GEMMs of 2 BT V C flops each; the cross-entropy passes are counted as time only.
      Tensor x = random_on_gpu({BT, C}, DType::BF16, 11), w = random_on_gpu({V, C}, DType::BF16, 12, 0.02f);
      std::vector<int32_t> ids(static_cast<size_t>(BT));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % V);
      const Tensor targets = Tensor::from_vector_i32(ids, {BT}).to(DeviceSpec{kGpu, 0});
      x.set_requires_grad(true);
      w.set_requires_grad(true);
      for (bool fused : {true, false}) {
        const double ms = time_ms([&] {
          const Tensor loss = fused ? ops::linear_cross_entropy(x, w, targets)
                                    : ops::cross_entropy(ops::matmul(x, w, /*trans_b=*/true), targets);
          autograd::backward(loss);
          x.set_grad(Tensor());
          w.set_grad(Tensor());
        }, iters, reps);
        report(fused ? "lm_head+loss fwd+bwd" : "lm_head+loss fwd+bwd (rows 50257)", DType::BF16, ms,
               3 * 2.0 * BT * V * C);
      }
    }
    {
      Tensor x = random_on_gpu({BT, C}, DType::F32, 5);
      Tensor w = random_on_gpu({C}, DType::F32, 6), bias = random_on_gpu({C}, DType::F32, 7);
      Tensor y = Tensor::empty({BT, C}, DType::F32, kGpu, 0);
      Tensor mean = Tensor::empty({BT}, DType::F32, kGpu, 0), rstd = Tensor::empty({BT}, DType::F32, kGpu, 0);
      auto ln = reg.layernorm_forward.at(kGpu, DType::F32);
      double ms = time_ms([&] {
        ln(y.data_ptr(), mean.data_ptr(), rstd.data_ptr(), x.data_ptr(), w.data_ptr(), bias.data_ptr(), BT, C, 1e-5f);
      }, iters, reps);
      report("layernorm fwd", DType::F32, ms, 0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_kernels_bench: %s\n", e.what());
    return 1;
  }
}
