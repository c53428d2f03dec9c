// Elementwise ops, casts, reductions to a scalar, and reshape. Every op works in the dtype
// of its inputs (two-input ops in the widest, autograd/autocast.h).
#include "common.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;

Tensor to_dtype(const Tensor& x_in, DType dtype) {
  if (!x_in.defined() || x_in.dtype() == dtype) return x_in;
  autograd::profiler::OpScope op_scope("to_dtype", false);
  Tensor x = float_contiguous(x_in, "to_dtype", "input");
  if (!dtype_is_float(dtype)) PT_THROW(InputError, "to_dtype: target must be floating point, got ", dtype_name(dtype));
  Tensor out = convert(x, dtype);
  if (autograd::any_requires_grad({&x_in})) {
    const DType from = x.dtype();
    record_lambda("to_dtype", {&x_in}, {&out}, [from](std::vector<Tensor>& g) { return std::vector<Tensor>{convert(g[0], from)}; });
  }
  return out;
}

namespace {
// The inputs of a two-input elementwise op in their common (widest) dtype: `a`, `b` are
// the graph's inputs (a cast when one was needed), `ac`, `bc` their contiguous data.
struct Promoted {
  Tensor a, b, ac, bc;
};
Promoted promoted(const char* op, const Tensor& a_in, const Tensor& b_in) {
  expect_same_shape(a_in, b_in, op);
  expect_same_device(op, {{"a", &a_in}, {"b", &b_in}});
  float_contiguous(a_in, op, "a");
  float_contiguous(b_in, op, "b");
  const DType t = widest(a_in.dtype(), b_in.dtype());
  Promoted p{to_dtype(a_in, t), to_dtype(b_in, t), {}, {}};
  p.ac = p.a.contiguous();
  p.bc = p.b.contiguous();
  return p;
}
}  // namespace

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("add", false);
  Promoted p = promoted("add", a_in, b_in);
  const Tensor &a = p.ac, &b = p.bc;
  Tensor out = a.new_empty(a.shape());
  kernel(&Registry::add, a)(out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel());
  if (autograd::any_requires_grad({&p.a, &p.b}))
    record_lambda("add", {&p.a, &p.b}, {&out}, [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0], g[0]}; });
  return out;
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("sub", false);
  Promoted p = promoted("sub", a_in, b_in);
  const Tensor &a = p.ac, &b = p.bc;
  Tensor out = a.new_empty(a.shape());
  kernel(&Registry::sub, a)(out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel());
  if (autograd::any_requires_grad({&p.a, &p.b}))
    record_with_node("sub", {&p.a, &p.b}, {&out}, [](autograd::Node& node, std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor nb;
      if (node.needs_input_grad(1)) {
        nb = gc.new_empty(gc.shape());
        kernel(&Registry::scale, gc)(nb.data_ptr(), gc.data_ptr(), -1.0f, gc.numel());
      }
      return std::vector<Tensor>{gc, nb};
    });
  return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("mul", false);
  Promoted p = promoted("mul", a_in, b_in);
  const Tensor &a = p.ac, &b = p.bc;
  Tensor out = a.new_empty(a.shape());
  kernel(&Registry::mul, a)(out.data_ptr(), a.data_ptr(), b.data_ptr(), a.numel());
  if (autograd::any_requires_grad({&p.a, &p.b})) {
    Tensor sa = a.detach(), sb = b.detach();
    record_with_node("mul", {&p.a, &p.b}, {&out}, [sa, sb](autograd::Node& node, std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor da, db;
      if (node.needs_input_grad(0)) {
        da = gc.new_empty(gc.shape());
        kernel(&Registry::mul, gc)(da.data_ptr(), gc.data_ptr(), sb.data_ptr(), gc.numel());
      }
      if (node.needs_input_grad(1)) {
        db = gc.new_empty(gc.shape());
        kernel(&Registry::mul, gc)(db.data_ptr(), gc.data_ptr(), sa.data_ptr(), gc.numel());
      }
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

Tensor scale(const Tensor& a_in, float s) {
  autograd::profiler::OpScope op_scope("scale", false);
  Tensor a = float_contiguous(a_in, "scale", "a");
  expect_same_device("scale", {{"a", &a_in}});
  Tensor out = a.new_empty(a.shape());
  kernel(&Registry::scale, a)(out.data_ptr(), a.data_ptr(), s, a.numel());
  if (autograd::any_requires_grad({&a_in}))
    record_lambda("scale", {&a_in}, {&out}, [s](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = gc.new_empty(gc.shape());
      kernel(&Registry::scale, gc)(d.data_ptr(), gc.data_ptr(), s, gc.numel());
      return std::vector<Tensor>{d};
    });
  return out;
}

// Activation whose backward needs the input (relu, gelu) or the output (tanh, sigmoid).
template <typename Fwd, typename Bwd>
static Tensor activation(const char* name, const Tensor& x_in, Fwd fwd, Bwd bwd, bool save_output) {
  Tensor x = float_contiguous(x_in, name, "input");
  expect_same_device(name, {{"input", &x_in}});
  Tensor out = x.new_empty(x.shape());
  kernel(fwd, x)(out.data_ptr(), x.data_ptr(), x.numel());
  if (autograd::any_requires_grad({&x_in})) {
    Tensor saved = save_output ? out.detach() : x.detach();
    record_lambda(name, {&x_in}, {&out}, [saved, bwd](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = gc.new_zeros(gc.shape());
      kernel(bwd, gc)(d.data_ptr(), gc.data_ptr(), saved.data_ptr(), gc.numel());
      return std::vector<Tensor>{d};
    });
  }
  return out;
}

Tensor relu(const Tensor& x) {
  autograd::profiler::OpScope op_scope("relu", false);
  return activation("relu", x, &Registry::relu_forward, &Registry::relu_backward, false);
}
Tensor gelu(const Tensor& x) {
  autograd::profiler::OpScope op_scope("gelu", false);
  return activation("gelu", x, &Registry::gelu_forward, &Registry::gelu_backward, false);
}
Tensor tanh(const Tensor& x) {
  autograd::profiler::OpScope op_scope("tanh", false);
  return activation("tanh", x, &Registry::tanh_forward, &Registry::tanh_backward, true);
}
Tensor sigmoid(const Tensor& x) {
  autograd::profiler::OpScope op_scope("sigmoid", false);
  return activation("sigmoid", x, &Registry::sigmoid_forward, &Registry::sigmoid_backward, true);
}

// The sum (f64 accumulation in the kernel) times `factor` as a one-element f32 tensor on x's
// device; the gradient is the upstream value times `factor` everywhere, in x's dtype.
static Tensor reduce_scalar(const char* name, const Tensor& x_in, double factor) {
  Tensor x = float_contiguous(x_in, name, "input");
  // The value and the gradient are computed on x's device from device memory (no read-back).
  Tensor out = Tensor::empty({}, DType::F32, x.device_spec());
  kernel(&Registry::sum_scaled, x)(out.data_ptr(), x.data_ptr(), factor, x.numel());
  if (autograd::any_requires_grad({&x_in})) {
    Shape shape = x.shape();
    const DType t = x.dtype();
    const DeviceSpec dev = x.device_spec();
    record_lambda(name, {&x_in}, {&out}, [shape, factor, t, dev](std::vector<Tensor>& g) {
      const Tensor g0 = convert(g[0].contiguous(), DType::F32).to(dev);  // a seed made elsewhere moves here
      Tensor dx = Tensor::empty(shape, t, dev);
      kernel(&Registry::fill_scaled, dx)(dx.data_ptr(), g0.data_ptr(), factor, dx.numel());
      return std::vector<Tensor>{dx};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  autograd::profiler::OpScope op_scope("sum", false);
  return reduce_scalar("sum", x, 1.0);
}
Tensor mean(const Tensor& x) {
  autograd::profiler::OpScope op_scope("mean", false);
  return reduce_scalar("mean", x, x.numel() ? 1.0 / static_cast<double>(x.numel()) : 0.0);
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  autograd::profiler::OpScope op_scope("reshape", false);
  Tensor out = x.detach().reshape(shape);
  if (autograd::any_requires_grad({&x})) {
    Shape in_shape = x.shape();
    record_lambda("reshape", {&x}, {&out}, [in_shape](std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].reshape(in_shape)};
    });
  }
  return out;
}

Tensor dropout(const Tensor& x_in, float p, bool training, Generator& gen) {
  autograd::profiler::OpScope op_scope("dropout", false);
  if (p < 0.0f || p >= 1.0f) PT_THROW(InputError, "dropout: probability ", p, " is outside [0, 1)");
  if (!training || p == 0.0f) return x_in;
  Tensor x = float_contiguous(x_in, "dropout", "input");
  expect_same_device("dropout", {{"input", &x_in}});
  const int64_t n = x.numel();
  // On the CPU the mask is n draws of `gen`; on a GPU it is drawn there from one 64-bit key
  // of `gen` (kernels' dropout_mask: counter-based, no host loop, no copy), so a GPU run drops
  // other elements than the CPU run, reproducibly from the same generator state.
  Tensor mask = x.new_empty(x.shape(), DType::U8);
  if (x.device() == Device::CPU) {
    uint8_t* m = mask.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i) m[i] = gen.uniform_f32() >= p ? 1 : 0;
  } else {
    kernel(&Registry::dropout_mask, mask)(mask.data<uint8_t>(), gen.next_u64(), p, n);
  }
  const float s = 1.0f / (1.0f - p);
  Tensor out = x.new_empty(x.shape());
  kernel(&Registry::dropout_forward, x)(out.data_ptr(), x.data_ptr(), mask.data<uint8_t>(), s, n);
  if (autograd::any_requires_grad({&x_in}))
    record_lambda("dropout", {&x_in}, {&out}, [mask, s](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = gc.new_zeros(gc.shape());
      kernel(&Registry::dropout_backward, gc)(d.data_ptr(), gc.data_ptr(), mask.data<uint8_t>(), s, gc.numel());
      return std::vector<Tensor>{d};
    });
  return out;
}

}  // namespace paratrain::ops
