// Cutting a model of L consecutive blocks into S pipeline stages (with p ranks and v chunks
// per rank, S = p x v): each stage a run of consecutive blocks, the embedding on the first,
// the final norm, head and loss on the last.
//
// balance_stages() picks the cut that makes the costliest stage as cheap as possible (an
// exact linear-partition search), with a block's cost its parameter count (the default,
// `--pp-balance params`) or its measured time (`--pp-balance time`); the first and last
// stage also carry the costs of what sits outside the blocks. Among the cuts with that
// maximum, the one with the smallest sum of squared stage costs (the other stages balanced
// too); the search is deterministic, so every rank computes the same cut.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::parallel::pipeline {

struct StageRange {
  int first_block = 0, end_block = 0;  // blocks [first_block, end_block)
  double cost = 0;                     // the blocks' costs, plus first_extra / last_extra
  bool has_embedding() const { return first_block == 0; }
};

// InputError when stages < 1, stages > the number of blocks (every stage needs a block), or
// a cost is negative.
std::vector<StageRange> balance_stages(const std::vector<double>& block_cost, double first_extra, double last_extra,
                                       int stages);

// "blocks 0-2 | 3-5" style description, for the progress line and `paratrain plan`.
std::string describe_stages(const std::vector<StageRange>& stages);

}  // namespace paratrain::parallel::pipeline
