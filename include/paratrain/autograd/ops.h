// Differentiable operations on Tensors (the functional API the nn layer is built from).
//
// Each op computes its result with the kernel the dispatch point has for its inputs'
// (device, dtype) and, when grad mode is on and an input requires a gradient, records a Node
// whose backward produces the input gradients, each in its input's dtype. Floating inputs
// are f32, bf16 or f16 (token ids and labels are i32); an op's inputs share one dtype, except
// add/sub/mul, which compute in the widest (f32 + bf16 -> f32). Under an AutocastGuard
// (autograd/autocast.h) each op first casts its inputs to the precision of the policy table.
// A dtype the op has no kernel for is a NoKernelError naming it. Outputs are fresh contiguous
// tensors unless the op is a view (reshape). Shapes are checked: a mismatch throws
// InputError naming the op and both shapes.
//
// The functions keep no state of their own (kernels use per-thread scratch). Their results
// own fresh storage, except views, which share their input's storage and keep it alive;
// recorded Nodes keep the tensors their backward needs alive until the graph is released.
// Thread-safety: ops may run on several threads at once on distinct tensors (grad mode and
// autocast are per thread, like their guards); a tensor being written (Tensor::copy_, a
// backward accumulating into .grad) must not be used by another thread meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "paratrain/tensor/random.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::ops {

// ---- elementwise (same shapes) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& a, float s);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x);  // tanh form
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);

// ---- reductions to a one-element tensor ----
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// ---- dtypes ----
// x converted to `dtype` (x itself when it already is); the gradient comes back in x's dtype.
Tensor to_dtype(const Tensor& x, DType dtype);

// ---- shapes ----
// A view with a new shape (a copy first when x is not contiguous); gradient reshaped back.
Tensor reshape(const Tensor& x, const Shape& shape);

// ---- linear algebra ----
// a (..., K) @ b: b (K, N), or (N, K) when trans_b. Leading dims of a are flattened.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_b = false);
// Batched: a (Bt, M, K) @ b (Bt, K, N) -> (Bt, M, N)
Tensor bmm(const Tensor& a, const Tensor& b);
// x (..., in) -> (..., out). weight is (in, out) when in_out_layout (Hugging Face Conv1D, GPT)
// and (out, in) otherwise (torch.nn.Linear). bias (out) may be undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, bool in_out_layout);
// gelu(linear(x, weight, bias)) (tanh form), the bias required: the same values as the two
// ops (bit for bit on the CPU), in one kernel where the device fuses the GELU into the GEMM
// (CUDA: cuBLASLt's GELU_AUX_BIAS epilogue); saves the pre-activation for the backward.
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, bool in_out_layout);
// x (..., N) + bias (N) on every row: the bias step of linear on its own (a row-parallel
// layer adds its bias after the reduction). Same arithmetic as linear's bias epilogue.
Tensor add_bias(const Tensor& x, const Tensor& bias);

// ---- normalisation, activations over rows ----
// x (..., C), weight (C), bias (C): LayerNorm over the last dim, biased variance.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
Tensor softmax(const Tensor& x);      // over the last dim
Tensor log_softmax(const Tensor& x);  // over the last dim

// ---- embeddings ----
// tokens (B,T) i32, wte (V,C) -> (B,T,C)
Tensor embedding(const Tensor& tokens, const Tensor& wte);
// GPT input: wte[tokens] + wpe[0..T), tokens (B,T) i32, wte (V,C), wpe (Tmax,C) -> (B,T,C)
Tensor gpt_embedding(const Tensor& tokens, const Tensor& wte, const Tensor& wpe);

// ---- attention ----
// qkv (B,T,3C) packed as GPT-2's c_attn output -> (B,T,C), causal, n_head heads.
Tensor causal_self_attention(const Tensor& qkv, int64_t n_head);

// ---- losses ----
// logits (..., V), targets (...) i32 (-1 = ignore) -> mean cross-entropy over the
// non-ignored positions, a one-element tensor. Fused log-softmax + NLL.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// cross_entropy(matmul(x, weight, /*trans_b=*/true), targets) in one op: a tied LM head and its
// loss, x (..., C), weight (V, C) (the embedding's), targets (...) i32. The same values (bit for
// bit on the CPU), with the logits held inside the op only, in rows of logits_row_stride(V)
// elements: cuBLASLt runs its fast kernels only on 16-byte aligned rows, which GPT-2's
// V = 50257 is not (its lm_head GEMMs were 7x slower on an H200). x and weight follow
// matmul's autocast policy (the logits in the half type), the loss is f32.
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets);
// The row stride, in elements, of linear_loss's logits: V rounded up to a multiple of 64.
int64_t logits_row_stride(int64_t V);
// A loss of logits = x @ weight^T computed by linear_loss, which holds the logits. forward gets
// them (N rows of V columns, ld = logits_row_stride(V) apart, in x's compute dtype) and returns
// the loss (a tensor of its own, no autograd history) and the tensors its backward keeps;
// backward gets the loss's gradient, the logits and those, and returns dlogits (N, ld) in the
// logits' dtype, columns [V, ld) never read. Copied into the graph: what the functions
// capture lives as long as it.
struct LogitsLoss {
  const char* name = "linear_loss";  // the op's name (graph node, profiler, errors): a literal
  std::function<std::pair<Tensor, std::vector<Tensor>>(const Tensor& logits, int64_t N, int64_t V, int64_t ld)>
      forward;
  std::function<Tensor(const Tensor& g, const Tensor& logits, const std::vector<Tensor>& kept, int64_t N, int64_t V,
                       int64_t ld)>
      backward;
};
// loss(x (..., C) @ weight (V, C)^T) in one op (linear_cross_entropy; tensor parallelism's
// vocab-parallel loss): the logits' GEMM and the two gradient GEMMs (dx = dlogits weight,
// dweight = dlogits^T x) read and write the aligned rows. x and weight follow matmul's autocast
// policy. InputError for shapes that do not fit or V = 0.
Tensor linear_loss(const Tensor& x, const Tensor& weight, const LogitsLoss& loss);

// ---- images ----
// x (N,Ci,H,W), weight (Co,Ci,K,K), bias (Co) or undefined -> (N,Co,Ho,Wo)
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding);
// x (N,C,H,W) -> (N,C,Ho,Wo)
Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding = 0);

// ---- regularisation ----
// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when
// !training or p == 0. The mask comes from `gen`.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

}  // namespace paratrain::ops
