// DistributedSampler: torch's layout (pad with the head or drop the tail, then a strided
// split) over the data-order contract's seeded permutation.
#include "paratrain/data/distributed_sampler.h"

#include <numeric>

#include "paratrain/base/error.h"
#include "paratrain/data/data_order.h"

namespace paratrain::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : n_(dataset_size), replicas_(num_replicas), rank_(rank), options_(options) {
  if (num_replicas < 1) PT_THROW(InputError, "DistributedSampler: num_replicas must be at least 1 (got ", num_replicas, ")");
  if (rank < 0 || rank >= num_replicas)
    PT_THROW(InputError, "DistributedSampler: rank ", rank, " is outside [0, ", num_replicas, ")");
  if (dataset_size < 1) PT_THROW(InputError, "DistributedSampler: the dataset is empty (", dataset_size, " items)");
  if (options.drop_last && dataset_size < num_replicas)
    PT_THROW(InputError, "DistributedSampler: with drop_last, a dataset of ", dataset_size, " items gives none to each of ",
             num_replicas, " replicas; use a larger dataset, fewer replicas, or padding (drop_last = false)");
  num_samples_ = options.drop_last ? n_ / replicas_ : (n_ + replicas_ - 1) / replicas_;
}

void DistributedSampler::set_epoch(int64_t epoch) {
  if (epoch < 0) PT_THROW(InputError, "DistributedSampler: epoch must be >= 0 (got ", epoch, ")");
  epoch_ = epoch;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = epoch_permutation(n_, options_.seed, epoch_);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Position p of the padded/cut order is order[p mod n]: the head repeated as often as needed.
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t p = rank_; p < total_size(); p += replicas_) mine.push_back(order[static_cast<size_t>(p % n_)]);
  return mine;
}

}  // namespace paratrain::data
