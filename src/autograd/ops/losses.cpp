// The losses: cross_entropy over logits; linear_loss, a loss of x @ weight^T whose logits exist
// only inside the op (in aligned rows); linear_cross_entropy, the tied LM head and its
// cross-entropy as one. The cross-entropies run the fused softmax + cross-entropy kernels (f32
// math, the f32 mean computed on the logits' device: no value is read back per call).
#include <utility>

#include "common.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;
using autograd::autocast_input;

namespace {

// What the backward of a cross-entropy needs besides the logits and targets: each row's
// log-sum-exp and the count of non-ignored rows (device scalars). Never the op's output: a
// backward closure holding it would keep its own node alive.
struct CrossEntropySaved {
  Tensor lse, count;
};

// The forward over N rows of V logits, row n at logits + n * ld: the mean loss (a scalar
// tensor) and what the backward needs.
std::pair<Tensor, CrossEntropySaved> cross_entropy_forward(const Tensor& logits, const Tensor& targets, int64_t N,
                                                           int64_t V, int64_t ld) {
  const DeviceSpec dev = logits.device_spec();
  Tensor losses = Tensor::empty({N}, DType::F32, dev), lse = Tensor::empty({N}, DType::F32, dev);
  kernel(&Registry::crossentropy_forward, logits)(losses.data<float>(), lse.data<float>(), logits.data_ptr(),
                                                  targets.data<int32_t>(), N, V, ld);
  Tensor mean = Tensor::empty({}, DType::F32, dev), count = Tensor::empty({}, DType::I64, dev);
  kernel(&Registry::crossentropy_mean, losses)(mean.data<float>(), count.data<int64_t>(), losses.data<float>(),
                                               targets.data<int32_t>(), N);
  return {mean, CrossEntropySaved{lse, count}};
}

// dlogits (N, ld; columns [V, ld) unwritten) in the logits' dtype from the upstream gradient
// g of the mean.
Tensor cross_entropy_backward(const Tensor& g, const Tensor& logits, const CrossEntropySaved& f,
                              const Tensor& targets, int64_t N, int64_t V, int64_t ld) {
  // (a seed made elsewhere is moved here: the scale is computed on this device)
  const Tensor g0 = convert(g.contiguous(), DType::F32).to(logits.device_spec());
  Tensor dl = Tensor::empty({N}, DType::F32, logits.device_spec());
  kernel(&Registry::crossentropy_grad_scale, dl)(dl.data<float>(), g0.data<float>(), f.count.data<int64_t>(), N);
  Tensor dlogits = Tensor::empty({N, ld}, logits.dtype(), logits.device_spec());
  kernel(&Registry::crossentropy_backward, dlogits)(dlogits.data_ptr(), dl.data<float>(), logits.data_ptr(),
                                                    f.lse.data<float>(), targets.data<int32_t>(), N, V, ld);
  return dlogits;
}

}  // namespace

int64_t logits_row_stride(int64_t V) { return (V + 63) / 64 * 64; }

Tensor cross_entropy(const Tensor& logits_raw, const Tensor& targets_in) {
  autograd::profiler::OpScope op_scope("cross_entropy", false);
  const Tensor logits_in = autocast_input("cross_entropy", logits_raw);
  Tensor logits = float_contiguous(logits_in, "cross_entropy", "logits");
  Tensor targets = i32_contiguous(targets_in, "cross_entropy", "targets");
  const int64_t V = logits.size(-1), N = logits.numel() / std::max<int64_t>(V, 1);
  if (targets.numel() != N)
    PT_THROW(InputError, "cross_entropy: ", targets.numel(), " targets for ", N, " rows of logits ",
             shape_str(logits.shape()));
  expect_same_device("cross_entropy", {{"logits", &logits}, {"targets", &targets}});
  auto [out, f] = cross_entropy_forward(logits, targets, N, V, V);
  if (autograd::any_requires_grad({&logits_in})) {
    record_lambda("cross_entropy", {&logits_in, &targets_in}, {&out},
                  [sl = logits.detach(), f, targets, N, V](std::vector<Tensor>& g) {
                    Tensor dlogits = cross_entropy_backward(g[0], sl, f, targets, N, V, V).reshape(sl.shape());
                    return std::vector<Tensor>{dlogits, Tensor()};
                  });
  }
  return out;
}

