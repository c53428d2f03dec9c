#include "paratrain/parallel/load_balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "paratrain/base/error.h"

namespace paratrain::parallel {

std::vector<int64_t> proportional_split(int64_t total, const std::vector<double>& speeds) {
  const auto n = static_cast<int64_t>(speeds.size());
  PT_CHECK(n >= 1 && total >= n, "cannot split ", total, " items among ", n, " ranks with at least one each");
  double sum = 0;
  for (double s : speeds) {
    PT_CHECK(s > 0 && std::isfinite(s), "rank speed must be positive, got ", s);
    sum += s;
  }
  // In proportion, rounded down, at least one each; the items left go to the largest
  // remainders, items missing are taken from the largest shares (ties to the lower rank, so
  // every rank computes the same split).
  std::vector<int64_t> sizes(static_cast<size_t>(n));
  std::vector<std::pair<double, int64_t>> frac;
  int64_t given = 0;
  for (int64_t r = 0; r < n; ++r) {
    const double exact = static_cast<double>(total) * speeds[r] / sum;
    sizes[r] = std::max<int64_t>(1, static_cast<int64_t>(std::floor(exact)));
    given += sizes[r];
    frac.emplace_back(exact - std::floor(exact), r);
  }
  std::stable_sort(frac.begin(), frac.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = 0; given < total; i = (i + 1) % frac.size(), ++given) sizes[frac[i].second] += 1;
  while (given > total) {
    const auto big = std::max_element(sizes.begin(), sizes.end()) - sizes.begin();
    sizes[big] -= 1;
    --given;
  }
  return sizes;
}

LoadBalancer::LoadBalancer(int world, int64_t micro_batch, bool enabled, int64_t interval, double min_gain)
    : world_(world),
      micro_batch_(micro_batch),
      enabled_(enabled && world > 1),
      interval_(interval),
      min_gain_(min_gain),
      current_(static_cast<size_t>(world), micro_batch),
      window_ms_(static_cast<size_t>(world), 0.0),
      window_items_(static_cast<size_t>(world), 0) {
  PT_CHECK(world >= 1 && micro_batch >= 1 && interval >= 1, "bad load balancer configuration");
}

const std::vector<int64_t>& LoadBalancer::sizes_at(int64_t step) const {
  return next_from_ >= 0 && step >= next_from_ ? next_ : current_;
}

int64_t LoadBalancer::first(int rank, int64_t step) const {
  const auto& s = sizes_at(step);
  return std::accumulate(s.begin(), s.begin() + rank, int64_t(0));
}

double LoadBalancer::weight(int rank, int64_t step) const {
  return static_cast<double>(count(rank, step)) / static_cast<double>(micro_batch_);
}

bool LoadBalancer::observe(int64_t step, const std::vector<double>& compute_ms) {
  if (!enabled_) return false;
  PT_CHECK(static_cast<int>(compute_ms.size()) == world_, "one compute time per rank expected");
  if (next_from_ >= 0) {
    // A change is pending; this step still ran on the old split. Once the new one is in force
    // (from step + 1 on), a fresh window measures it.
    if (step + 1 >= next_from_) {
      current_ = next_;
      next_from_ = -1;
    }
    return false;
  }
  const auto& sizes = current_;
  for (int r = 0; r < world_; ++r) {
    window_ms_[r] += compute_ms[r];
    window_items_[r] += sizes[r];
  }
  if (++window_steps_ < interval_) return false;
  std::vector<double> speed(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) speed[r] = static_cast<double>(window_items_[r]) / std::max(window_ms_[r], 1e-6);
  std::fill(window_ms_.begin(), window_ms_.end(), 0.0);
  std::fill(window_items_.begin(), window_items_.end(), 0);
  window_steps_ = 0;
  const auto proposal = proportional_split(micro_batch_ * world_, speed);
  double now = 0, then = 0;
  for (int r = 0; r < world_; ++r) {
    now = std::max(now, static_cast<double>(current_[r]) / speed[r]);
    then = std::max(then, static_cast<double>(proposal[r]) / speed[r]);
  }
  if (proposal == current_ || then > now * (1.0 - min_gain_)) return false;
  next_ = proposal;
  next_from_ = step + 2;
  ++changes_;
  return true;
}

}  // namespace paratrain::parallel
