// PARATRAIN_TEST_BREAK_REDUCTION=NAME:STEP, a test hook of `paratrain verify`: data-parallel
// rank 1 perturbs its reduced gradient of parameter NAME after the reduction of optimizer step
// STEP (1-based; the N-th ParallelModel::finish()), as a broken all-reduce would. InputError
// when the value is malformed or NAME is no parameter of the model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"

namespace paratrain::train {

struct BreakReduction {
  std::string name;
  int64_t step = 0;
};

// The hook's value when set and this is data-parallel rank 1 (else nullopt).
std::optional<BreakReduction> break_reduction_hook(int dp_rank, const optim::NamedParams& params);
// Adds 1% of the tensor's largest |gradient| (at least 1e-3) to the first element this rank
// holds of it: its .grad, or with ZeRO its piece of the shard (`ddp` non-null).
void break_reduction(const BreakReduction& hook, const optim::NamedParams& params,
                     const parallel::DistributedDataParallel* ddp);

}  // namespace paratrain::train
