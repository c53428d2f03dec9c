// The CUDA embedding backward's kernels (kernels/cuda/embedding_kernels.cuh) run on the CPU over
// the emulation of the CUDA built-ins (tests/kernels/cuda_emulation.h), with embedding.cu's
// launch shapes and its steps: keys and positions, a stable sort of the pairs on bits
// [0, sort_end_bit(R)) (std::stable_sort on those bits standing in for CUB's radix sort), then a
// block per sorted index. Against the CPU kernels (kernels/cpu/embedding.h), bit for bit: the
// whole table with repeated ids (long runs, more columns than a block's threads), prefilled
// gradients (it adds), a vocabulary shard (ids of other shards add nothing), bad ids (skipped:
// the CPU throws, so it is compared with them left out), and the encoder's positional part.
// A sort on too few bits mixes the last key (other shards' ids) into a row and fails it.
// The GPU runs the same kernels (CudaLayerKernels.Embedding*); this checks them without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/test_util.h"
#include "paratrain/kernels/cpu/embedding.h"
#include "support/expect_values.h"

namespace {
namespace emb = paratrain::kernels::cuda::emb;
namespace cpu = paratrain::kernels::cpu;
using paratrain::kernels::cpu::testing::uniform;

using paratrain::kernels::cuda::detail::grid_for;  // embedding.cu's grid-stride launches (grid_stride.cuh)
using paratrain::kernels::cuda::detail::kThreads;
using paratrain::test::expect_same_bits;

// embedding.cu's ordered_scatter_add: rows (R, C) += dout rows of the ids in [start, start + R).
void emulated_scatter_add(float* rows, const float* dout, const int32_t* tokens, int64_t N, int64_t start, int64_t R,
                          int64_t C) {
  std::vector<int32_t> keys(N), pos(N);
  launch_serial(grid_for(N), 1, kThreads, [&] { emb::shard_keys(keys.data(), pos.data(), tokens, N, start, R); });
  // CUB's SortPairs on bits [0, end_bit): stable, so equal keys keep their positions' order.
  const uint32_t mask = (uint32_t{1} << emb::sort_end_bit(R)) - 1;
  std::vector<int32_t> order(N);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return (static_cast<uint32_t>(keys[a]) & mask) < (static_cast<uint32_t>(keys[b]) & mask);
  });
  std::vector<int32_t> sorted_keys(N), sorted_pos(N);
  for (int64_t i = 0; i < N; ++i) {
    sorted_keys[i] = keys[order[i]] & static_cast<int32_t>(mask);
    sorted_pos[i] = pos[order[i]];
  }
  launch_serial(static_cast<unsigned>(N), 1, emb::kRunThreads,
                [&] { emb::add_runs_in_order(rows, dout, sorted_keys.data(), sorted_pos.data(), N, R, C); });
}

// N ids over a vocabulary of V, a few of them repeated many times (long runs).
std::vector<int32_t> skewed_ids(int64_t N, int64_t V, uint32_t seed) {
  const auto u = uniform(static_cast<size_t>(N), seed, 0, 1);
  std::vector<int32_t> ids(N);
  for (int64_t n = 0; n < N; ++n)
    ids[n] = static_cast<int32_t>(u[n] < 0.4f ? 2 : u[n] < 0.6f ? V - 1 : static_cast<int64_t>(u[n] * V) % V);
  return ids;
}

TEST(EmbeddingEmulated, BackwardAddsEachRowsPositionsInTheCpusOrder) {
  for (const int64_t C : std::initializer_list<int64_t>{1, 5, 300}) {  // 300: more columns than the block's 128 threads
    SCOPED_TRACE("C=" + std::to_string(C));
    const int64_t N = 157, V = 13;
    const auto ids = skewed_ids(N, V, 1);
    // Values of wide range, so that another order of additions changes the bits.
    auto dout = uniform(static_cast<size_t>(N * C), 2, -1, 1);
    for (size_t i = 0; i < dout.size(); i += 7) dout[i] *= 4096.0f;
    const auto init = uniform(static_cast<size_t>(V * C), 3, -2, 2);  // it adds to what is there
    std::vector<float> want = init, got = init;
    cpu::embedding_backward(want.data(), dout.data(), ids.data(), N, V, C);
    emulated_scatter_add(got.data(), dout.data(), ids.data(), N, 0, V, C);
    expect_same_bits(got, want, "dwte");
  }
}

