#include "paratrain/data/distributed_sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"
#include "paratrain/data/data_order.h"
#include "support/run_binary.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using paratrain::testing::TempDir;
using paratrain::testing::write_bytes;
using ::testing::HasSubstr;

namespace {

std::vector<std::vector<int64_t>> all_ranks(int64_t n, int replicas, DistributedSamplerOptions o, int64_t epoch = 0) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < replicas; ++r) {
    DistributedSampler s(n, replicas, r, o);
    s.set_epoch(epoch);
    out.push_back(s.indices());
  }
  return out;
}

std::vector<int64_t> sorted_union(const std::vector<std::vector<int64_t>>& per_rank) {
  std::vector<int64_t> all;
  for (const auto& v : per_rank) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

TEST(DistributedSampler, EvenSplitIsAPartition) {
  DistributedSamplerOptions o;
  o.seed = 7;
  auto per = all_ranks(12, 3, o, 2);
  for (const auto& v : per) EXPECT_EQ(v.size(), 4u);
  std::vector<int64_t> want(12);
  for (int i = 0; i < 12; ++i) want[static_cast<size_t>(i)] = i;
  EXPECT_EQ(sorted_union(per), want);
  // Strided: replica r has positions r, r+3, ... of the epoch's permutation.
  std::vector<int64_t> perm = epoch_permutation(12, 7, 2);
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 4; ++k) EXPECT_EQ(per[static_cast<size_t>(r)][static_cast<size_t>(k)], perm[static_cast<size_t>(k * 3 + r)]);
}

TEST(DistributedSampler, PaddingRepeatsTheHeadAndDropLastCutsTheTail) {
  DistributedSamplerOptions o;
  o.seed = 3;
  // 10 items, 4 replicas: 3 each, the first 2 positions of the order repeated.
  auto per = all_ranks(10, 4, o, 1);
  std::vector<int64_t> perm = epoch_permutation(10, 3, 1);
  std::vector<int64_t> want(perm.begin(), perm.end());
  want.push_back(perm[0]);
  want.push_back(perm[1]);
  std::sort(want.begin(), want.end());
  for (const auto& v : per) EXPECT_EQ(v.size(), 3u);
  EXPECT_EQ(sorted_union(per), want);

  o.drop_last = true;
  auto cut = all_ranks(10, 4, o, 1);
  std::vector<int64_t> kept(perm.begin(), perm.begin() + 8);
  std::sort(kept.begin(), kept.end());
  for (const auto& v : cut) EXPECT_EQ(v.size(), 2u);
  EXPECT_EQ(sorted_union(cut), kept);
  EXPECT_EQ(DistributedSampler(10, 4, 0, o).total_size(), 8);

  // Padding longer than the dataset: 2 items over 5 replicas wraps the order twice.
  DistributedSamplerOptions plain;
  plain.shuffle = false;
  auto wrap = all_ranks(2, 5, plain);
  std::vector<std::vector<int64_t>> expect = {{0}, {1}, {0}, {1}, {0}};
  EXPECT_EQ(wrap, expect);
}

TEST(DistributedSampler, EpochChangesTheOrderAndSeedFixesIt) {
  DistributedSamplerOptions o;
  o.seed = 42;
  DistributedSampler a(100, 2, 1, o), b(100, 2, 1, o);
  EXPECT_EQ(a.indices(), b.indices());  // same seed, same epoch: same order
  std::vector<int64_t> e0 = a.indices();
  a.set_epoch(1);
  EXPECT_EQ(a.epoch(), 1);
  EXPECT_NE(a.indices(), e0);
  b.set_epoch(1);
  EXPECT_EQ(a.indices(), b.indices());
  DistributedSamplerOptions other = o;
  other.seed = 43;
  EXPECT_NE(DistributedSampler(100, 2, 1, other).indices(), e0);
  // Shuffled, not the identity, and every epoch still a partition.
  DistributedSamplerOptions plain = o;
  plain.shuffle = false;
  EXPECT_NE(e0, DistributedSampler(100, 2, 1, plain).indices());
  for (int64_t epoch : {0, 1, 9}) EXPECT_EQ(sorted_union(all_ranks(100, 2, o, epoch)).size(), 100u);
  std::vector<int64_t> u = sorted_union(all_ranks(100, 2, o, 9));
  EXPECT_EQ(std::unique(u.begin(), u.end()), u.end());
}

TEST(DistributedSampler, BadArgumentsAreInputErrors) {
  EXPECT_THAT(error_of<InputError>([] { DistributedSampler(0, 2, 0); }), HasSubstr("empty"));
  EXPECT_THAT(error_of<InputError>([] { DistributedSampler(10, 0, 0); }), HasSubstr("num_replicas"));
  EXPECT_THAT(error_of<InputError>([] { DistributedSampler(10, 2, 2); }), HasSubstr("rank 2 is outside [0, 2)"));
  DistributedSamplerOptions o;
  o.drop_last = true;
  EXPECT_THAT(error_of<InputError>([&] { DistributedSampler(3, 4, 0, o); }), HasSubstr("drop_last"));
  DistributedSampler s(10, 2, 0);
  EXPECT_THAT(error_of<InputError>([&] { s.set_epoch(-1); }), HasSubstr("epoch"));
}

// The unshuffled layout (sizes, padding, drop_last, strided split) is torch's, index for index.
TEST(DistributedSampler, UnshuffledLayoutEqualsTorch) {
  if (paratrain::test::run_shell_line("timeout 60 /usr/bin/python3 -c 'import torch' 2>&1").rc != 0)
    GTEST_SKIP() << "Debian's python3-torch is not installed";
  const std::vector<std::tuple<int64_t, int, bool>> cases = {
      {12, 3, false}, {10, 4, false}, {10, 4, true}, {2, 5, false}, {7, 7, true}, {1000, 2, false}, {1001, 2, true},
      {17, 3, false}, {17, 3, true}};
  std::string py =
      "import sys\n"
      "from torch.utils.data import DistributedSampler\n"
      "for n, r, d in [";
  for (const auto& [n, r, d] : cases)
    py += "(" + std::to_string(n) + "," + std::to_string(r) + "," + (d ? "True" : "False") + "),";
  py +=
      "]:\n"
      "  for k in range(r):\n"
      "    s = DistributedSampler(range(n), num_replicas=r, rank=k, shuffle=False, drop_last=d)\n"
      "    print(n, r, int(d), k, len(s), ' '.join(str(i) for i in s))\n";
  TempDir tmp;
  const std::string script = tmp.path("torch_sampler.py");
  write_bytes(script, py);
  auto res = paratrain::test::run_shell_line("timeout 120 /usr/bin/python3 " + script + " 2>&1");
  ASSERT_EQ(res.rc, 0) << res.out;
  std::istringstream lines(res.out);
  std::string line;
  int checked = 0;
  while (std::getline(lines, line)) {
    std::istringstream f(line);
    int64_t n, len;
    int r, d, k;
    if (!(f >> n >> r >> d >> k >> len)) continue;  // e.g. a warning torch printed
    std::vector<int64_t> want;
    for (int64_t i; f >> i;) want.push_back(i);
    DistributedSamplerOptions o;
    o.shuffle = false;
    o.drop_last = d != 0;
    DistributedSampler s(n, r, k, o);
    EXPECT_EQ(s.num_samples(), len) << line;
    EXPECT_EQ(s.indices(), want) << line;
    ++checked;
  }
  int expected = 0;
  for (const auto& c : cases) expected += std::get<1>(c);
  EXPECT_EQ(checked, expected) << res.out;
}
