// The linear-partition search of balance_stages() (pipeline/partition.h).
#include "paratrain/parallel/pipeline/partition.h"

#include <algorithm>
#include <limits>
#include <sstream>

#include "paratrain/base/error.h"

namespace paratrain::parallel::pipeline {

std::vector<StageRange> balance_stages(const std::vector<double>& block_cost, double first_extra, double last_extra,
                                       int stages) {
  const int L = static_cast<int>(block_cost.size());
  if (stages < 1) PT_THROW(InputError, "pipeline stages must be at least 1, got ", stages);
  if (stages > L)
    PT_THROW(InputError, "--pp x --pp-virtual = ", stages, " pipeline stages for a model of ", L,
             " blocks: every stage needs at least one block");
  if (first_extra < 0 || last_extra < 0 || std::any_of(block_cost.begin(), block_cost.end(), [](double c) { return c < 0; }))
    PT_THROW(InputError, "pipeline balance: costs must not be negative");
  std::vector<double> prefix(static_cast<size_t>(L) + 1, 0.0);
  for (int i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + block_cost[i];
  // cost of stage k (of S) holding blocks [a, b)
  auto stage_cost = [&](int k, int a, int b) {
    return prefix[b] - prefix[a] + (k == 0 ? first_extra : 0.0) + (k == stages - 1 ? last_extra : 0.0);
  };
  // best[k][b]: for stages 0..k holding blocks [0, b), the smallest possible maximum stage
  // cost and, among the cuts reaching it, the smallest sum of squared stage costs (so the
  // stages that do not set the maximum are balanced too).
  struct Score {
    double max = std::numeric_limits<double>::infinity(), squares = 0;
    bool operator<(const Score& o) const { return max < o.max || (max == o.max && squares < o.squares); }
  };
  std::vector<std::vector<Score>> best(static_cast<size_t>(stages), std::vector<Score>(static_cast<size_t>(L) + 1));
  std::vector<std::vector<int>> cut(static_cast<size_t>(stages), std::vector<int>(static_cast<size_t>(L) + 1, 0));
  for (int b = 1; b <= L; ++b) {
    const double c = stage_cost(0, 0, b);
    best[0][b] = {c, c * c};
  }
  for (int k = 1; k < stages; ++k)
    for (int b = k + 1; b <= L; ++b)
      for (int a = k; a < b; ++a) {  // stage k holds [a, b); the first best a wins ties
        const double c = stage_cost(k, a, b);
        const Score v{std::max(best[k - 1][a].max, c), best[k - 1][a].squares + c * c};
        if (v < best[k][b]) best[k][b] = v, cut[k][b] = a;
      }
  std::vector<StageRange> out(static_cast<size_t>(stages));
  int b = L;
  for (int k = stages - 1; k >= 0; --k) {
    const int a = k == 0 ? 0 : cut[k][b];
    out[k] = {a, b, stage_cost(k, a, b)};
    b = a;
  }
  return out;
}

std::string describe_stages(const std::vector<StageRange>& stages) {
  std::ostringstream o;
  for (size_t k = 0; k < stages.size(); ++k) {
    const auto& s = stages[k];
    o << (k ? " | " : "blocks ") << s.first_block;
    if (s.end_block - s.first_block > 1) o << "-" << s.end_block - 1;
  }
  return o.str();
}

}  // namespace paratrain::parallel::pipeline
