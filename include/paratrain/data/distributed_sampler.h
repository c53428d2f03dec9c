// DistributedSampler: which dataset indices one data-parallel replica reads in an epoch,
// with torch.utils.data.DistributedSampler's layout, for a user's own training loop.
// (paratrain's built-in loop follows the data-order contract of data_order.h instead.)
//
// For a dataset of n items and R replicas, each replica gets num_samples() indices per
// epoch: ceil(n / R), or with drop_last floor(n / R). The epoch's order is 0..n-1, or with
// shuffle the permutation epoch_permutation(n, seed, epoch) of data_order.h (Fisher-Yates
// over paratrain's Generator: reproducible from (seed, epoch), the same on every replica,
// different from epoch to epoch; not torch's randperm, whose generator is torch's own).
// That order is cut to total_size() = num_samples() x R positions: with drop_last its tail
// is dropped; otherwise it is padded by repeating its head (as often as needed), so every
// replica reads the same number of items. Replica r takes positions r, r + R, r + 2R, ...
// The replicas' indices together are then each item exactly once (no padding, no drop) or
// the order plus its repeated head (padding) or minus its tail (drop_last), as in torch.
//
// Unlike torch, a sampler that would give the replicas no item (an empty dataset, or
// drop_last with fewer items than replicas) is an InputError at construction.
//
// Thread-safety: a value type; indices() is const and may be called from several threads,
// set_epoch() must not race with it. Cheap to copy.
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::data {

struct DistributedSamplerOptions {
  bool shuffle = true;     // a fresh seeded permutation each epoch (set_epoch)
  uint64_t seed = 0;       // must be the same on every replica
  bool drop_last = false;  // drop the tail instead of padding with the head
};

class DistributedSampler {
 public:
  // InputError for dataset_size < 1, num_replicas < 1, rank outside [0, num_replicas), or
  // drop_last with dataset_size < num_replicas.
  DistributedSampler(int64_t dataset_size, int num_replicas, int rank, DistributedSamplerOptions options = {});

  // Chooses the epoch whose order indices() returns (as torch's set_epoch: call it before each
  // epoch, with the same value on every replica). InputError for a negative epoch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This replica's indices for the current epoch, num_samples() of them, in reading order.
  std::vector<int64_t> indices() const;

  int64_t dataset_size() const { return n_; }
  int num_replicas() const { return replicas_; }
  int rank() const { return rank_; }
  int64_t num_samples() const { return num_samples_; }          // per replica (torch's len())
  int64_t total_size() const { return num_samples_ * replicas_; }  // over all replicas
  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t n_;
  int replicas_;
  int rank_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
  int64_t epoch_ = 0;
};

}  // namespace paratrain::data
