// Ops of neural-network layers: layer norm, softmax, embeddings, attention, convolution and
// pooling (the losses are in losses.cpp). Each computes in the dtype of its (autocast-cast) inputs;
// statistics (LayerNorm mean/rstd, log-sum-exp, per-row losses) are f32.
#include "common.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;
using autograd::autocast_input;
using autograd::Node;

namespace {
void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }
}  // namespace

Tensor layer_norm(const Tensor& x_raw, const Tensor& w_raw, const Tensor& b_raw, float eps) {
  autograd::profiler::OpScope op_scope("layer_norm", false);
  const Tensor x_in = autocast_input("layer_norm", x_raw), w_in = autocast_input("layer_norm", w_raw),
               b_in = autocast_input("layer_norm", b_raw);
  Tensor x = float_contiguous(x_in, "layer_norm", "input");
  expect_same_dtype("layer_norm", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  expect_same_device("layer_norm", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  Tensor w, b;
  if (w_in.defined()) w = float_contiguous(w_in, "layer_norm", "weight");
  if (b_in.defined()) b = float_contiguous(b_in, "layer_norm", "bias");
  if ((w.defined() && w.numel() != C) || (b.defined() && b.numel() != C))
    PT_THROW(InputError, "layer_norm: weight/bias do not match the last dim ", C, " of ", shape_str(x.shape()));
  Tensor out = x.new_empty(x.shape()), mean = x.new_empty({N}, DType::F32), rstd = x.new_empty({N}, DType::F32);
  kernel(&Registry::layernorm_forward, x)(out.data_ptr(), mean.data<float>(), rstd.data<float>(), x.data_ptr(),
                                          ptr_or_null(w), ptr_or_null(b), N, C, eps);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    Tensor sx = x.detach(), sw = w.defined() ? w.detach() : Tensor();
    record_with_node("layer_norm", {&x_in, &w_in, &b_in}, {&out},
                     [sx, sw, mean, rstd, N, C](Node& node, std::vector<Tensor>& g) {
                       Tensor dout = g[0].contiguous();
                       Tensor dx, dw, db;
                       if (node.needs_input_grad(0)) dx = sx.new_zeros(sx.shape());
                       if (node.needs_input_grad(1)) dw = sx.new_zeros({C});
                       if (node.needs_input_grad(2)) db = sx.new_zeros({C});
                       kernel(&Registry::layernorm_backward, dout)(ptr_or_null(dx), ptr_or_null(dw), ptr_or_null(db),
                                                                   dout.data_ptr(), sx.data_ptr(), ptr_or_null(sw),
                                                                   mean.data<float>(), rstd.data<float>(), N, C);
                       return std::vector<Tensor>{dx, dw, db};
                     });
  }
  return out;
}

template <typename Fwd, typename Bwd>
static Tensor row_softmax(const char* name, const Tensor& x_raw, Fwd fwd, Bwd bwd) {
  const Tensor x_in = autocast_input(name, x_raw);
  Tensor x = float_contiguous(x_in, name, "input");
  expect_same_device(name, {{"input", &x_in}});
  const int64_t C = x.size(-1), N = x.numel() / std::max<int64_t>(C, 1);
  Tensor out = x.new_empty(x.shape());
  kernel(fwd, x)(out.data_ptr(), x.data_ptr(), N, C);
  if (autograd::any_requires_grad({&x_in})) {
    Tensor so = out.detach();
    record_lambda(name, {&x_in}, {&out}, [so, bwd, N, C](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dx = so.new_zeros(so.shape());
      kernel(bwd, dout)(dx.data_ptr(), dout.data_ptr(), so.data_ptr(), N, C);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor softmax(const Tensor& x) {
  autograd::profiler::OpScope op_scope("softmax", false);
  return row_softmax("softmax", x, &Registry::softmax_forward, &Registry::softmax_backward);
}
Tensor log_softmax(const Tensor& x) {
  autograd::profiler::OpScope op_scope("log_softmax", false);
  return row_softmax("log_softmax", x, &Registry::log_softmax_forward, &Registry::log_softmax_backward);
}

// Embeddings run in the dtype of their tables (f32 master weights: the residual stream
// starts in f32 under autocast too).
Tensor embedding(const Tensor& tokens_in, const Tensor& wte_in) {
  autograd::profiler::OpScope op_scope("embedding", false);
  expect_same_device("embedding", {{"weight", &wte_in}, {"tokens", &tokens_in}});
  Tensor tokens = i32_contiguous(tokens_in, "embedding", "tokens");
  Tensor wte = float_contiguous(wte_in, "embedding", "weight");
  if (wte.dim() != 2) PT_THROW(InputError, "embedding: weight must be 2-D, got ", shape_str(wte.shape()));
  const int64_t V = wte.size(0), C = wte.size(1), N = tokens.numel();
  Shape out_shape = tokens.shape();
  out_shape.push_back(C);
  Tensor out = wte.new_empty(out_shape);
  kernel(&Registry::embedding_forward, wte)(out.data_ptr(), tokens.data<int32_t>(), wte.data_ptr(), N, V, C);
  if (autograd::any_requires_grad({&wte_in})) {
    record_lambda("embedding", {&tokens_in, &wte_in}, {&out}, [tokens, V, C, N](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dwte = dout.new_zeros({V, C});
      kernel(&Registry::embedding_backward, dout)(dwte.data_ptr(), dout.data_ptr(), tokens.data<int32_t>(), N, V, C);
      return std::vector<Tensor>{Tensor(), dwte};
    });
  }
  return out;
}

Tensor gpt_embedding(const Tensor& tokens_in, const Tensor& wte_in, const Tensor& wpe_in) {
  autograd::profiler::OpScope op_scope("gpt_embedding", false);
  expect_same_device("gpt_embedding", {{"wte", &wte_in}, {"wpe", &wpe_in}, {"tokens", &tokens_in}});
  Tensor tokens = i32_contiguous(tokens_in, "gpt_embedding", "tokens");
  Tensor wte = float_contiguous(wte_in, "gpt_embedding", "wte");
  Tensor wpe = float_contiguous(wpe_in, "gpt_embedding", "wpe");
  expect_same_dtype("gpt_embedding", {{"wte", &wte_in}, {"wpe", &wpe_in}});
  if (tokens.dim() != 2) PT_THROW(InputError, "gpt_embedding: tokens must be (B,T), got ", shape_str(tokens.shape()));
  const int64_t B = tokens.size(0), T = tokens.size(1), V = wte.size(0), C = wte.size(1);
  if (wpe.size(1) != C || T > wpe.size(0))
    PT_THROW(InputError, "gpt_embedding: sequence length ", T, " exceeds the block size ", wpe.size(0));
  Tensor out = wte.new_empty({B, T, C});
  kernel(&Registry::encoder_forward, wte)(out.data_ptr(), tokens.data<int32_t>(), wte.data_ptr(), wpe.data_ptr(), B,
                                          T, V, C);
  if (autograd::any_requires_grad({&wte_in, &wpe_in})) {
    Shape wpe_shape = wpe.shape();
    record_with_node("gpt_embedding", {&tokens_in, &wte_in, &wpe_in}, {&out},
                     [tokens, wpe_shape, B, T, V, C](Node& node, std::vector<Tensor>& g) {
                       Tensor dout = g[0].contiguous();
                       Tensor dwte, dwpe;
                       if (node.needs_input_grad(1)) dwte = dout.new_zeros({V, C});
                       if (node.needs_input_grad(2)) dwpe = dout.new_zeros(wpe_shape);
                       kernel(&Registry::encoder_backward, dout)(ptr_or_null(dwte), ptr_or_null(dwpe), dout.data_ptr(),
                                                                 tokens.data<int32_t>(), B, T, V, C);
                       return std::vector<Tensor>{Tensor(), dwte, dwpe};
                     });
  }
  return out;
}

Tensor causal_self_attention(const Tensor& qkv_raw, int64_t n_head) {
  autograd::profiler::OpScope op_scope("causal_self_attention", false);
  const Tensor qkv_in = autocast_input("causal_self_attention", qkv_raw);
  Tensor qkv = float_contiguous(qkv_in, "causal_self_attention", "qkv");
  expect_same_device("causal_self_attention", {{"qkv", &qkv_in}});
  if (qkv.dim() != 3 || qkv.size(2) % 3 != 0)
    PT_THROW(InputError, "causal_self_attention: qkv must be (B,T,3C), got ", shape_str(qkv.shape()));
  const int64_t B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;
  if (n_head <= 0 || C % n_head != 0)
    PT_THROW(InputError, "causal_self_attention: width ", C, " is not divisible by ", n_head, " heads");
  Tensor out = qkv.new_empty({B, T, C}), lse = qkv.new_empty({B, n_head, T}, DType::F32);
  kernel(&Registry::attention_forward, qkv)(out.data_ptr(), lse.data<float>(), qkv.data_ptr(), B, T, C, n_head);
  if (autograd::any_requires_grad({&qkv_in})) {
    Tensor sq = qkv.detach(), so = out.detach();
    record_lambda("causal_self_attention", {&qkv_in}, {&out}, [sq, so, lse, B, T, C, n_head](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dqkv = sq.new_zeros(sq.shape());
      kernel(&Registry::attention_backward, dout)(dqkv.data_ptr(), dout.data_ptr(), sq.data_ptr(), so.data_ptr(),
                                                  lse.data<float>(), B, T, C, n_head);
      return std::vector<Tensor>{dqkv};
    });
  }
  return out;
}

Tensor conv2d(const Tensor& x_raw, const Tensor& w_raw, const Tensor& b_raw, int64_t stride, int64_t padding) {
  autograd::profiler::OpScope op_scope("conv2d", false);
  const Tensor x_in = autocast_input("conv2d", x_raw), w_in = autocast_input("conv2d", w_raw),
               b_in = autocast_input("conv2d", b_raw);
  Tensor x = float_contiguous(x_in, "conv2d", "input"), w = float_contiguous(w_in, "conv2d", "weight");
  expect_same_dtype("conv2d", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  expect_same_device("conv2d", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  if (x.dim() != 4 || w.dim() != 4 || w.size(1) != x.size(1) || w.size(2) != w.size(3))
    PT_THROW(InputError, "conv2d: input ", shape_str(x.shape()), " does not fit weight ", shape_str(w.shape()));
  Tensor b;
  if (b_in.defined()) b = float_contiguous(b_in, "conv2d", "bias");
  const int64_t N = x.size(0), Ci = x.size(1), H = x.size(2), W = x.size(3), Co = w.size(0), K = w.size(2);
  const int64_t Ho = k::conv2d_out_size(H, K, stride, padding), Wo = k::conv2d_out_size(W, K, stride, padding);
  Tensor out = x.new_empty({N, Co, Ho, Wo});
  kernel(&Registry::conv2d_forward, x)(out.data_ptr(), x.data_ptr(), w.data_ptr(), ptr_or_null(b), N, Ci, H, W, Co,
                                       K, stride, padding);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool has_bias = b.defined();
    record_with_node("conv2d", {&x_in, &w_in, &b_in}, {&out},
                     [sx, sw, has_bias, N, Ci, H, W, Co, K, stride, padding](Node& node, std::vector<Tensor>& g) {
                       Tensor dout = g[0].contiguous();
                       Tensor dx, dw, db;
                       if (node.needs_input_grad(0)) dx = sx.new_zeros(sx.shape());
                       if (node.needs_input_grad(1)) dw = sw.new_zeros(sw.shape());
                       if (has_bias && node.needs_input_grad(2)) db = sw.new_zeros({Co});
                       kernel(&Registry::conv2d_backward, dout)(ptr_or_null(dx), ptr_or_null(dw), ptr_or_null(db),
                                                                dout.data_ptr(), sx.data_ptr(), sw.data_ptr(), N, Ci,
                                                                H, W, Co, K, stride, padding);
                       return std::vector<Tensor>{dx, dw, db};
                     });
  }
  return out;
}

Tensor max_pool2d(const Tensor& x_in, int64_t size, int64_t stride, int64_t padding) {
  autograd::profiler::OpScope op_scope("max_pool2d", false);
  Tensor x = float_contiguous(x_in, "max_pool2d", "input");
  expect_same_device("max_pool2d", {{"input", &x_in}});
  if (x.dim() != 4) PT_THROW(InputError, "max_pool2d: input must be (N,C,H,W), got ", shape_str(x.shape()));
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t Ho = k::conv2d_out_size(H, size, stride, padding), Wo = k::conv2d_out_size(W, size, stride, padding);
  Tensor out = x.new_empty({N, C, Ho, Wo}), argmax = x.new_empty({N, C, Ho, Wo}, DType::I32);
  kernel(&Registry::maxpool2d_forward, x)(out.data_ptr(), argmax.data<int32_t>(), x.data_ptr(), N, C, H, W, size,
                                          stride, padding);
  if (autograd::any_requires_grad({&x_in})) {
    Shape in_shape = x.shape();
    const DType t = x.dtype();
    record_lambda("max_pool2d", {&x_in}, {&out}, [argmax, in_shape, t, N, C, H, W, Ho, Wo](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dx = dout.new_zeros(in_shape, t);
      kernel(&Registry::maxpool2d_backward, dout)(dx.data_ptr(), dout.data_ptr(), argmax.data<int32_t>(), N, C, H, W,
                                                  Ho, Wo);
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

}  // namespace paratrain::ops
