// The CUDA AdamW and SGD updates, f32 (kernels/cuda/basic.h; formulas in
// kernels/cpu/optim.h): the scalars derived on the host in double exactly as optim.cpp, the
// element math in f32 in optim.cpp's operation order with round-to-nearest intrinsics, so
// nvcc contracts nothing into an FMA. The CPU build (GCC, -march=native) does contract some
// of them, so an element may differ from the CPU's in its last bit.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/launch.h"

namespace paratrain::kernels::cuda {

void adamw_update(void* p_, const void* g_, void* m_, void* v_, int64_t n, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int64_t t) {
  detail::check_count(n, "adamw_update");
  if (t < 1) PT_THROW(InputError, "adamw_update: step must be >= 1, got ", t);
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const float decay = static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay);
  const float neg_step = -static_cast<float>(static_cast<double>(lr) / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  const float b1 = beta1, b2 = beta2;
  const float a1 = static_cast<float>(1.0 - static_cast<double>(beta1));
  const float a2 = static_cast<float>(1.0 - static_cast<double>(beta2));
  auto* p = static_cast<float*>(p_);
  auto* g = static_cast<const float*>(g_);
  auto* m = static_cast<float*>(m_);
  auto* v = static_cast<float*>(v_);
  detail::launch_each(n, "adamw_update", [=] __device__(int64_t i) {
    const float gi = g[i];
    const float pi = __fmul_rn(p[i], decay);
    const float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(a1, gi));
    const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(a2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(neg_step, mi), denom));
    m[i] = mi;
    v[i] = vi;
  });
}

namespace {

// The per-step scalars of AdamW, derived on the host in double exactly as adamw_update.
struct AdamWScalars {
  float neg_step, bc2_sqrt, b1, b2, a1, a2, eps;
};

AdamWScalars adamw_scalars(float lr, float beta1, float beta2, float eps, int64_t t) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  return {-static_cast<float>(static_cast<double>(lr) / bc1), static_cast<float>(std::sqrt(bc2)), beta1, beta2,
          static_cast<float>(1.0 - static_cast<double>(beta1)), static_cast<float>(1.0 - static_cast<double>(beta2)),
          eps};
}

// One launch's tensors, passed by value as the kernel's argument (CUDA allows 4 KB of
// arguments; 40 entries of 48 bytes stay well below).
constexpr int kMultiTensors = 40;
struct MultiTensorEntry {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float decay;  // 1 - lr * weight_decay, in double then rounded, as adamw_update
};
struct MultiTensorBatch {
  MultiTensorEntry t[kMultiTensors];
};

// blockIdx.y picks the tensor; the blocks of x stride over its elements. The element math
// is adamw_update's, operation for operation.
__global__ void adamw_multi_kernel(MultiTensorBatch batch, AdamWScalars s) {
  const MultiTensorEntry& e = batch.t[blockIdx.y];
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < e.n; i += step) {
    const float gi = e.g[i];
    const float pi = __fmul_rn(e.p[i], e.decay);
    const float mi = __fadd_rn(__fmul_rn(e.m[i], s.b1), __fmul_rn(s.a1, gi));
    const float vi = __fadd_rn(__fmul_rn(e.v[i], s.b2), __fmul_rn(__fmul_rn(s.a2, gi), gi));
    const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), s.bc2_sqrt), s.eps);
    e.p[i] = __fadd_rn(pi, __fdiv_rn(__fmul_rn(s.neg_step, mi), denom));
    e.m[i] = mi;
    e.v[i] = vi;
  }
}

}  // namespace

void adamw_update_multi(const cpu::AdamWTensor* list, int64_t count, float lr, float beta1, float beta2, float eps,
                        int64_t t) {
  if (count < 0) PT_THROW(InputError, "adamw_update_multi: negative tensor count ", count);
  if (t < 1) PT_THROW(InputError, "adamw_update_multi: step must be >= 1, got ", t);
  const AdamWScalars s = adamw_scalars(lr, beta1, beta2, eps, t);
  // Enough blocks of x to fill the GPU for the largest tensor of a launch; the others'
  // surplus blocks find nothing to do and end at once.
  constexpr int64_t kMaxBlocksX = 1024;
  MultiTensorBatch batch{};
  int filled = 0;
  int64_t largest = 0;
  auto launch = [&] {
    if (filled == 0) return;
    const dim3 grid(static_cast<unsigned>(std::min<int64_t>(detail::grid_for(largest), kMaxBlocksX)),
                    static_cast<unsigned>(filled));
    adamw_multi_kernel<<<grid, detail::kThreads, 0, detail::stream()>>>(batch, s);
    PT_CUDA_CHECK_LAUNCH();
    filled = 0;
    largest = 0;
  };
  for (int64_t k = 0; k < count; ++k) {
    const cpu::AdamWTensor& e = list[k];
    detail::check_count(e.n, "adamw_update_multi");
    if (e.n == 0) continue;
    batch.t[filled++] = {e.p, e.g, e.m, e.v, e.n,
                         static_cast<float>(1.0 - static_cast<double>(lr) * e.weight_decay)};
    largest = std::max(largest, e.n);
    if (filled == kMultiTensors) launch();
  }
  launch();
}

void sgd_update(void* p_, const void* g_, void* buf_, int64_t n, float lr, float momentum, float dampening,
                float weight_decay, bool nesterov, bool first_step) {
  detail::check_count(n, "sgd_update");
  if (momentum != 0.0f && buf_ == nullptr && n > 0) PT_THROW(InputError, "sgd_update: momentum needs a buffer");
  const float keep = static_cast<float>(1.0 - static_cast<double>(dampening));
  auto* p = static_cast<float*>(p_);
  auto* g = static_cast<const float*>(g_);
  auto* buf = static_cast<float*>(buf_);
  detail::launch_each(n, "sgd_update", [=] __device__(int64_t i) {
    float d = g[i];
    if (weight_decay != 0.0f) d = __fadd_rn(d, __fmul_rn(weight_decay, p[i]));
    if (momentum != 0.0f) {
      const float bi = first_step ? d : __fadd_rn(__fmul_rn(buf[i], momentum), __fmul_rn(keep, d));
      buf[i] = bi;
      d = nesterov ? __fadd_rn(d, __fmul_rn(momentum, bi)) : bi;
    }
    p[i] = __fadd_rn(p[i], __fmul_rn(-lr, d));
  });
}

}  // namespace paratrain::kernels::cuda
