// The rank-ordered (deterministic) reductions as steps of direct messages and one combine,
// for an engine whose sends and receives run as groups with no order among a group's
// messages (nccl's ncclGroupStart/End): what each rank sends, receives and combines, as
// element offsets into named buffers. The nccl backend enqueues these steps
// (nccl_process_group.cpp); tests/comm/rank_ordered_plan_test.cpp runs them on host memory
// against the in-order result, so the offsets and pairings are checked without a GPU.
//
// Buffers: kInput (allreduce/reduce: the buffer; reduce_scatter: in, n blocks of count),
// kOutput (allreduce/reduce: the buffer again; reduce_scatter: out), kSlots (scratch of
// n * slot_stride elements: the contribution of rank p lands at p * slot_stride).
// Steps, in order: a group of transfers (every send meets one receive of the same count on
// its peer in the same step of the peer's plan; empty transfers are left out on both sides),
// or a combine: out[i] = x_0[i] op ... op x_(n-1)[i] in rank order, x_rank from kInput at
// own_offset, the others from the slots (the accumulator rules of reduce_kernels.h).
//  - allreduce: chunk c of n balanced chunks (Blocks) belongs to rank c; step 1 sends chunk
//    p to rank p, step 2 combines this rank's chunk in place, step 3 sends it to every rank.
//  - reduce_scatter: step 1 sends block p to rank p; step 2 combines into kOutput.
//  - reduce: every rank but the root sends its buffer to the root; the root combines.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <vector>

namespace paratrain::comm::algorithms {

enum class PlanBuffer { kInput, kOutput, kSlots };

struct Transfer {
  int peer;
  PlanBuffer buffer;
  size_t offset, count;  // elements
};

struct Combine {
  size_t own_offset;   // in kInput: this rank's contribution
  size_t out_offset;   // in kOutput
  size_t count;
  size_t slot_stride;  // rank p's contribution is kSlots + p * slot_stride
};

struct PlanStep {
  std::vector<Transfer> sends, recvs;  // a group of transfers, when `combines` is false
  bool combines = false;
  Combine combine{};
};

struct RankOrderedPlan {
  size_t slot_elements = 0;  // kSlots needs this many elements
  std::vector<PlanStep> steps;
};

// Rank r of n (n >= 2) reducing `count` elements.
RankOrderedPlan rank_ordered_allreduce_plan(int n, int r, size_t count);
RankOrderedPlan rank_ordered_reduce_scatter_plan(int n, int r, size_t count);
RankOrderedPlan rank_ordered_reduce_plan(int n, int r, size_t count, int root);

}  // namespace paratrain::comm::algorithms
