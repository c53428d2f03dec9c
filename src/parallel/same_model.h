// Every rank of a data-parallel group must hold the same model: the check both
// DistributedDataParallel and FullyShardedDataParallel run at construction. Internal to the
// parallel layer.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel::detail {

// Collective over `pg`: compares every rank's parameter list (names, dtypes, shapes, in
// order) through fingerprints. On a difference, InputError on every rank, "<who>: the ranks
// hold different models; first difference at parameter #i: rank 0 has ..., rank r has ...".
void check_same_model(comm::ProcessGroup& pg, const std::vector<std::pair<std::string, Tensor>>& params,
                      const std::string& who);

}  // namespace paratrain::parallel::detail
