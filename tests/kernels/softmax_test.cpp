#include <cmath>
#include <string>
#include <vector>

#include "kernels/test_util.h"
#include "support/error_of.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::grad_check;
using testing::randn;

TEST(Softmax, ForwardMatchesReference) {
  for (auto [N, C] : {std::pair<int64_t, int64_t>{1, 1}, {4, 7}, {3, 33}, {2, 5000}}) {
    auto x = randn(N * C, 1, 4.0f);
    std::vector<float> out(N * C), lout(N * C), want(N * C), lwant(N * C);
    for (int64_t n = 0; n < N; ++n) {
      double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < C; ++c) m = std::max(m, double(x[n * C + c]));
      for (int64_t c = 0; c < C; ++c) s += std::exp(x[n * C + c] - m);
      for (int64_t c = 0; c < C; ++c) {
        want[n * C + c] = static_cast<float>(std::exp(x[n * C + c] - m) / s);
        lwant[n * C + c] = static_cast<float>(x[n * C + c] - m - std::log(s));
      }
    }
    softmax_forward(out.data(), x.data(), N, C);
    log_softmax_forward(lout.data(), x.data(), N, C);
    EXPECT_TRUE(all_close(out, want, 1e-7, 1e-5));
    EXPECT_TRUE(all_close(lout, lwant, 1e-5, 1e-5));
  }
}

TEST(Softmax, BackwardGradCheck) {
  const int64_t N = 3, C = 11;
  auto x = randn(N * C, 2), w = randn(N * C, 3);
  std::vector<float> out(N * C), d(N * C, 0.0f), ld(N * C, 0.0f);
  softmax_forward(out.data(), x.data(), N, C);
  softmax_backward(d.data(), w.data(), out.data(), N, C);
  auto loss = [&] {
    std::vector<float> o(N * C);
    softmax_forward(o.data(), x.data(), N, C);
    return testing::dot(w, o);
  };
  EXPECT_TRUE(grad_check(x, d, loss, 1e-2f, 1e-3, 1e-2));
  log_softmax_forward(out.data(), x.data(), N, C);
  log_softmax_backward(ld.data(), w.data(), out.data(), N, C);
  auto lloss = [&] {
    std::vector<float> o(N * C);
    log_softmax_forward(o.data(), x.data(), N, C);
    return testing::dot(w, o);
  };
  EXPECT_TRUE(grad_check(x, ld, lloss, 1e-2f, 1e-3, 1e-2));
}

TEST(CrossEntropy, ForwardBackwardIgnoreIndexAndBigVocab) {
  for (auto [N, V] : {std::pair<int64_t, int64_t>{1, 1}, {5, 13}, {3, 50257}}) {
    auto logits = randn(N * V, 4, 3.0f);
    std::vector<int32_t> tgt(N);
    for (int64_t n = 0; n < N; ++n) tgt[n] = static_cast<int32_t>((n * 7919) % V);
    if (N > 1) tgt[1] = kIgnoreIndex;
    std::vector<float> losses(N), lse(N), want(N);
    crossentropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, V);
    for (int64_t n = 0; n < N; ++n) {
      double m = -INFINITY, s = 0;
      for (int64_t c = 0; c < V; ++c) m = std::max(m, double(logits[n * V + c]));
      for (int64_t c = 0; c < V; ++c) s += std::exp(logits[n * V + c] - m);
      want[n] = tgt[n] < 0 ? 0.0f : static_cast<float>(m + std::log(s) - logits[n * V + tgt[n]]);
    }
    EXPECT_TRUE(all_close(losses, want, 1e-5, 1e-5));
    std::vector<float> dl(N);
    for (int64_t n = 0; n < N; ++n) dl[n] = 0.1f * (n + 1);
    std::vector<float> d(N * V, 123.0f);  // overwritten
    crossentropy_backward(d.data(), dl.data(), logits.data(), lse.data(), tgt.data(), N, V, V);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t c = 0; c < V; c += std::max<int64_t>(1, V / 50)) {
        double p = std::exp(double(logits[n * V + c]) - lse[n]);
        double w = tgt[n] < 0 ? 0.0 : (p - (c == tgt[n])) * dl[n];
        EXPECT_NEAR(d[n * V + c], w, 1e-6) << n << "," << c;
      }
    // in place over the logits
    auto inplace = logits;
    crossentropy_backward(inplace.data(), dl.data(), inplace.data(), lse.data(), tgt.data(), N, V, V);
    EXPECT_EQ(inplace, d);
  }
}

