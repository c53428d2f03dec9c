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

Tensor linear_impl(const Tensor& x_in, const Tensor& w_in, const Tensor& b_in, bool in_out_layout) {
  Tensor x = float_contiguous(x_in, "linear", "input");
  Tensor w = float_contiguous(w_in, "linear", "weight");
  expect_same_dtype("linear", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
  expect_same_device("linear", {{"input", &x_in}, {"weight", &w_in}, {"bias", &b_in}});
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
    b = float_contiguous(b_in, "linear", "bias");
    if (b.numel() != N) PT_THROW(InputError, "linear: bias ", shape_str(b.shape()), " for ", N, " outputs");
  }
  Tensor out = x.new_empty(with_last(x.shape(), N));
  if (b.defined())  // one kernel where the device fuses the bias into the GEMM's epilogue
    kernel(&Registry::gemm_bias, x)(trans_b, M, N, K, x.data_ptr(), w.data_ptr(), b.data_ptr(), out.data_ptr());
  else
    forward_gemm(kernel(&Registry::gemm, x), out.data_ptr(), x.data_ptr(), w.data_ptr(), M, N, K, trans_b);
  if (autograd::any_requires_grad({&x_in, &w_in, &b_in})) {
    Tensor sx = x.detach(), sw = w.detach();
    bool has_bias = b.defined();
    auto node = std::make_shared<autograd::LambdaNode>("linear", nullptr);
    autograd::record(node, {&x_in, &w_in, &b_in}, {&out});
    autograd::Node* raw = node.get();
    node->set_fn([sx, sw, has_bias, M, N, K, trans_b, raw](std::vector<Tensor>& g) {
      Tensor dout = g[0].contiguous();
      Tensor dx, dw, db;
      if (raw->needs_input_grad(0)) dx = sx.new_empty(sx.shape());
      if (raw->needs_input_grad(1)) dw = sw.new_empty(sw.shape());
      backward_gemm(kernel(&Registry::gemm, dout), ptr_or_null(dx), ptr_or_null(dw), dout.data_ptr(), sx.data_ptr(),
                    sw.data_ptr(), M, N, K, trans_b);
      if (has_bias && raw->needs_input_grad(2)) {
        db = dout.new_zeros({N});
        kernel(&Registry::bias_backward, dout)(db.data_ptr(), dout.data_ptr(), M, N);
      }
      return std::vector<Tensor>{dx, dw, db};
    });
  }
  return out;
}
}  // namespace

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b, bool in_out_layout) {
  autograd::profiler::OpScope op_scope("linear", false);
  return linear_impl(autocast_input("linear", x), autocast_input("linear", w), autocast_input("linear", b),
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
