// Fused optimizer updates over flat f32 arrays, bit-for-bit the formulas of torch.optim
// (REFERENCE.md), computed in f32 like PyTorch's single-tensor (foreach=False) path.
//
// p (n) parameters, updated in place; g (n) gradients (read only); state arrays updated in
// place. Threaded over n.
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

// torch.optim.AdamW, step t = 1, 2, ... (t counts this step):
//   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// m (n), v (n) start at zero.
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int64_t t);

// One tensor of a multi-tensor AdamW update: its arrays (n elements each) and weight decay.
struct AdamWTensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;
  float weight_decay;
};

// adamw_update of every tensor of `list` (`count` entries) with one lr, betas, eps and step:
// bit for bit the single-tensor calls in list order (torch's foreach path computes the same
// values). On a GPU it is a few launches for all of them instead of one per tensor.
void adamw_update_multi(const AdamWTensor* list, int64_t count, float lr, float beta1, float beta2, float eps,
                        int64_t t);

// torch.optim.SGD:
//   d = g + wd*p
//   if momentum != 0: buf = first_step ? d : momentum*buf + (1-dampening)*d
//                     d = nesterov ? d + momentum*buf : buf
//   p -= lr * d
// buf (n) may be nullptr when momentum == 0. first_step: the buffer does not exist yet
// (torch initialises it to d, without dampening).
void sgd_update(float* p, const float* g, float* buf, int64_t n, float lr, float momentum,
                float dampening, float weight_decay, bool nesterov, bool first_step);

}  // namespace paratrain::kernels::cpu
