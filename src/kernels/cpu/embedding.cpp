// Embedding lookups. The backward is parallel over columns (each thread owns a range of
// C and walks all tokens in order): deterministic and race-free.
#include "paratrain/kernels/cpu/embedding.h"

#include <cstring>

#include "kernels/cpu/parallel.h"
#include "paratrain/base/error.h"

namespace paratrain::kernels::cpu {
namespace {
void check_tokens(const int32_t* tokens, int64_t N, int64_t V, const char* who) {
  for (int64_t n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V)
      PT_THROW(InputError, who, ": token id ", tokens[n], " at position ", n,
               " is outside the vocabulary [0,", V, ")");
}
void check_sizes(int64_t N, int64_t V, int64_t C, const char* who) {
  if (N < 0 || V <= 0 || C < 0)
    PT_THROW(InputError, who, ": bad sizes N=", N, " V=", V, " C=", C);
}
constexpr int64_t kGrainElems = 1 << 14;
int64_t col_grain(int64_t rows) { return std::max<int64_t>(16, kGrainElems / std::max<int64_t>(rows, 1)); }
}  // namespace

void embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                       int64_t V, int64_t C) {
  check_sizes(N, V, C, "embedding_forward");
  check_tokens(tokens, N, V, "embedding_forward");
  detail::parallel_for(N, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) std::memcpy(out + n * C, wte + tokens[n] * C, C * sizeof(float));
  }, 1);
}

void embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                        int64_t V, int64_t C) {
  check_sizes(N, V, C, "embedding_backward");
  check_tokens(tokens, N, V, "embedding_backward");
  detail::parallel_for(C, col_grain(N), [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      float* d = dwte + tokens[n] * C;
      const float* g = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  });
}

void vocab_embedding_forward(float* out, const int32_t* tokens, const float* wte, int64_t N,
                             int64_t V, int64_t start, int64_t R, int64_t C) {
  check_sizes(N, V, C, "vocab_embedding_forward");
  if (start < 0 || R < 0) PT_THROW(InputError, "vocab_embedding_forward: bad rows start=", start, " R=", R);
  check_tokens(tokens, N, V, "vocab_embedding_forward");
  detail::parallel_for(N, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const int64_t row = tokens[n] - start;
      if (row >= 0 && row < R)
        std::memcpy(out + n * C, wte + row * C, C * sizeof(float));
      else
        std::memset(out + n * C, 0, C * sizeof(float));
    }
  }, 1);
}

void vocab_embedding_backward(float* dwte, const float* dout, const int32_t* tokens, int64_t N,
                              int64_t V, int64_t start, int64_t R, int64_t C) {
  check_sizes(N, V, C, "vocab_embedding_backward");
  if (start < 0 || R < 0) PT_THROW(InputError, "vocab_embedding_backward: bad rows start=", start, " R=", R);
  check_tokens(tokens, N, V, "vocab_embedding_backward");
  detail::parallel_for(C, col_grain(N), [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = tokens[n] - start;
      if (row < 0 || row >= R) continue;
      float* d = dwte + row * C;
      const float* g = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  });
}

void positional_add(float* out, const float* wpe, int64_t B, int64_t T, int64_t C) {
  if (B < 0 || T < 0 || C < 0) PT_THROW(InputError, "positional_add: negative size");
  detail::parallel_for(B * T, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t bt = b; bt < e; ++bt) {
      float* o = out + bt * C;
      const float* w = wpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] += w[c];
    }
  }, 1);
}

void positional_backward(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  if (B < 0 || T < 0 || C < 0) PT_THROW(InputError, "positional_backward: negative size");
  // Parallel over t (each row of dwpe has one owner); b summed in order.
  detail::parallel_for(T, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(B * C, 1)),
                       [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* d = dwpe + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const float* g = dout + (b * T + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) d[c] += g[c];
      }
    }
  }, 1);
}

void encoder_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                     int64_t B, int64_t T, int64_t V, int64_t C) {
  check_sizes(B * T, V, C, "encoder_forward");
  if (B < 0 || T < 0) PT_THROW(InputError, "encoder_forward: negative size");
  check_tokens(tokens, B * T, V, "encoder_forward");
  detail::parallel_for(B * T, std::max<int64_t>(1, kGrainElems / std::max<int64_t>(C, 1)),
                       [&](int64_t b, int64_t e) {
    for (int64_t bt = b; bt < e; ++bt) {
      float* o = out + bt * C;
      const float* w = wte + tokens[bt] * C;
      const float* p = wpe + (bt % T) * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = w[c] + p[c];
    }
  }, 1);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                      int64_t B, int64_t T, int64_t V, int64_t C) {
  if (dwte) embedding_backward(dwte, dout, tokens, B * T, V, C);
  if (dwpe) positional_backward(dwpe, dout, B, T, C);
}

}  // namespace paratrain::kernels::cpu
