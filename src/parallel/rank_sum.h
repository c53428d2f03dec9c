// Private to the parallel layer: a double summed over a group's ranks, the same on every rank.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::parallel::detail {

// Every rank's `v` gathered (as its bits: the groups reduce no f64) and added in rank order
// 0..n-1, so the result is deterministic and identical on every rank. Collective over pg;
// `v` itself when pg is null or of one rank. Host buffers, also over nccl (it stages them).
inline double sum_in_rank_order(comm::ProcessGroup* pg, double v) {
  if (!pg || pg->size() == 1) return v;
  std::vector<int64_t> all(static_cast<size_t>(pg->size()));
  int64_t mine;
  std::memcpy(&mine, &v, sizeof mine);
  pg->allgather(&mine, all.data(), 1, DType::I64)->wait();
  double sum = 0.0;
  for (int64_t w : all) {
    double x;
    std::memcpy(&x, &w, sizeof x);
    sum += x;
  }
  return sum;
}

}  // namespace paratrain::parallel::detail
