// The data order contract (DESIGN.md, docs/data.md): which examples each optimizer step,
// micro-step and data-parallel rank sees, independent of how the job is laid out.
//
// A dataset is a list of W items (token windows or images), numbered 0..W-1. For each epoch
// e a permutation perm_e of 0..W-1 is drawn by Fisher-Yates with a paratrain::Generator
// seeded with epoch_seed(seed, e):
//
//   Generator g(epoch_seed(seed, e));  perm = [0, 1, ..., W-1]
//   for i = W-1 down to 1:  j = g.below(i + 1);  swap(perm[i], perm[j])
//
// The global batch has G = micro_batch x grad_accum x dp items. Each epoch contributes
// steps_per_epoch = floor(W / G) steps; the last W - steps_per_epoch x G positions of each
// permutation are dropped. Optimizer step s (0-based) lies in epoch e = s / steps_per_epoch
// and uses the items perm_e[q*G + i], i in [0, G), q = s mod steps_per_epoch. Within that
// global batch, slice j (items [j*B, (j+1)*B), B = micro_batch) goes to data-parallel rank
// r at micro-step k with j = k*dp + r.
//
// Consequence: for fixed (seed, B x grad_accum x dp) the items of a step do not depend on
// the layout, and one rank accumulating grad_accum*dp micro-batches sees the same items, in
// the same order of slices, as dp ranks with grad_accum micro-batches each.
//
// Thread-safety: a DataOrder caches one epoch's permutation and is not thread-safe; give
// each thread its own (they agree, being deterministic).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::data {

// Layout of a global batch. All fields >= 1.
struct BatchLayout {
  int64_t micro_batch = 1;  // B: items per micro-batch per rank
  int64_t grad_accum = 1;   // micro-steps per optimizer step
  int64_t dp = 1;           // data-parallel ranks
  int64_t global_batch() const { return micro_batch * grad_accum * dp; }
};

// The generator seed of epoch e's permutation:
//   epoch_seed = seed ^ (0x9E3779B97F4A7C15 * (e + 1))   (mod 2^64)
// (then expanded by Generator's splitmix64 seeding).
uint64_t epoch_seed(uint64_t seed, int64_t epoch);

// The permutation perm_e of 0..n-1 as defined above.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

class DataOrder {
 public:
  // n_items = W; InputError if W < G (not one full global batch) or a layout field < 1.
  // `what` names the dataset in that message ("token file x.bin", "Fashion-MNIST train").
  DataOrder(int64_t n_items, BatchLayout layout, uint64_t seed, const std::string& what = "dataset");

  int64_t n_items() const { return n_; }
  const BatchLayout& layout() const { return layout_; }
  uint64_t seed() const { return seed_; }
  int64_t steps_per_epoch() const { return n_ / layout_.global_batch(); }
  int64_t epoch_of_step(int64_t step) const { return step / steps_per_epoch(); }

  // The B item indices of optimizer step `step`, micro-step k in [0, grad_accum), rank r
  // in [0, dp). PT_CHECK on out-of-range k or r; step >= 0 (any epoch).
  std::vector<int64_t> items(int64_t step, int64_t micro_step, int64_t dp_rank);
  // Items [first, first + count) of micro-step k's block of the step: the B x dp items of
  // slices j = k*dp .. k*dp + dp - 1, concatenated. items(step, k, r) is
  // items_range(step, k, r*B, B); with uneven micro-batches (--balance auto) rank r takes
  // the range that starts after the items of ranks 0..r-1. PT_CHECK on a range outside the
  // block.
  std::vector<int64_t> items_range(int64_t step, int64_t micro_step, int64_t first, int64_t count);
  // All G item indices of a step, slice after slice (j = 0, 1, ...).
  std::vector<int64_t> global_items(int64_t step);

 private:
  const std::vector<int64_t>& perm_for(int64_t epoch);
  int64_t n_;
  BatchLayout layout_;
  uint64_t seed_;
  int64_t cached_epoch_ = -1;
  std::vector<int64_t> perm_;
};

}  // namespace paratrain::data
