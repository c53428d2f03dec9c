// examples/linear_regression_spawn.cpp against the installed package: built out of tree with
// find_package(paratrain), it starts its own 2 ranks with paratrain::spawn; the loss falls
// and both ranks end with the same parameters. Under the installed `paratrain launch
// --nproc-per-node 2` the same program prints exactly the same losses and weights.
// Every spawned command runs under `timeout`.
#include <regex>
#include <string>
#include <vector>

#include "install/install_fixture.h"

namespace fs = std::filesystem;
using namespace paratrain::install_test;

namespace {

constexpr int kEpochs = 10;

// The lines rank `rank` printed ("[r] ..." from the launcher's prefixing), in order.
std::vector<std::string> rank_lines(const std::string& out, int rank) {
  std::vector<std::string> v;
  const std::string prefix = "[" + std::to_string(rank) + "] ";
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(prefix, 0) == 0) v.push_back(line.substr(prefix.size()));
  return v;
}

// "rank R checksum C" of rank `rank`, or "".
std::string checksum_of(const std::string& out, int rank) {
  std::smatch m;
  const std::regex re("rank " + std::to_string(rank) + " checksum ([0-9a-f]+)");
  return std::regex_search(out, m, re) ? m[1].str() : "";
}

TEST_F(Install, SpawnExampleTrainsTwoRanksAndMatchesTheLauncher) {
  fs::path ex = tmp_ / "ex";
  Cmd b = cmake_project(source_dir() / "examples", ex, "", true, "example_linear_regression_spawn");
  ASSERT_EQ(b.rc, 0) << b.out;
  const std::string exe = (ex / "bin/example_linear_regression_spawn").string();
  const std::string env = "PARATRAIN_THREADS=1 OMP_WAIT_POLICY=passive ";

  // Started by spawn: 2 ranks, rank 0's epoch losses fall, the replicas agree.
  Cmd s = run(env + exe + " " + std::to_string(kEpochs), 90);
  ASSERT_EQ(s.rc, 0) << s.out;
  const std::vector<double> l = losses(s.out);
  ASSERT_EQ(l.size(), size_t(kEpochs)) << s.out;
  // Measured: 0.74 in epoch 0 (the start from a random model), about 1e-4 (the noise,
  // 0.01^2) from epoch 2 on.
  EXPECT_LT(l.back(), l.front() / 100) << s.out;
  const std::string c0 = checksum_of(s.out, 0), c1 = checksum_of(s.out, 1);
  ASSERT_FALSE(c0.empty()) << s.out;
  EXPECT_EQ(c0, c1) << "rank 1's parameters differ from rank 0's\n" << s.out;
  EXPECT_EQ(rank_lines(s.out, 0).size(), size_t(kEpochs + 2)) << s.out;  // epochs, weights, checksum

  // The same program under the installed launcher: every line of each rank is the same.
  Cmd la = run(env + (prefix_ / "bin/paratrain").string() + " launch --nproc-per-node 2 -- " + exe + " " +
                   std::to_string(kEpochs),
               90);
  ASSERT_EQ(la.rc, 0) << la.out;
  EXPECT_EQ(rank_lines(la.out, 0), rank_lines(s.out, 0)) << s.out << "\n---\n" << la.out;
  EXPECT_EQ(rank_lines(la.out, 1), rank_lines(s.out, 1)) << s.out << "\n---\n" << la.out;

  // A bad argument is the documented user error, and no rank starts.
  Cmd bad = run(exe + " 0", 30);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("error: usage"), std::string::npos) << bad.out;
  EXPECT_EQ(bad.out.find("[0]"), std::string::npos) << bad.out;
}

}  // namespace
