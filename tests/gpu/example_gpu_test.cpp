// examples/custom_loop_ddp.cpp with --device cuda: a program's own DDP loop over the public
// headers, on a GPU. Its step losses and final parameters follow the same program on the CPU;
// with two ranks (a GPU each over nccl where the machine has two, else both on cuda:0 over
// shm) the ranks' parameters agree and follow two CPU ranks. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "support/run_binary.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

constexpr int kSteps = 20;

struct ExampleRun {
  test::CommandResult result;
  std::vector<double> losses;     // "step S loss X", in order
  std::vector<double> checksums;  // "rank R checksum C", by rank
};

// The example (built beside the paratrain binary) with `args`, under `launcher` (""
// or `paratrain launch ... --`) and the environment variables `env` ("" or "NAME=VALUE ...").
ExampleRun run_example(const std::string& env, const std::string& launcher, const std::string& args) {
  const std::string exe = (fs::path(PARATRAIN_BIN).parent_path() / "example_custom_loop_ddp").string();
  ExampleRun r;
  r.result = test::run_shell_line("PARATRAIN_THREADS=1 " + env + " timeout 240 " + launcher + exe + " " + args + " 2>&1");
  const std::string& out = r.result.out;
  const std::regex step("step [0-9]+ loss ([-0-9.eE+]+)"), sum("rank ([0-9]+) checksum ([-0-9.eE+]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), step); it != std::sregex_iterator(); ++it)
    r.losses.push_back(std::stod((*it)[1].str()));
  for (auto it = std::sregex_iterator(out.begin(), out.end(), sum); it != std::sregex_iterator(); ++it) {
    const size_t rank = std::stoul((*it)[1].str());
    if (r.checksums.size() <= rank) r.checksums.resize(rank + 1, NAN);
    r.checksums[rank] = std::stod((*it)[2].str());
  }
  return r;
}

// `gpu` trained as `cpu` did: every step's loss and every rank's parameter sum within `rel`.
// The GEMMs and reductions add in other orders on the GPU, so not bit for bit.
void expect_follows(const ExampleRun& gpu, const ExampleRun& cpu, int world, double rel) {
  ASSERT_EQ(cpu.result.rc, 0) << cpu.result.out;
  ASSERT_EQ(gpu.result.rc, 0) << gpu.result.out;
  ASSERT_EQ(cpu.losses.size(), size_t(kSteps)) << cpu.result.out;
  ASSERT_EQ(gpu.losses.size(), size_t(kSteps)) << gpu.result.out;
  for (int s = 0; s < kSteps; ++s) EXPECT_NEAR(gpu.losses[s], cpu.losses[s], rel * cpu.losses[s]) << "step " << s;
  EXPECT_LT(gpu.losses.back(), gpu.losses.front() * 0.5) << gpu.result.out;  // it learns
  ASSERT_EQ(gpu.checksums.size(), size_t(world)) << gpu.result.out;
  ASSERT_EQ(cpu.checksums.size(), size_t(world)) << cpu.result.out;
  for (int rank = 0; rank < world; ++rank) {
    EXPECT_EQ(gpu.checksums[rank], gpu.checksums[0]) << "rank " << rank << "'s parameters differ from rank 0's";
    EXPECT_NEAR(gpu.checksums[rank], cpu.checksums[rank], rel * std::abs(cpu.checksums[rank])) << "rank " << rank;
  }
}

TEST(ExampleOnGpu, CustomLoopDdpOnOneGpuFollowsTheCpu) {
  PT_REQUIRE_GPU();
  const ExampleRun cpu = run_example("", "", std::to_string(kSteps));
  const ExampleRun gpu = run_example("", "", std::to_string(kSteps) + " --device cuda");
  EXPECT_NE(gpu.result.out.find("world 1 backend nccl"), std::string::npos) << gpu.result.out;
  expect_follows(gpu, cpu, 1, 1e-3);
}

TEST(ExampleOnGpu, CustomLoopDdpWithTwoRanksOnGpusFollowsTwoCpuRanks) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const bool two_gpus = cuda::device_count() >= 2;
  const std::string launch = std::string(PARATRAIN_BIN) + " launch --nproc-per-node 2 -- ";
  const ExampleRun cpu = run_example("", launch, std::to_string(kSteps));
  const ExampleRun gpu = two_gpus ? run_example("", launch, std::to_string(kSteps) + " --device cuda")
                                  : run_example("PARATRAIN_BACKEND=shm", launch, std::to_string(kSteps) + " --device cuda:0");
  EXPECT_NE(gpu.result.out.find(two_gpus ? "world 2 backend nccl" : "world 2 backend shm"), std::string::npos)
      << gpu.result.out;
  expect_follows(gpu, cpu, 2, 1e-3);
}

}  // namespace
