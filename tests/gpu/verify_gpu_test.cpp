// `paratrain verify --device cuda` through the binary (gpt-nano, 3 steps): on one GPU every
// model of the check (the distributed one, the plain copy and the single-process reference)
// runs on cuda:0 and the run passes; two ranks (a GPU each over nccl where the machine has two,
// else both on cuda:0 over shm, which stages the GPU buffers through host memory) pass (with
// --deterministic bit for bit the single-process run) and a reduction broken on rank 1
// (PARATRAIN_TEST_BREAK_REDUCTION) fails naming the step and tensor. Skips without a GPU.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gpu_run_dir.h"
#include "gpu_test_util.h"
#include "support/run_binary.h"

using namespace paratrain;

namespace {

class VerifyOnGpu : public test::GpuRunDir {
 protected:
  // `device`: the --device (and --backend) flags.
  std::string args(const std::string& extra, const std::string& device = "--device cuda") const {
    return "verify --model gpt-nano --data " + path("tokens.bin") + " --steps 3 --micro-batch 4 " + device +
           " --json " + path("v.json") + " " + extra;
  }
  nlohmann::json report() const {
    std::ifstream in(path("v.json"));
    return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
  }
};

TEST_F(VerifyOnGpu, OneGpuPasses) {
  PT_REQUIRE_GPU();
  const auto r = test::run_paratrain(args("--deterministic"), 300);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(", on cuda:0"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("verdict: PASS"), std::string::npos) << r.out;
  const auto j = report();
  ASSERT_EQ(j["per_step"].size(), 3u);
  for (const auto& s : j["per_step"]) EXPECT_LE(s["global_rel"].get<double>(), 1e-5) << s;
  for (const auto& t : j["tensors"]) EXPECT_EQ(t["param_abs"].get<double>(), 0.0) << t["name"];
}

TEST_F(VerifyOnGpu, TwoRanksPassAndABrokenReductionIsNamed) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const std::string device = test::two_ranks_on_gpus();
  const std::string launch = "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) + " ";
  auto ok = test::run_paratrain(launch + args("--deterministic", device), 300);
  ASSERT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("verdict: PASS"), std::string::npos) << ok.out;
  auto j = report();
  EXPECT_EQ(j["dp"], 2);
  EXPECT_EQ(j["param_tolerance"].get<double>(), 0.0);
  for (const auto& t : j["tensors"]) EXPECT_EQ(t["param_abs"].get<double>(), 0.0) << t["name"];
  for (const auto& s : j["per_step"]) EXPECT_TRUE(s["replicas_identical"].get<bool>()) << s;

  const auto bad = test::run_shell_line("PARATRAIN_TEST_BREAK_REDUCTION=h.0.mlp.c_fc.weight:2 timeout 300 " +
                                        std::string(PARATRAIN_BIN) + " " + launch + args("", device) + " 2>&1");
  EXPECT_NE(bad.rc, 0) << bad.out;
  EXPECT_NE(bad.out.find("verdict: FAIL: first divergence at step 2 in tensor h.0.mlp.c_fc.weight"), std::string::npos)
      << bad.out;
  j = report();
  EXPECT_FALSE(j["passed"].get<bool>());
  EXPECT_TRUE(j["per_step"][0]["replicas_identical"].get<bool>());
  EXPECT_FALSE(j["per_step"][1]["replicas_identical"].get<bool>());
}

}  // namespace