// Rows ld > V apart (a GEMM's aligned rows): the compact rows' results to the bit, and the
// columns [V, ld) neither read (NaN there changes nothing) nor written.
TEST(CrossEntropy, RowStrideReadsAndWritesOnlyTheFirstVOfEachRow) {
  const int64_t N = 4, V = 77, ld = 128;
  const auto compact = randn(N * V, 6, 2.0f);
  std::vector<float> strided(N * ld, std::nanf(""));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < V; ++c) strided[n * ld + c] = compact[n * V + c];
  std::vector<int32_t> tgt = {5, kIgnoreIndex, 76, 0};
  std::vector<float> dl = {0.25f, 0.25f, -1.5f, 2.0f};
  std::vector<float> loss_c(N), lse_c(N), loss_s(N), lse_s(N), d_c(N * V);
  crossentropy_forward(loss_c.data(), lse_c.data(), compact.data(), tgt.data(), N, V, V);
  crossentropy_forward(loss_s.data(), lse_s.data(), strided.data(), tgt.data(), N, V, ld);
  EXPECT_EQ(loss_s, loss_c);
  EXPECT_EQ(lse_s, lse_c);
  crossentropy_backward(d_c.data(), dl.data(), compact.data(), lse_c.data(), tgt.data(), N, V, V);
  std::vector<float> d_s(N * ld, 123.0f);
  crossentropy_backward(d_s.data(), dl.data(), strided.data(), lse_s.data(), tgt.data(), N, V, ld);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < V; ++c) ASSERT_EQ(d_s[n * ld + c], d_c[n * V + c]) << n << "," << c;
    for (int64_t c = V; c < ld; ++c) ASSERT_EQ(d_s[n * ld + c], 123.0f) << "padding written at " << n << "," << c;
  }
  using paratrain::testing::error_of;
  EXPECT_NE(error_of<InputError>([&] {
              crossentropy_forward(loss_s.data(), lse_s.data(), strided.data(), tgt.data(), N, V, V - 1);
            }).find("crossentropy_forward: row stride ld=76 is below the row length V=77"),
            std::string::npos);
  EXPECT_NE(error_of<InputError>([&] {
              crossentropy_backward(d_s.data(), dl.data(), strided.data(), lse_s.data(), tgt.data(), N, V, 10);
            }).find("crossentropy_backward: row stride ld=10 is below the row length V=77"),
            std::string::npos);
}

TEST(CrossEntropy, GradCheckAndBadTarget) {
  const int64_t N = 4, V = 9;
  auto logits = randn(N * V, 5);
  std::vector<int32_t> tgt = {3, kIgnoreIndex, 0, 8};
  std::vector<float> dl = {0.5f, 0.5f, -1.0f, 2.0f}, losses(N), lse(N), d(N * V);
  crossentropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, V);
  crossentropy_backward(d.data(), dl.data(), logits.data(), lse.data(), tgt.data(), N, V, V);
  auto loss = [&] {
    std::vector<float> l(N);
    crossentropy_forward(l.data(), nullptr, logits.data(), tgt.data(), N, V, V);
    return testing::dot(dl, l);
  };
  EXPECT_TRUE(grad_check(logits, d, loss, 1e-2f, 1e-3, 1e-2, 100));
  tgt[2] = 9;
  EXPECT_THROW(crossentropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, V), InputError);
  tgt[2] = -2;
  EXPECT_THROW(crossentropy_forward(losses.data(), lse.data(), logits.data(), tgt.data(), N, V, V), InputError);
}

}  // namespace
}  // namespace paratrain::kernels::cpu
