// The CUDA AdamW and SGD updates, f32 (kernels/cuda/basic.h; formulas in
// kernels/cpu/optim.h): the scalars derived on the host in double exactly as optim.cpp, the
// element math in f32 in optim.cpp's operation order with round-to-nearest intrinsics, so
// nvcc contracts nothing into an FMA. The CPU build (GCC, -march=native) does contract some
// of them, so an element may differ from the CPU's in its last bit.
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
