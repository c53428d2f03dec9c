// examples/custom_model_train.cpp against the installed package: built out of tree with
// find_package(paratrain) only, run on 2 ranks under the installed `paratrain launch` with
// DDP + ZeRO 1 + bf16 and checkpoints. A run in two sessions (--stop-at N, then --resume)
// has the losses of the uninterrupted 2N-step run, and the loss falls. Every command runs
// under `timeout`.
#include <regex>
#include <string>
#include <vector>

#include "install/install_fixture.h"

using namespace paratrain::install_test;

namespace {

// The X of the example's "step S loss X" lines, in order (not the loop's "val_loss" line).
std::vector<double> step_losses(const std::string& out) {
  std::vector<double> v;
  std::regex re("step [0-9]+ loss ([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1].str()));
  return v;
}

TEST_F(Install, CustomModelExampleTrainsOnTwoRanksAndResumes) {
  const fs::path ex = tmp_ / "ex";
  Cmd b = cmake_project(source_dir() / "examples", ex, "", true, "example_custom_model_train");
  ASSERT_EQ(b.rc, 0) << b.out;
  const std::string launch = (prefix_ / "bin/paratrain").string() + " launch --nproc-per-node 2 -- " +
                             (ex / "bin/example_custom_model_train").string() + " ";
  const std::string env = "PARATRAIN_THREADS=1 OMP_WAIT_POLICY=passive ";
  const int N = 20;

  Cmd whole = run(env + launch + std::to_string(2 * N) + " " + (tmp_ / "ck_whole").string(), 180);
  ASSERT_EQ(whole.rc, 0) << whole.out;
  const std::vector<double> all = step_losses(whole.out);
  ASSERT_EQ(all.size(), static_cast<size_t>(2 * N)) << whole.out;  // rank 0 alone prints
  EXPECT_LT(all.back(), 0.6 * all.front()) << whole.out;
  EXPECT_NE(whole.out.find("validation accuracy"), std::string::npos) << whole.out;

  const std::string ck = (tmp_ / "ck").string();
  Cmd first = run(env + launch + std::to_string(2 * N) + " " + ck + " --stop-at " + std::to_string(N), 180);
  ASSERT_EQ(first.rc, 0) << first.out;
  Cmd second = run(env + launch + std::to_string(2 * N) + " " + ck + " --resume", 180);
  ASSERT_EQ(second.rc, 0) << second.out;
  const std::vector<double> a = step_losses(first.out), c = step_losses(second.out);
  ASSERT_EQ(a.size(), static_cast<size_t>(N)) << first.out;
  ASSERT_EQ(c.size(), static_cast<size_t>(N)) << second.out;
  EXPECT_NE(second.out.find("trained steps 21..40 of 40"), std::string::npos) << second.out;
  for (int i = 0; i < N; ++i) {
    EXPECT_NEAR(a[i], all[i], 1e-6 * all[i]) << "step " << i + 1;
    EXPECT_NEAR(c[i], all[N + i], 1e-6 * all[N + i]) << "step " << N + i + 1;
  }

  // A bad argument is the documented user error (exit 2, "error: ...").
  Cmd bad = run((ex / "bin/example_custom_model_train").string() + " 4 " + ck + " --bogus", 30);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("error: unknown argument '--bogus'"), std::string::npos) << bad.out;
}

}  // namespace
