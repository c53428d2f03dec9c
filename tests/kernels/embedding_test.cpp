#include <vector>

#include "kernels/test_util.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::kernels::cpu {
namespace {
using testing::all_close;
using testing::randn;

TEST(Embedding, ForwardBackwardAndPositions) {
  const int64_t B = 3, T = 5, V = 11, C = 37;
  auto wte = randn(V * C, 1), wpe = randn((T + 2) * C, 2), dout = randn(B * T * C, 3);
  std::vector<int32_t> tok(B * T);
  for (int64_t i = 0; i < B * T; ++i) tok[i] = static_cast<int32_t>((i * 3) % 4);  // repeats
  std::vector<float> out(B * T * C), enc(B * T * C);
  embedding_forward(out.data(), tok.data(), wte.data(), B * T, V, C);
  positional_add(out.data(), wpe.data(), B, T, C);
  encoder_forward(enc.data(), tok.data(), wte.data(), wpe.data(), B, T, V, C);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        float want = wte[tok[b * T + t] * C + c] + wpe[t * C + c];
        EXPECT_EQ(out[(b * T + t) * C + c], want);
        EXPECT_EQ(enc[(b * T + t) * C + c], want);
      }
  std::vector<double> wdte(V * C, 1.0), wdpe(T * C, 1.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        wdte[tok[b * T + t] * C + c] += dout[(b * T + t) * C + c];
        wdpe[t * C + c] += dout[(b * T + t) * C + c];
      }
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    std::vector<float> dte(V * C, 1.0f), dpe(T * C, 1.0f), dte2(V * C, 1.0f), dpe2(T * C, 1.0f);
    embedding_backward(dte.data(), dout.data(), tok.data(), B * T, V, C);
    positional_backward(dpe.data(), dout.data(), B, T, C);
    encoder_backward(dte2.data(), dpe2.data(), dout.data(), tok.data(), B, T, V, C);
    EXPECT_TRUE(all_close(dte, wdte, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dpe, wdpe, 1e-5, 1e-5));
    EXPECT_EQ(dte, dte2);
    EXPECT_EQ(dpe, dpe2);
  }
  tok[4] = static_cast<int32_t>(V);
  EXPECT_THROW(embedding_forward(out.data(), tok.data(), wte.data(), B * T, V, C), InputError);
  tok[4] = -1;
  std::vector<float> untouched(V * C, 0.0f);
  EXPECT_THROW(embedding_backward(untouched.data(), dout.data(), tok.data(), B * T, V, C), InputError);
  EXPECT_EQ(untouched, std::vector<float>(V * C, 0.0f));
}

}  // namespace
}  // namespace paratrain::kernels::cpu