TEST(EmbeddingEmulated, VocabularyShardTakesOnlyItsRows) {
  const int64_t N = 90, V = 40, C = 9;
  const auto ids = skewed_ids(N, V, 4);
  const auto dout = uniform(static_cast<size_t>(N * C), 5, -1, 1);
  const std::vector<std::pair<int64_t, int64_t>> shards = {{0, 10}, {10, 10}, {30, 12}, {0, 40}, {2, 1}};
  for (const auto& [start, R] : shards) {
    SCOPED_TRACE("start=" + std::to_string(start) + " R=" + std::to_string(R));
    const auto init = uniform(static_cast<size_t>(R * C), 6, -1, 1);
    std::vector<float> want = init, got = init;
    cpu::vocab_embedding_backward(want.data(), dout.data(), ids.data(), N, V, start, R, C);
    emulated_scatter_add(got.data(), dout.data(), ids.data(), N, start, R, C);
    expect_same_bits(got, want, "shard rows");
  }
}

TEST(EmbeddingEmulated, BadIdsAddNothing) {
  const int64_t V = 8, C = 4;
  std::vector<int32_t> ids = {3, -1, 3, 8, 0, 1000, 7, 3};
  const int64_t N = static_cast<int64_t>(ids.size());
  const auto dout = uniform(static_cast<size_t>(N * C), 7, -1, 1);
  std::vector<int32_t> good_ids;
  std::vector<float> good_dout;
  for (int64_t n = 0; n < N; ++n)
    if (ids[n] >= 0 && ids[n] < V) {
      good_ids.push_back(ids[n]);
      good_dout.insert(good_dout.end(), dout.begin() + n * C, dout.begin() + (n + 1) * C);
    }
  std::vector<float> want(V * C, 0.5f), got(V * C, 0.5f);
  cpu::embedding_backward(want.data(), good_dout.data(), good_ids.data(), static_cast<int64_t>(good_ids.size()), V, C);
  emulated_scatter_add(got.data(), dout.data(), ids.data(), N, 0, V, C);
  expect_same_bits(got, want, "dwte with bad ids");
}

TEST(EmbeddingEmulated, SortBitsHoldEveryKey) {
  // Keys run from 0 to R (R: the ids outside the rows), all below 2^end_bit, within 31 bits.
  const std::vector<int64_t> sizes = {1, 2, 3, 4, 7, 8, 255, 256, 50257,
                                      50304, (int64_t{1} << 30) - 1, int64_t{1} << 30};
  for (const int64_t R : sizes) {
    const int e = emb::sort_end_bit(R);
    EXPECT_LT(R, int64_t{1} << e) << "R=" << R;
    EXPECT_LE(e, 31) << "R=" << R;
    EXPECT_TRUE(e == 1 || R >= int64_t{1} << (e - 1)) << "R=" << R << ": more bits than the keys need";
  }
}

TEST(EmbeddingEmulated, PositionalGradientSumsTheBatchInOrder) {
  const int64_t B = 5, T = 7, C = 300;  // T * C spans two blocks of the grid-stride loop
  auto dout = uniform(static_cast<size_t>(B * T * C), 8, -1, 1);
  for (size_t i = 0; i < dout.size(); i += 5) dout[i] *= 1000.0f;
  const auto init = uniform(static_cast<size_t>(T * C), 9, -1, 1);
  std::vector<float> want = init, got = init;
  cpu::positional_backward(want.data(), dout.data(), B, T, C);
  launch_serial(grid_for(T * C), 1, kThreads, [&] { emb::add_positions_in_order(got.data(), dout.data(), B, T, C); });
  expect_same_bits(got, want, "dwpe");
}

}  // namespace
