// matmul, bmm and linear (GEMM through the kernels layer).
#include "common.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;

namespace {
Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

using GemmFn = decltype(Registry::gemm)::Fn;

// out (M,N) = a (M,K) @ op(b), op(b) = b (K,N) or b^T with b (N,K).
void forward_gemm(GemmFn gemm, float* out, const float* a, const float* b, int64_t M, int64_t N, int64_t K,
                  bool trans_b) {
  gemm(false, trans_b, M, N, K, 1.0f, a, K, b, trans_b ? K : N, 0.0f, out, N);
}

// Gradients of out = a @ op(b): da (M,K), db shaped like b.
void backward_gemm(GemmFn gemm, float* da, float* db, const float* dout, const float* a, const float* b, int64_t M,
                   int64_t N, int64_t K, bool trans_b) {
  if (da) {
    if (trans_b)  // b (N,K): da = dout @ b
      gemm(false, false, M, K, N, 1.0f, dout, N, b, K, 0.0f, da, K);
    else  // b (K,N): da = dout @ b^T
      gemm(false, true, M, K, N, 1.0f, dout, N, b, N, 0.0f, da, K);
  }
  if (db) {
    if (trans_b)  // db (N,K) = dout^T @ a
      gemm(true, false, N, K, M, 1.0f, dout, N, a, K, 0.0f, db, K);
    else  // db (K,N) = a^T @ dout
      gemm(true, false, K, N, M, 1.0f, a, K, dout, N, 0.0f, db, N);
  }
}
}  // namespace

Tensor linear(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool in_out_layout) {
  autograd::profiler::OpScope op_scope("linear", false);
  Tensor x = f32_contiguous(x_in, "linear", "input");
  Tensor w = f32_contiguous(w_in, "linear", "weight");
  if (w.dim() != 2 || x.dim() < 1) PT_THROW(InputError, "linear: weight must be 2-D, got ", shape_str(w.shape()));
  const bool trans_b = !in_out_layout;
  const int64_t K = x.size(-1);
  const int64_t in_dim = in_out_layout ? w.size(0) : w.size(1);
  const int64_t N = in_out_layout ? w.size(1) : w.size(0);
  if (in_dim != K)
    PT_THROW(InputError, "linear: input ", shape_str(x.shape()), " does not fit weight ", shape_str(w.shape()));
  const int64_t M = x.numel() / std::max<int64_t>(K, 1);
  Tensor b;
  if (b_in.defined()) {
    b = f32_contiguous(b_in, "linear", "bias");
    if (b.numel() != N) PT_THROW(InputError, "linear: bias ", shape_str(b.shape()), " for ", N, " outputs");
  }
  Tensor out = Tensor::empty(with_last(x.shape(), N));
  forward_gemm(kernel(&Registry::gemm, x), out.data<float>(), x.data<float>(), w.data<float>(), M, N, K, trans_b);
  if (b.defined()) kernel(&Registry::bias_add, out)(out.data<float>(), b.data<float>(), M, N);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool has_bias = b.defined();
    auto node = std::make_shared<autograd::LambdaNode>("linear", nullptr);
    autograd::record(node, {&x_in, &w_in, &b_in}, {&out});
    autograd::Node* raw = node.get();
    node->set_fn([sx, sw, has_bias, M, N, K, trans_b, raw](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dx, dw, db;
      if (raw->needs_input_grad(0)) dx = Tensor::empty(sx.shape());
      if (raw->needs_input_grad(1)) dw = Tensor::empty(sw.shape());
      backward_gemm(kernel(&Registry::gemm, dout), dx.defined() ? dx.data<float>() : nullptr, dw.defined() ? dw.data<float>() : nullptr,
                    dout.data<float>(), sx.data<float>(), sw.data<float>(), M, N, K, trans_b);
      if (has_bias && raw->needs_input_grad(2)) {
        db = Tensor::zeros({N});
        kernel(&Registry::bias_backward, dout)(db.data<float>(), dout.data<float>(), M, N);
      }
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_b) {
  return linear(a, b, Tensor(), !trans_b);
}

Tensor bmm(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("bmm", false);
  Tensor a = f32_contiguous(a_in, "bmm", "a"), b = f32_contiguous(b_in, "bmm", "b");
  if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0) || a.size(2) != b.size(1))
    PT_THROW(InputError, "bmm: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " do not fit");
  const int64_t Bt = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  Tensor out = Tensor::empty({Bt, M, N});
  kernel(&Registry::gemm_batched, a)(false, false, M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), N, 0.0f, out.data<float>(), N, Bt,
                  M * K, K * N, M * N);
  if (autograd::any_requires_grad({&a_in, &b_in})) {
    Tensor sa = a.detach(), sb = b.detach();
    record_lambda("bmm", {&a_in, &b_in}, {&out}, [sa, sb, Bt, M, N, K](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor da = Tensor::empty(sa.shape()), db = Tensor::empty(sb.shape());
      kernel(&Registry::gemm_batched, dout)(false, true, M, K, N, 1.0f, dout.data<float>(), N, sb.data<float>(), N, 0.0f, da.data<float>(),
                      K, Bt, M * N, K * N, M * K);
      kernel(&Registry::gemm_batched, dout)(true, false, K, N, M, 1.0f, sa.data<float>(), K, dout.data<float>(), N, 0.0f, db.data<float>(),
                      N, Bt, M * K, M * N, K * N);
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

}  // namespace paratrain::ops
