// Shared by the planner's files (src/parallel/planner/); not a public header.
#pragma once

#include <cstdint>
#include <vector>

#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/pipeline/partition.h"
#include "paratrain/parallel/pipeline/schedule.h"

namespace paratrain::parallel::planner {

// `bytes` rounded up to the caching allocator's size class (0 for nothing).
int64_t rounded(int64_t bytes);

namespace detail {
// check_schedule() of build_schedule({kind, p, m, v}), computed once per key (thread-safe);
// Error if it does not check.
const pipeline::ScheduleCheck& schedule_check(pipeline::ScheduleKind kind, int p, int m, int v);
// The S stages of consecutive blocks the planner assumes (balanced by compute: blocks 12 C^2,
// the head V C on the last stage).
std::vector<pipeline::StageRange> stage_ranges(const nn::GPTConfig& c, int stages);
}  // namespace detail

}  // namespace paratrain::parallel::planner
