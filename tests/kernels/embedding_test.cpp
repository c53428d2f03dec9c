#include <cstring>
#include <string>
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

// The vocabulary-parallel lookup against the loop tensor parallelism ran before it (a masked
// memcpy per position, and per position in order `d[row][c] += g[n][c]`), bit for bit: rows
// [start, start+R) of V = 23 over the padded 3 x 8 rows, ids of every rank's range, the last
// rank's padding row never hit (ids stay below V).
TEST(Embedding, VocabParallelLookupIsTheMaskedLoop) {
  const int64_t N = 29, V = 23, R = 8, C = 19;
  std::vector<int32_t> tok(N);
  for (int64_t i = 0; i < N; ++i) tok[i] = static_cast<int32_t>((i * 5 + i / 7) % V);  // repeats
  const auto dout = randn(N * C, 7);
  for (int64_t start : {int64_t(0), R, 2 * R}) {
    SCOPED_TRACE("start " + std::to_string(start));
    const auto wte = randn(R * C, 8 + static_cast<uint32_t>(start));
    std::vector<float> want(N * C, 0.0f), want_d(R * C, 0.5f);
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = tok[n] - start;
      if (row < 0 || row >= R) continue;
      std::memcpy(&want[n * C], &wte[row * C], C * sizeof(float));
      for (int64_t c = 0; c < C; ++c) want_d[row * C + c] += dout[n * C + c];
    }
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      std::vector<float> out(N * C, -7.0f), d(R * C, 0.5f);  // forward overwrites, backward adds
      vocab_embedding_forward(out.data(), tok.data(), wte.data(), N, V, start, R, C);
      vocab_embedding_backward(d.data(), dout.data(), tok.data(), N, V, start, R, C);
      EXPECT_EQ(out, want);
      EXPECT_EQ(d, want_d);
    }
  }
  // Ids outside the whole vocabulary are an InputError before anything is written, on every rank.
  std::vector<float> out(N * C, 3.0f), d(R * C, 0.0f);
  const auto wte = randn(R * C, 9);
  for (int32_t bad : {static_cast<int32_t>(V), -1}) {
    tok[4] = bad;
    EXPECT_THROW(vocab_embedding_forward(out.data(), tok.data(), wte.data(), N, V, R, R, C), InputError);
    EXPECT_THROW(vocab_embedding_backward(d.data(), dout.data(), tok.data(), N, V, 0, R, C), InputError);
  }
  EXPECT_EQ(out, std::vector<float>(N * C, 3.0f));
  EXPECT_EQ(d, std::vector<float>(R * C, 0.0f));
}

}  // namespace
}  // namespace paratrain::kernels::cpu
