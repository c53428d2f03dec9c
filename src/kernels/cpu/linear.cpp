// Linear layers: one GEMM each for the forward, dinp and dweight, then the bias pass.
#include "paratrain/kernels/cpu/linear.h"

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/elementwise.h"
#include "paratrain/kernels/cpu/gemm.h"

namespace paratrain::kernels::cpu {

void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t IN, int64_t OUT, WeightLayout layout) {
  if (N < 0 || IN <= 0 || OUT <= 0)
    PT_THROW(InputError, "linear_forward: bad sizes N=", N, " IN=", IN, " OUT=", OUT);
  if (layout == WeightLayout::kInOut)
    gemm(false, false, N, OUT, IN, 1.0f, inp, IN, weight, OUT, 0.0f, out, OUT);
  else
    gemm(false, true, N, OUT, IN, 1.0f, inp, IN, weight, IN, 0.0f, out, OUT);
  if (bias) bias_add(out, bias, N, OUT);
}

void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t IN, int64_t OUT,
                     WeightLayout layout) {
  if (N < 0 || IN <= 0 || OUT <= 0)
    PT_THROW(InputError, "linear_backward: bad sizes N=", N, " IN=", IN, " OUT=", OUT);
  const bool in_out = layout == WeightLayout::kInOut;
  if (dinp) {
    if (in_out)
      gemm(false, true, N, IN, OUT, 1.0f, dout, OUT, weight, OUT, 1.0f, dinp, IN);
    else
      gemm(false, false, N, IN, OUT, 1.0f, dout, OUT, weight, IN, 1.0f, dinp, IN);
  }
  if (dweight) {
    if (in_out)
      gemm(true, false, IN, OUT, N, 1.0f, inp, IN, dout, OUT, 1.0f, dweight, OUT);
    else
      gemm(true, false, OUT, IN, N, 1.0f, dout, OUT, inp, IN, 1.0f, dweight, IN);
  }
  if (dbias) bias_backward(dbias, dout, N, OUT);
}

}  // namespace paratrain::kernels::cpu
