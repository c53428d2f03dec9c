#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

TEST(Linear, BothLayoutsForwardAndGradCheck) {
  const int64_t N = 5, IN = 7, OUT = 9;
  for (WeightLayout layout : {WeightLayout::kInOut, WeightLayout::kOutIn}) {
    const bool io = layout == WeightLayout::kInOut;
    auto x = randn(N * IN, 1), w = randn(IN * OUT, 2), b = randn(OUT, 3), g = randn(N * OUT, 4);
    std::vector<float> out(N * OUT);
    std::vector<double> want(N * OUT);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < OUT; ++o) {
        double s = b[o];
        for (int64_t i = 0; i < IN; ++i) s += double(x[n * IN + i]) * (io ? w[i * OUT + o] : w[o * IN + i]);
        want[n * OUT + o] = s;
      }
    linear_forward(out.data(), x.data(), w.data(), b.data(), N, IN, OUT, layout);
    EXPECT_TRUE(all_close(out, want, 1e-5, 1e-5));
    std::vector<float> dx(N * IN, 0.0f), dw(IN * OUT, 0.0f), db(OUT, 0.0f);
    linear_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), N, IN, OUT, layout);
    auto loss = [&] {
      std::vector<float> o(N * OUT);
      linear_forward(o.data(), x.data(), w.data(), b.data(), N, IN, OUT, layout);
      return testing::dot(g, o);
    };
    EXPECT_TRUE(grad_check(x, dx, loss, 1e-2f, 1e-3, 1e-2));
    EXPECT_TRUE(grad_check(w, dw, loss, 1e-2f, 1e-3, 1e-2));
    EXPECT_TRUE(grad_check(b, db, loss, 1e-2f, 1e-3, 1e-2));
  }
}

}  // namespace
}  // namespace paratrain::kernels::cpu