Tensor linear_loss(const Tensor& x_raw, const Tensor& w_raw, const LogitsLoss& loss) {
  const char* name = loss.name;
  autograd::profiler::OpScope op_scope(name, false);
  const Tensor x_in = autocast_input("matmul", x_raw), w_in = autocast_input("matmul", w_raw);
  Tensor x = float_contiguous(x_in, name, "input"), w = float_contiguous(w_in, name, "weight");
  expect_same_dtype(name, {{"input", &x_in}, {"weight", &w_in}});
  expect_same_device(name, {{"input", &x_in}, {"weight", &w_in}});
  if (w.dim() != 2 || x.dim() < 1 || x.size(-1) != w.size(1))
    PT_THROW(InputError, name, ": input ", shape_str(x.shape()), " does not fit weight ", shape_str(w.shape()),
             " (V, C)");
  const int64_t C = x.size(-1), V = w.size(0), N = x.numel() / std::max<int64_t>(C, 1);
  if (V == 0) PT_THROW(InputError, name, ": the weight has no rows (V = 0)");
  const int64_t ld = logits_row_stride(V);
  Tensor logits = x.new_empty({N, ld});
  kernel(&Registry::gemm, x)(false, true, N, V, C, 1.0f, x.data_ptr(), C, w.data_ptr(), C, 0.0f, logits.data_ptr(),
                             ld);
  auto [out, kept] = loss.forward(logits, N, V, ld);
  if (autograd::any_requires_grad({&x_in, &w_in})) {
    record_with_node(name, {&x_in, &w_in}, {&out},
                     [sx = x.detach(), sw = w.detach(), logits, kept, backward = loss.backward, N, V, C, ld](
                         autograd::Node& node, std::vector<Tensor>& g) {
                       const Tensor dlogits = backward(g[0], logits, kept, N, V, ld);
                       auto gemm = kernel(&Registry::gemm, dlogits);
                       Tensor dx, dw;
                       if (node.needs_input_grad(0)) {  // dx (N,C) = dlogits (N,V) @ w (V,C)
                         dx = sx.new_empty(sx.shape());
                         gemm(false, false, N, C, V, 1.0f, dlogits.data_ptr(), ld, sw.data_ptr(), C, 0.0f,
                              dx.data_ptr(), C);
                       }
                       if (node.needs_input_grad(1)) {  // dw (V,C) = dlogits^T (V,N) @ x (N,C)
                         dw = sw.new_empty(sw.shape());
                         gemm(true, false, V, C, N, 1.0f, dlogits.data_ptr(), ld, sx.data_ptr(), C, 0.0f,
                              dw.data_ptr(), C);
                       }
                       return std::vector<Tensor>{dx, dw};
                     });
  }
  return out;
}

Tensor linear_cross_entropy(const Tensor& x, const Tensor& w, const Tensor& targets_in) {
  const char* name = "linear_cross_entropy";
  const Tensor targets = i32_contiguous(targets_in, name, "targets");
  expect_same_device(name, {{"input", &x}, {"targets", &targets}});
  const int64_t rows = x.numel() / std::max<int64_t>(x.dim() ? x.size(-1) : 1, 1);
  if (targets.numel() != rows)
    PT_THROW(InputError, name, ": ", targets.numel(), " targets for ", rows, " rows of input ", shape_str(x.shape()));
  LogitsLoss ce;
  ce.name = name;
  ce.forward = [targets](const Tensor& logits, int64_t N, int64_t V, int64_t ld) {
    auto [out, f] = cross_entropy_forward(logits, targets, N, V, ld);
    return std::pair<Tensor, std::vector<Tensor>>{out, {f.lse, f.count}};
  };
  ce.backward = [targets](const Tensor& g, const Tensor& logits, const std::vector<Tensor>& kept, int64_t N,
                          int64_t V, int64_t ld) {
    return cross_entropy_backward(g, logits, CrossEntropySaved{kept[0], kept[1]}, targets, N, V, ld);
  };
  return linear_loss(x, w, ce);
}

}  // namespace paratrain::ops
