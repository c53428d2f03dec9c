// The three checks of verify() (train/verify.h) on one step's tensors: the applied gradient
// against the exact mean of the local gradients, the replicas' parameter hashes, and the
// distributed parameters against the single-process reference's. The tensors may be on a
// GPU: each is read through a copy in host memory.
//
// Thread-safety: the training thread only. The collective ones (dp group `pg`, null for one
// process) must be called by every rank of the group in the same order.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallel_model.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/optim/optimizer.h"

namespace paratrain::train {

// Where each parameter sits in a flat vector of all of them (parameter order).
struct ParamLayout {
  explicit ParamLayout(const optim::NamedParams& params);
  int index(const std::string& name) const;  // -1 when unknown
  std::vector<std::string> names;
  std::vector<int64_t> offset, numel;
};

// The mean over the group of every rank's `local` (all-gathered, summed in f64 in rank order).
// Collective.
std::vector<double> exact_mean(const std::vector<float>& local, comm::ProcessGroup* pg);

// One tensor's difference from what it is checked against.
struct TensorDiff {
  double abs = 0;  // max |value - reference| over its elements
  double rel = 0;  // abs over the reference's largest |value| (abs itself when that is 0)
};
// Per parameter: what this rank is about to apply (its .grad, or with ZeRO its pieces of the
// gradient shard) against `mean` (the reference); the largest over every element any rank
// holds. Collective.
std::vector<TensorDiff> applied_vs_mean(ParallelModel& model, const ParamLayout& layout, const std::vector<double>& mean,
                                        comm::ProcessGroup* pg);

struct ReplicaMismatch {
  int tensor = -1;      // first parameter whose hash differs between ranks (-1: none)
  int other_rank = -1;  // the first rank whose hash differs from rank 0's
};
// 64-bit FNV-1a of every parameter's bytes, all-gathered over the group. Collective.
uint64_t fnv1a(const Tensor& t);
ReplicaMismatch compare_replica_hashes(const optim::NamedParams& params, comm::ProcessGroup* pg);

// Per parameter (layout order): flat `a` against flat `ref`. Local.
std::vector<TensorDiff> flat_vs_reference(const std::vector<double>& a, const std::vector<float>& ref,
                                         const ParamLayout& layout);
// Per parameter of `a` (in order): against the parameter of the same name in `b`. Local.
std::vector<TensorDiff> params_vs_reference(const optim::NamedParams& a, const optim::NamedParams& b);

}  // namespace paratrain::train
