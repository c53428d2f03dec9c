// Linear layers as GEMM + bias, in both weight layouts paratrain meets: Hugging Face
// GPT-2's Conv1D (weight [in, out], y = x W + b) and torch.nn.Linear (weight [out, in],
// y = x W^T + b). Forward overwrites out; backward accumulates into dinp, dweight, dbias.
//
// Buffers are the caller's, row-major; nothing is kept after a call.
// Thread-safety: calls from different threads on distinct output buffers are safe (oneDNN's
// dnnl_sgemm keeps no state between calls); each call may itself run on the kernel thread
// pool (kernels::cpu::set_num_threads).
#pragma once

#include <cstdint>

namespace paratrain::kernels::cpu {

enum class WeightLayout : uint8_t {
  kInOut,  // weight (IN,OUT): Hugging Face Conv1D (GPT-2 c_attn, c_proj, c_fc)
  kOutIn,  // weight (OUT,IN): torch.nn.Linear
};

// out (N,OUT) = inp (N,IN) @ W + bias; bias (OUT) or nullptr
void linear_forward(float* out, const float* inp, const float* weight, const float* bias,
                    int64_t N, int64_t IN, int64_t OUT, WeightLayout layout);

// dinp (N,IN) += dout (N,OUT) @ W^T;  dweight += inp^T dout (in the weight's layout);
// dbias (OUT) += sum_n dout. Any of dinp, dweight, dbias may be nullptr (not wanted).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, int64_t N, int64_t IN, int64_t OUT,
                     WeightLayout layout);

}  // namespace paratrain::kernels::cpu
