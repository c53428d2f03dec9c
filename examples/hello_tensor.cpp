// "Hello, tensor": the first program of docs/library.md. Tensors, an operation recorded by
// autograd, a backward pass, and the gradient it leaves -- checked against the formula.
//
//   example_hello_tensor
//
// Prints the tensors and "gradient ok" when d(sum(x*x + 3x))/dx equals 2x + 3 exactly.
#include <cstdio>

#include <paratrain/autograd/engine.h>
#include <paratrain/autograd/ops.h>
#include <paratrain/tensor/tensor.h>

using namespace paratrain;

int main() {
  // [guide:hello]
  Tensor x = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});  // f32, row-major, on the CPU
  x.set_requires_grad(true);                                   // a leaf autograd tracks

  Tensor y = ops::add(ops::mul(x, x), ops::scale(x, 3));  // y = x*x + 3x, element-wise
  Tensor loss = ops::sum(y);                                // a scalar
  autograd::backward(loss);                                 // fills x.grad() = 2x + 3

  const float* g = x.grad().data<float>();
  std::printf("loss %.1f\n", loss.item());                  // 1+4+9+16+25+36 + 3*21 = 154
  std::printf("grad %.0f %.0f %.0f %.0f %.0f %.0f\n", g[0], g[1], g[2], g[3], g[4], g[5]);
  // [/guide:hello]

  const float* xs = x.data<float>();
  for (int i = 0; i < 6; ++i)
    if (g[i] != 2 * xs[i] + 3) {
      std::printf("gradient wrong at %d: %g\n", i, g[i]);
      return 1;
    }
  std::printf("gradient ok\n");
  return 0;
}
