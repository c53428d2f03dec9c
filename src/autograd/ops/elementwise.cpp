// Elementwise ops, reductions to a scalar, and reshape.
#include "common.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/profiler.h"

namespace paratrain::ops {

using namespace detail;

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("add", false);
  expect_same_shape(a_in, b_in, "add");
  Tensor a = f32_contiguous(a_in, "add", "a"), b = f32_contiguous(b_in, "add", "b");
  Tensor out = Tensor::empty(a.shape());
  kernel(&Registry::add, a)(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  if (autograd::any_requires_grad({&a_in, &b_in}))
    record_lambda("add", {&a_in, &b_in}, {&out}, [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0], g[0]}; });
  return out;
}

Tensor sub(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("sub", false);
  expect_same_shape(a_in, b_in, "sub");
  Tensor a = f32_contiguous(a_in, "sub", "a"), b = f32_contiguous(b_in, "sub", "b");
  Tensor out = Tensor::empty(a.shape());
  kernel(&Registry::sub, a)(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  if (autograd::any_requires_grad({&a_in, &b_in}))
    record_lambda("sub", {&a_in, &b_in}, {&out}, [](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor nb = Tensor::empty(gc.shape());
      kernel(&Registry::scale, gc)(nb.data<float>(), gc.data<float>(), -1.0f, gc.numel());
      return std::vector<Tensor>{gc, nb};
    });
  return out;
}

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  autograd::profiler::OpScope op_scope("mul", false);
  expect_same_shape(a_in, b_in, "mul");
  Tensor a = f32_contiguous(a_in, "mul", "a"), b = f32_contiguous(b_in, "mul", "b");
  Tensor out = Tensor::empty(a.shape());
  kernel(&Registry::mul, a)(out.data<float>(), a.data<float>(), b.data<float>(), a.numel());
  if (autograd::any_requires_grad({&a_in, &b_in})) {
    Tensor sa = a.detach(), sb = b.detach();
    record_lambda("mul", {&a_in, &b_in}, {&out}, [sa, sb](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor da = Tensor::empty(gc.shape()), db = Tensor::empty(gc.shape());
      kernel(&Registry::mul, gc)(da.data<float>(), gc.data<float>(), sb.data<float>(), gc.numel());
      kernel(&Registry::mul, gc)(db.data<float>(), gc.data<float>(), sa.data<float>(), gc.numel());
      return std::vector<Tensor>{da, db};
    });
  }
  return out;
}

Tensor scale(const Tensor& a_in, float s) {
  autograd::profiler::OpScope op_scope("scale", false);
  Tensor a = f32_contiguous(a_in, "scale", "a");
  Tensor out = Tensor::empty(a.shape());
  kernel(&Registry::scale, a)(out.data<float>(), a.data<float>(), s, a.numel());
  if (autograd::any_requires_grad({&a_in}))
    record_lambda("scale", {&a_in}, {&out}, [s](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = Tensor::empty(gc.shape());
      kernel(&Registry::scale, gc)(d.data<float>(), gc.data<float>(), s, gc.numel());
      return std::vector<Tensor>{d};
    });
  return out;
}

// Activation whose backward needs the input (relu, gelu) or the output (tanh, sigmoid).
template <typename Fwd, typename Bwd>
static Tensor activation(const char* name, const Tensor& x_in, Fwd fwd, Bwd bwd, bool save_output) {
  Tensor x = f32_contiguous(x_in, name, "input");
  Tensor out = Tensor::empty(x.shape());
  kernel(fwd, x)(out.data<float>(), x.data<float>(), x.numel());
  if (autograd::any_requires_grad({&x_in})) {
    Tensor saved = save_output ? out.detach() : x.detach();
    record_lambda(name, {&x_in}, {&out}, [saved, bwd](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = Tensor::zeros(gc.shape());
      kernel(bwd, gc)(d.data<float>(), gc.data<float>(), saved.data<float>(), gc.numel());
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

static Tensor reduce_scalar(const char* name, const Tensor& x_in, double factor) {
  Tensor x = f32_contiguous(x_in, name, "input");
  Tensor out = Tensor::full({}, kernel(&Registry::sum, x)(x.data<float>(), x.numel()) * factor);
  if (autograd::any_requires_grad({&x_in})) {
    Shape shape = x.shape();
    record_lambda(name, {&x_in}, {&out}, [shape, factor](std::vector<Tensor>& g) {
      return std::vector<Tensor>{Tensor::full(shape, g[0].item() * factor)};
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
  Tensor x = f32_contiguous(x_in, "dropout", "input");
  const int64_t n = x.numel();
  Tensor mask = Tensor::empty(x.shape(), DType::U8);
  uint8_t* m = mask.data<uint8_t>();
  for (int64_t i = 0; i < n; ++i) m[i] = gen.uniform_f32() >= p ? 1 : 0;
  const float s = 1.0f / (1.0f - p);
  Tensor out = Tensor::empty(x.shape());
  kernel(&Registry::dropout_forward, x)(out.data<float>(), x.data<float>(), m, s, n);
  if (autograd::any_requires_grad({&x_in}))
    record_lambda("dropout", {&x_in}, {&out}, [mask, s](std::vector<Tensor>& g) {
      Tensor gc = g[0].contiguous();
      Tensor d = Tensor::zeros(gc.shape());
      kernel(&Registry::dropout_backward, gc)(d.data<float>(), gc.data<float>(), mask.data<uint8_t>(), s, gc.numel());
      return std::vector<Tensor>{d};
    });
  return out;
}

}  // namespace paratrain::ops
