// The rank-ordered reductions as steps of direct messages (comm/algorithms/rank_ordered_plan.h).
#include "comm/algorithms/rank_ordered_plan.h"

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {
namespace {

// Adds a transfer unless it is empty (the peer leaves out the same one).
void add(std::vector<Transfer>& list, int peer, PlanBuffer b, size_t offset, size_t count) {
  if (count > 0) list.push_back({peer, b, offset, count});
}

PlanStep combine_step(size_t own, size_t out, size_t count, size_t stride) {
  PlanStep s;
  s.combines = true;
  s.combine = {own, out, count, stride};
  return s;
}

}  // namespace

RankOrderedPlan rank_ordered_allreduce_plan(int n, int r, size_t count) {
  const Blocks chunks{count, static_cast<size_t>(n)};
  const size_t stride = chunks.length(0), mine = chunks.length(r), own = chunks.offset(r);
  RankOrderedPlan plan;
  plan.slot_elements = static_cast<size_t>(n) * stride;
  PlanStep scatter, gather;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    add(scatter.sends, p, PlanBuffer::kInput, chunks.offset(p), chunks.length(p));
    add(scatter.recvs, p, PlanBuffer::kSlots, p * stride, mine);
    add(gather.sends, p, PlanBuffer::kOutput, own, mine);
    add(gather.recvs, p, PlanBuffer::kOutput, chunks.offset(p), chunks.length(p));
  }
  plan.steps = {scatter, combine_step(own, own, mine, stride), gather};
  return plan;
}

RankOrderedPlan rank_ordered_reduce_scatter_plan(int n, int r, size_t count) {
  RankOrderedPlan plan;
  plan.slot_elements = static_cast<size_t>(n) * count;
  PlanStep scatter;
  for (int p = 0; p < n; ++p) {
    if (p == r) continue;
    add(scatter.sends, p, PlanBuffer::kInput, p * count, count);
    add(scatter.recvs, p, PlanBuffer::kSlots, p * count, count);
  }
  plan.steps = {scatter, combine_step(r * count, 0, count, count)};
  return plan;
}

RankOrderedPlan rank_ordered_reduce_plan(int n, int r, size_t count, int root) {
  RankOrderedPlan plan;
  PlanStep to_root;
  if (r != root) {
    add(to_root.sends, root, PlanBuffer::kInput, 0, count);
    plan.steps = {to_root};
    return plan;
  }
  plan.slot_elements = static_cast<size_t>(n) * count;
  for (int p = 0; p < n; ++p)
    if (p != r) add(to_root.recvs, p, PlanBuffer::kSlots, p * count, count);
  plan.steps = {to_root, combine_step(0, 0, count, count)};
  return plan;
}

}  // namespace paratrain::comm::algorithms
