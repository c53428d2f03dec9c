// matmul, bmm and linear (GEMM through the dispatch point), in the dtype of their inputs;
// under autocast in the half type (the kernels accumulate in f32).
#include "common.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;
using autograd::autocast_input;

namespace {
Shape with_last(const Shape& s, int64_t last) {
  Shape r = s;
  r.back() = last;
  return r;
}

using GemmFn = decltype(Registry::gemm)::Fn;

// out (M,N) = a (M,K) @ op(b), op(b) = b (K,N) or b^T with b (N,K). Buffers in the kernel's dtype.
void forward_gemm(GemmFn gemm, void* out, const void* a, const void* b, int64_t M, int64_t N, int64_t K,
                  bool trans_b) {
  gemm(false, trans_b, M, N, K, 1.0f, a, K, b, trans_b ? K : N, 0.0f, out, N);
}

// Gradients of out = a @ op(b): da (M,K), db shaped like b (either may be null).
void backward_gemm(GemmFn gemm, void* da, void* db, const void* dout, const void* a, const void* b, int64_t M,
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

void* ptr_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// A linear layer's operands, checked: contiguous, one dtype and device; out = x op(w) + b
// with x (M,K) and out (M,N).
struct LinearOperands {
  Tensor x, w, b;  // b undefined without a bias
  int64_t M, N, K;
  bool trans_b;
  Shape out_shape;
};

LinearOperands linear_operands(const char* name, const Tensor& x_in, const Tensor& w_in, const Tensor& b_in,
                               bool in_out_layout) {
  LinearOperands o;
  o.x = float_contiguous(x_in, name, "input");
  o.w = float_contiguous(w_in, name, "weight");
  expect_same_dtype(name, {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  expect_same_device(name, {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  if (o.w.dim() != 2 || o.x.dim() < 1) PT_THROW(InputError, name, ": weight must be 2-D, got ", shape_str(o.w.shape()));
  o.trans_b = !in_out_layout;
  o.K = o.x.size(-1);
  const int64_t in_dim = in_out_layout ? o.w.size(0) : o.w.size(1);
  o.N = in_out_layout ? o.w.size(1) : o.w.size(0);
  if (in_dim != o.K)
    PT_THROW(InputError, name, ": input ", shape_str(o.x.shape()), " does not fit weight ", shape_str(o.w.shape()));
  o.M = o.x.numel() / std::max<int64_t>(o.K, 1);
  if (b_in.defined()) {
    o.b = float_contiguous(b_in, name, "bias");
    if (o.b.numel() != o.N) PT_THROW(InputError, name, ": bias ", shape_str(o.b.shape()), " for ", o.N, " outputs");
  }
  o.out_shape = with_last(o.x.shape(), o.N);
  return o;
}

// The gradients {dx, dw, db} of out = x op(w) + b from dout (M,N), those `node` needs.
std::vector<Tensor> linear_gradients(const autograd::Node& node, const Tensor& sx, const Tensor& sw, bool has_bias,
                                     const LinearOperands& o, const Tensor& dout) {
  Tensor dx, dw, db;
  if (node.needs_input_grad(0)) dx = sx.new_empty(sx.shape());
  if (node.needs_input_grad(1)) dw = sw.new_empty(sw.shape());
  backward_gemm(kernel(&Registry::gemm, dout), ptr_or_null(dx), ptr_or_null(dw), dout.data_ptr(), sx.data_ptr(),
                sw.data_ptr(), o.M, o.N, o.K, o.trans_b);
  if (has_bias && node.needs_input_grad(2)) {
    db = dout.new_zeros({o.N});
    kernel(&Registry::bias_backward, dout)(db.data_ptr(), dout.data_ptr(), o.M, o.N);
  }
  return {dx, dw, db};
}

// The shape-only part of the operands, for a backward closure (it keeps no tensor alive).
LinearOperands sizes_of(const LinearOperands& o) { return {Tensor(), Tensor(), Tensor(), o.M, o.N, o.K, o.trans_b, {}}; }

Tensor linear_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool in_out_layout) {
  const LinearOperands o = linear_operands("linear", x_in, w_in, b_in, in_out_layout);
  Tensor out = o.x.new_empty(o.out_shape);
  if (o.b.defined())  // one kernel where the device fuses the bias into the GEMM's epilogue
    kernel(&Registry::gemm_bias, o.x)(o.trans_b, o.M, o.N, o.K, o.x.data_ptr(), o.w.data_ptr(), o.b.data_ptr(),
                                      out.data_ptr());
  else
    forward_gemm(kernel(&Registry::gemm, o.x), out.data_ptr(), o.x.data_ptr(), o.w.data_ptr(), o.M, o.N, o.K,
                 o.trans_b);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in}))
    record_with_node("linear", {&x_in, &w_in, &b_in}, {&out},
                     [sx = o.x.detach(), sw = o.w.detach(), has_bias = o.b.defined(), s = sizes_of(o)](
                         autograd::Node& node, std::vector<Tensor>& g) {
                       return linear_gradients(node, sx, sw, has_bias, s, g[0].contiguous());
                     });
  return out;
}

// gelu(x op(w) + b) in one kernel where the device fuses the GELU into the GEMM's epilogue;
// the backward is gelu's (on the saved pre-activation), then linear's.
Tensor linear_gelu_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool in_out_layout) {
  const LinearOperands o = linear_operands("linear_gelu", x_in, w_in, b_in, in_out_layout);
  if (!o.b.defined()) PT_THROW(InputError, "linear_gelu: the bias is required (use gelu(linear(x, w, {})) without)");
  Tensor pre = o.x.new_empty(o.out_shape), out = o.x.new_empty(o.out_shape);
  kernel(&Registry::gemm_bias_gelu, o.x)(o.trans_b, o.M, o.N, o.K, o.x.data_ptr(), o.w.data_ptr(), o.b.data_ptr(),
                                         pre.data_ptr(), out.data_ptr());
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in}))
    record_with_node("linear_gelu", {&x_in, &w_in, &b_in}, {&out},
                     [sx = o.x.detach(), sw = o.w.detach(), pre = pre.detach(), s = sizes_of(o)](
                         autograd::Node& node, std::vector<Tensor>& g) {
                       const Tensor dout = g[0].contiguous();
                       Tensor dpre = dout.new_zeros(dout.shape());
                       kernel(&Registry::gelu_backward, dout)(dpre.data_ptr(), dout.data_ptr(), pre.data_ptr(),
                                                             dout.numel());
                       return linear_gradients(node, sx, sw, true, s, dpre);
                     });
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool in_out_layout) {
  autograd::profiler::OpScope op_scope("linear", false);
  return linear_impl(autocast_input("linear", x), autocast_input("linear", w), autocast_input("linear", b),
                     in_out_layout);
}

