// The kernels of the CUDA embedding backward (embedding.cu), the part that makes its result the
// CPU's bit for bit: every table row adds its positions' gradient rows in position order.
//  - shard_keys: a key and a position per token position n: key = the row the token's id names
//    in the table's rows [start, start + R) (the whole vocabulary: start 0, R = V), R for an id
//    outside them (another shard's, or a bad id: sorted last, never added); pos = n.
//  - sort_end_bit(R): the bits a radix sort of those keys needs (keys 0..R all below
//    2^end_bit), so that sorting bits [0, end_bit) is sorting the keys. embedding.cu sorts the
//    (key, pos) pairs with CUB's stable radix sort; positions of one key keep their order.
//  - add_runs_in_order: one block per sorted index i; the block where a run of equal keys k < R
//    starts adds rows[k] += dout[pos[j]] for the run's j in order, one column per thread
//    (f32, the CPU's order of additions: its scatter walks the tokens in order).
//  - add_positions_in_order: dwpe[t, c] += dout[b, t, c] for b in order (one element per index).
// Sizes: N positions (< 2^31), R rows (< 2^31 - 1), C columns; rows (R, C), dout (N, C).
//
// This file holds only the kernels, so that they compile on the host over an emulation of the
// CUDA built-ins they use (threadIdx, blockIdx, blockDim, gridDim), as
// tests/kernels/embedding_emulated_test.cpp does, with std::stable_sort in CUB's place.
#pragma once

#include <cstdint>

#include "kernels/cuda/grid_stride.cuh"

namespace paratrain::kernels::cuda::emb {
namespace {

constexpr int kRunThreads = 128;  // add_runs_in_order's block

__host__ __device__ inline int sort_end_bit(int64_t R) {
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= R) ++end_bit;
  return end_bit;
}

using detail::grid_first;
using detail::grid_step;

__global__ void shard_keys(int32_t* keys, int32_t* pos, const int32_t* tokens, int64_t N, int64_t start, int64_t R) {
  for (int64_t n = grid_first(); n < N; n += grid_step()) {
    const int64_t row = static_cast<int64_t>(tokens[n]) - start;
    keys[n] = static_cast<int32_t>(row >= 0 && row < R ? row : R);
    pos[n] = static_cast<int32_t>(n);
  }
}

__global__ void add_runs_in_order(float* rows, const float* dout, const int32_t* keys, const int32_t* pos, int64_t N,
                                  int64_t R, int64_t C) {
  const int64_t i = blockIdx.x;
  const int32_t k = keys[i];
  if (k >= R || (i > 0 && keys[i - 1] == k)) return;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float acc = rows[static_cast<int64_t>(k) * C + c];
    for (int64_t j = i; j < N && keys[j] == k; ++j) acc += dout[static_cast<int64_t>(pos[j]) * C + c];
    rows[static_cast<int64_t>(k) * C + c] = acc;
  }
}

__global__ void add_positions_in_order(float* dwpe, const float* dout, int64_t B, int64_t T, int64_t C) {
  for (int64_t i = grid_first(); i < T * C; i += grid_step()) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += dout[b * T * C + i];
    dwpe[i] = acc;
  }
}

}  // namespace
}  // namespace paratrain::kernels::cuda::emb
