#include "paratrain/data/data_order.h"

#include <numeric>
#include <utility>

#include "paratrain/base/error.h"
#include "paratrain/tensor/random.h"

namespace paratrain::data {

uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return seed ^ (0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(epoch) + 1));
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  Generator g(epoch_seed(seed, epoch));
  for (int64_t i = n - 1; i >= 1; --i) {
    auto j = static_cast<int64_t>(g.below(static_cast<uint64_t>(i + 1)));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

DataOrder::DataOrder(int64_t n_items, BatchLayout layout, uint64_t seed, const std::string& what)
    : n_(n_items), layout_(layout), seed_(seed) {
  if (layout.micro_batch < 1 || layout.grad_accum < 1 || layout.dp < 1)
    PT_THROW(InputError, "bad batch layout for ", what, ": micro-batch ", layout.micro_batch, ", grad-accum ",
             layout.grad_accum, ", dp ", layout.dp, " (each must be at least 1)");
  if (n_items < layout.global_batch())
    PT_THROW(InputError, what, " has ", n_items, " examples, fewer than one global batch of ", layout.global_batch(),
             " (micro-batch ", layout.micro_batch, " x grad-accum ", layout.grad_accum, " x dp ", layout.dp, ")");
}

const std::vector<int64_t>& DataOrder::perm_for(int64_t epoch) {
  if (epoch != cached_epoch_) {
    perm_ = epoch_permutation(n_, seed_, epoch);
    cached_epoch_ = epoch;
  }
  return perm_;
}

std::vector<int64_t> DataOrder::items(int64_t step, int64_t micro_step, int64_t dp_rank) {
  PT_CHECK(dp_rank >= 0 && dp_rank < layout_.dp, "dp rank ", dp_rank, " outside [0, ", layout_.dp, ")");
  return items_range(step, micro_step, dp_rank * layout_.micro_batch, layout_.micro_batch);
}

std::vector<int64_t> DataOrder::items_range(int64_t step, int64_t micro_step, int64_t first, int64_t count) {
  PT_CHECK(step >= 0, "negative step ", step);
  PT_CHECK(micro_step >= 0 && micro_step < layout_.grad_accum, "micro-step ", micro_step, " outside [0, ",
           layout_.grad_accum, ")");
  const int64_t block = layout_.micro_batch * layout_.dp;
  PT_CHECK(first >= 0 && count >= 1 && first + count <= block, "items [", first, ", ", first + count,
           ") outside the micro-step's ", block, " items");
  const int64_t spe = steps_per_epoch();
  const auto& perm = perm_for(step / spe);
  const int64_t base = (step % spe) * layout_.global_batch() + micro_step * block + first;
  return std::vector<int64_t>(perm.begin() + base, perm.begin() + base + count);
}

std::vector<int64_t> DataOrder::global_items(int64_t step) {
  PT_CHECK(step >= 0, "negative step ", step);
  const int64_t spe = steps_per_epoch();
  const auto& perm = perm_for(step / spe);
  const int64_t G = layout_.global_batch();
  const int64_t base = (step % spe) * G;
  return std::vector<int64_t>(perm.begin() + base, perm.begin() + base + G);
}

}  // namespace paratrain::data
