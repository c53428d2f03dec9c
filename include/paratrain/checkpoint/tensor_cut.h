// Tensor cuts: how one tensor of the whole model is divided among the ranks of a
// tensor-parallel group (Megatron-style), and the two copies between the whole tensor and its
// parts. The checkpoint layer uses them to store a tensor-parallel run's shards and to load
// them back as the whole model (docs/checkpoints.md, "Tensor-parallel checkpoints"), so that
// a checkpoint is layout-free (DESIGN.md).
//
// A cut names one dimension `dim`; the tensor's size S along it (after padding, below) is
// divided into `blocks` equal consecutive blocks, each block into `count` equal parts, and
// part i is the concatenation along dim of part i of every block. blocks = 1 is the plain
// Megatron cut (column-parallel: dim 0 of a [out, in] weight, or dim 1 of GPT-2's Conv1D
// [in, out] weight; row-parallel the other one). blocks = 3 is GPT-2's packed c_attn
// [C, 3C] weight / [3C] bias, whose q | k | v blocks are each cut by heads, so that part i
// holds q, k and v of the same heads. `full` > 0 says the whole tensor has `full` rows along
// dim and is padded with zero rows to the next multiple of `count` before cutting (a
// vocabulary of 50257 split over 2 ranks: parts of 25129 rows, the last row of part 1 zero);
// joining drops the padding. Padding and blocks > 1 do not combine.
//
// cut_tensor / join_tensor copy contiguous runs with memcpy (one run per block per index of
// the dimensions before dim) and work for every dtype (f32, bf16, f16 and the integer ones),
// for CPU tensors. Non-contiguous inputs are made contiguous first.
//
// Thread-safety: pure functions of their arguments; TensorCut is a plain value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::checkpoint {

// How one tensor of the whole model is cut among the `count` ranks of a tensor-parallel group.
struct TensorCut {
  int dim = -1;       // -1: replicated (every rank holds the whole tensor)
  int blocks = 1;     // dim is `blocks` equal consecutive blocks (GPT-2's packed c_attn q|k|v: 3); each block is
                      // cut into `count` equal parts and part i = concat(block0 part i, block1 part i, ...) along dim
  int64_t full = 0;   // when > 0: the whole tensor's unpadded size along dim; it is padded with zeros to
                      // the next multiple of count before cutting (GPT vocabulary padding); join drops the padding
  bool replicated() const { return dim < 0; }
  // Compact text: "<dim>", then "x<blocks>" when blocks != 1, then "/<full>" when full > 0
  // ("1", "1x3", "0/50257"); "-" when replicated (blocks and full are then not written).
  std::string str() const;
  // Inverse of str(); InputError on malformed text (negative dim other than "-", blocks < 1,
  // full < 0, trailing characters). parse(c.str()) == c for every cut with dim >= 0 and
  // for the default (replicated) cut.
  static TensorCut parse(const std::string&);
  bool operator==(const TensorCut&) const = default;
};

// Part `index` of `count` of `whole` (a fresh contiguous CPU tensor, same dtype; replicated:
// a copy of the whole tensor). InputError naming the shapes when dim is out of range, when the
// size along dim (after padding) is not divisible by count * blocks, when blocks > 1 is
// combined with padding, when `full` differs from the whole tensor's size along dim, or when
// count < 1 or index is not in [0, count).
Tensor cut_tensor(const Tensor& whole, const TensorCut& cut, int index, int count);

// The inverse of cut_tensor over all count = parts.size() parts (parts[i] = part i; replicated:
// a copy of parts[0], the others are not read). InputError naming the shapes when there are no
// parts, when the parts disagree in shape or dtype, when dim is out of range, when a part's
// size along dim is not divisible by blocks, or when `full` does not fit the padded size
// (the padding must be less than count rows).
Tensor join_tensor(const std::vector<Tensor>& parts, const TensorCut& cut);

}  // namespace paratrain::checkpoint