Tensor linear_gelu(const Tensor& x, const Tensor& w, const Tensor& b, bool in_out_layout) {
  autograd::profiler::OpScope op_scope("linear_gelu", false);
  return linear_gelu_impl(autocast_input("linear", x), autocast_input("linear", w), autocast_input("linear", b),
                          in_out_layout);
}

Tensor add_bias(const Tensor& x_raw, const Tensor& b_raw) {
  autograd::profiler::OpScope op_scope("add_bias", false);
  const Tensor x_in = autocast_input("linear", x_raw), b_in = autocast_input("linear", b_raw);
  Tensor x = float_contiguous(x_in, "add_bias", "input"), b = float_contiguous(b_in, "add_bias", "bias");
  expect_same_dtype("add_bias", {{"input", &x_in}, {"bias", &b_in}});
  expect_same_device("add_bias", {{"input", &x_in}, {"bias", &b_in}});
  const int64_t N = x.dim() ? x.size(-1) : 0, M = x.numel() / std::max<int64_t>(N, 1);
  if (b.numel() != N) PT_THROW(InputError, "add_bias: bias ", shape_str(b.shape()), " for input ", shape_str(x.shape()));
  Tensor out = x.clone();
  kernel(&Registry::bias_add, out)(out.data_ptr(), b.data_ptr(), M, N);
  if (autograd::any_requires_grad({&x_in, &b_in})) {
    record_with_node("add_bias", {&x_in, &b_in}, {&out}, [M, N](autograd::Node& node, std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor db;
      if (node.needs_input_grad(1)) {
        db = dout.new_zeros({N});
        kernel(&Registry::bias_backward, dout)(db.data_ptr(), dout.data_ptr(), M, N);
      }
      return std::vector<Tensor>{dout, db};
    });
  }
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_b) {
  autograd::profiler::OpScope op_scope("matmul", false);
  return linear_impl(autocast_input("matmul", a), autocast_input("matmul", b), Tensor(), !trans_b);
}

Tensor bmm(const Tensor& a_raw, const Tensor& b_raw) {
  autograd::profiler::OpScope op_scope("bmm", false);
  const Tensor a_in = autocast_input("bmm", a_raw), b_in = autocast_input("bmm", b_raw);
  Tensor a = float_contiguous(a_in, "bmm", "a"), b = float_contiguous(b_in, "bmm", "b");
  expect_same_dtype("bmm", {{"a", &a_in}, {"b", &b_in}});
  expect_same_device("bmm", {{"a", &a_in}, {"b", &b_in}});
  if (a.dim() != 3 || b.dim() != 3 || a.size(0) != b.size(0) || a.size(2) != b.size(1))
    PT_THROW(InputError, "bmm: shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " do not fit");
  const int64_t Bt = a.size(0), M = a.size(1), K = a.size(2), N = b.size(2);
  Tensor out = a.new_empty({Bt, M, N});
  kernel(&Registry::gemm_batched, a)(false, false, M, N, K, 1.0f, a.data_ptr(), K, b.data_ptr(), N, 0.0f,
                                     out.data_ptr(), N, Bt, M * K, K * N, M * N);
  if (autograd::any_requires_grad({&a_in, &b_in})) {
    Tensor sa = a.detach(), sb = b.detach();
    record_with_node("bmm", {&a_in, &b_in}, {&out},
                     [sa, sb, Bt, M, N, K](autograd::Node& node, std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor da, db;
      auto gemm_batched = kernel(&Registry::gemm_batched, dout);
      if (node.needs_input_grad(0)) {
        da = sa.new_empty(sa.shape());
        gemm_batched(false, true, M, K, N, 1.0f, dout.data_ptr(), N, sb.data_ptr(), N, 0.0f, da.data_ptr(), K, Bt,
                     M * N, K * N, M * K);
      }
      if (node.needs_input_grad(1)) {
        db = sb.new_empty(sb.shape());
        gemm_batched(true, false, K, N, M, 1.0f, sa.data_ptr(), K, dout.data_ptr(), N, 0.0f, db.data_ptr(), N, Bt,
                     M * K, M * N, K * N);
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

}  // namespace paratrain::ops
