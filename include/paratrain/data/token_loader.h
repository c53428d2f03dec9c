// Language-model batches from a token file, in the order of data_order.h.
//
// Windows: a file of N tokens is cut into W = floor((N - 1) / T) windows of T + 1 tokens
// with stride T (window i = tokens [i*T, i*T + T + 1)), T = block_size. A window gives one
// row: inputs = its first T tokens, targets = its last T (inputs shifted by one).
//
// TokenLoader: training batches. fill(step, k, r, inputs, targets) writes the B windows of
// optimizer step `step`, micro-step k, data-parallel rank r (DataOrder) into inputs and
// targets, each an I32 tensor of shape (B, T) (allocated when undefined or of another shape,
// reused otherwise).
//
// TokenEvalLoader: validation batches in file order, no shuffle: batch b holds windows
// [b*B, (b+1)*B); num_batches() = floor(W / B) (a partial last batch is dropped, so every
// batch has the same shape). Callers shard batches over ranks as they like.
//
// Both hold the TokenFile (a memory map) and are cheap to fill from; neither is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "paratrain/data/data_order.h"
#include "paratrain/data/token_file.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::data {

// Number of windows of block_size + 1 tokens (stride block_size) in n_tokens tokens.
int64_t num_windows(int64_t n_tokens, int64_t block_size);

class TokenLoader {
 public:
  // Opens `path`; InputError if it is invalid, if it has fewer windows than one global batch
  // (G = layout.global_batch()), or if block_size < 1.
  TokenLoader(const std::string& path, int64_t block_size, BatchLayout layout, uint64_t seed);
  // Over an already opened file (shared, e.g. between a loader and tests).
  TokenLoader(std::shared_ptr<const TokenFile> file, int64_t block_size, BatchLayout layout,
              uint64_t seed);

  // inputs/targets: I32 (B, T). See the header comment for which windows.
  void fill(int64_t step, int64_t micro_step, int64_t dp_rank, Tensor& inputs, Tensor& targets);
  // Windows DataOrder::items_range(step, k, first, count): inputs/targets I32 (count, T).
  void fill_range(int64_t step, int64_t micro_step, int64_t first, int64_t count, Tensor& inputs,
                  Tensor& targets);

  int64_t steps_per_epoch() const { return order_.steps_per_epoch(); }
  int64_t num_windows() const { return order_.n_items(); }
  int64_t block_size() const { return block_size_; }
  const BatchLayout& layout() const { return order_.layout(); }
  const TokenFile& file() const { return *file_; }
  // Tokens per optimizer step (G x T), for throughput figures.
  int64_t tokens_per_step() const { return layout().global_batch() * block_size_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t block_size_;
  DataOrder order_;
};

class TokenEvalLoader {
 public:
  // InputError if `path` is invalid or holds fewer than micro_batch windows.
  TokenEvalLoader(const std::string& path, int64_t block_size, int64_t micro_batch);
  TokenEvalLoader(std::shared_ptr<const TokenFile> file, int64_t block_size, int64_t micro_batch);

  int64_t num_batches() const { return num_windows_ / micro_batch_; }
  // Batch b in [0, num_batches()): windows [b*B, (b+1)*B) in file order.
  void fill(int64_t batch, Tensor& inputs, Tensor& targets) const;

  int64_t block_size() const { return block_size_; }
  int64_t micro_batch() const { return micro_batch_; }
  const TokenFile& file() const { return *file_; }

 private:
  std::shared_ptr<const TokenFile> file_;
  int64_t block_size_;
  int64_t micro_batch_;
  int64_t num_windows_;
};

// Fills row-major I32 (B, T) inputs/targets from windows `windows` of `file`.
void fill_windows(const TokenFile& file, int64_t block_size, const std::vector<int64_t>& windows,
                  Tensor& inputs, Tensor& targets);

}  // namespace paratrain::data
