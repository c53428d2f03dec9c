// --balance auto: uneven micro-batches for ranks of uneven speed.
//
// Each micro-step's block of B x dp items (data/data_order.h) is split among the ranks in
// contiguous ranges: rank r takes sizes[r] items starting after ranks 0..r-1's. The even
// split (sizes[r] = B) is exactly the DESIGN.md data order; any split covers the same items,
// so the global batch, and therefore the gradient, does not depend on it. A rank's loss is
// the mean over its own items, so its backward seed is scaled by sizes[r] / B: after the
// all-reduce's 1/dp the sum is the mean over the whole global batch.
//
// The balancer is fed every rank's compute time per step (the same gathered numbers on every
// rank, so every rank takes the same decisions without extra messages). Every `interval`
// steps it estimates each rank's speed (items per millisecond over the window) and, if a split
// in proportion to the speeds would shorten the slowest rank's time by at least `min_gain`,
// adopts it from step + 2 on (step + 1's batches are already being prefetched).
//
// Thread-safety: none; one per training loop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace paratrain::parallel {

// Integer sizes >= 1 summing to `total`, proportional to `speeds` (largest remainder).
// PT_CHECK: total >= speeds.size() >= 1, speeds > 0.
std::vector<int64_t> proportional_split(int64_t total, const std::vector<double>& speeds);

class LoadBalancer {
 public:
  LoadBalancer(int world, int64_t micro_batch, bool enabled, int64_t interval = 5, double min_gain = 0.03);

  // The split in force at `step` (sizes per rank, summing to micro_batch x world).
  const std::vector<int64_t>& sizes_at(int64_t step) const;
  int64_t first(int rank, int64_t step) const;
  int64_t count(int rank, int64_t step) const { return sizes_at(step)[static_cast<size_t>(rank)]; }
  // sizes[rank] / micro_batch: the factor on this rank's backward seed and reported loss.
  double weight(int rank, int64_t step) const;

  // After `step`: the milliseconds each rank computed in it (identical input on every
  // rank). Returns true when a new split was scheduled (for step + 2 on).
  bool observe(int64_t step, const std::vector<double>& compute_ms);

  bool enabled() const { return enabled_; }
  int64_t changes() const { return changes_; }

 private:
  int world_;
  int64_t micro_batch_;
  bool enabled_;
  int64_t interval_;
  double min_gain_;
  std::vector<int64_t> current_, next_;
  int64_t next_from_ = -1;  // step at which next_ takes over; -1 none
  std::vector<double> window_ms_;
  std::vector<int64_t> window_items_;
  int64_t window_steps_ = 0;
  int64_t changes_ = 0;
};

}  // namespace paratrain::parallel
