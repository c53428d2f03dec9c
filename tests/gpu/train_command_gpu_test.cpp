// `paratrain train --device cuda`, end to end through the binary: the losses of a GPU run
// against the same run on the CPU, mixed precision on the GPU, an exact resume there, the
// metrics' device figures, and DDP and tensor parallelism over nccl when the machine has two
// GPUs. Skips without a GPU (PT_REQUIRE_GPU).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "paratrain/data/token_file.h"
#include "support/run_binary.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

class TrainCommandOnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_gpu_train_XXXXXX";
    dir_ = mkdtemp(tmpl);
    std::vector<uint16_t> t(40000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + (i / 13)) % 256);
    data::write_token_file(path("tokens.bin"), t);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return dir_ + "/" + n; }
  std::string base(int steps) const {
    return "train --model gpt-nano --data " + path("tokens.bin") + " --steps " + std::to_string(steps) +
           " --micro-batch 4 --grad-accum 2 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet";
  }
  // Runs `args` with --metrics FILE; the metrics lines of the training steps.
  std::vector<nlohmann::json> train(const std::string& args, const std::string& name) {
    const auto r = test::run_paratrain(args + " --metrics " + path(name), 300);
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.out;
    std::vector<nlohmann::json> lines;
    std::ifstream in(path(name));
    for (std::string l; std::getline(in, l);) {
      auto j = nlohmann::json::parse(l);
      if (!j.contains("eval")) lines.push_back(j);
    }
    return lines;
  }
  std::string dir_;
};

std::vector<double> losses(const std::vector<nlohmann::json>& m) {
  std::vector<double> out;
  for (const auto& j : m) out.push_back(j["loss"].get<double>());
  return out;
}

}  // namespace

// f32 on the GPU follows the CPU's run: the same data, initialisation and AdamW, only the
// summation order of the GEMMs, reductions and attention differs (f32 both, no TF32), which
// moves the loss by ~1e-6 relative per step; 8 steps stay well within 1e-3.
TEST_F(TrainCommandOnGpu, F32FollowsTheCpuRunAndReportsTheGpu) {
  PT_REQUIRE_GPU();
  const auto cpu = train(base(8) + " --device cpu", "cpu.jsonl");
  const auto gpu = train(base(8) + " --device cuda", "gpu.jsonl");
  ASSERT_EQ(cpu.size(), 8u);
  ASSERT_EQ(gpu.size(), 8u);
  for (size_t s = 0; s < 8; ++s) {
    const double a = cpu[s]["loss"], b = gpu[s]["loss"];
    EXPECT_NEAR(b, a, 1e-3 * std::abs(a)) << "step " << s + 1;
    EXPECT_NEAR(gpu[s]["grad_norm"].get<double>(), cpu[s]["grad_norm"].get<double>(),
                1e-3 * cpu[s]["grad_norm"].get<double>())
        << "step " << s + 1;
  }
  EXPECT_LT(gpu.back()["loss"].get<double>(), gpu.front()["loss"].get<double>());
  EXPECT_EQ(gpu[0]["device"], "cuda:0");
  EXPECT_EQ(cpu[0]["device"], "cpu");
  // The GPU's measured bf16 GEMM rate as the peak: an H100/H200 is far above 1e14 FLOP/s.
  EXPECT_GT(gpu[0]["peak_flops"].get<double>(), 1e13);
  const double mfu = gpu.back()["mfu"];
  EXPECT_GT(mfu, 0.0);
  EXPECT_LT(mfu, 1.0);
  // The memory figures are the GPU allocator's: parameters, AdamW state and activations.
  EXPECT_GT(gpu[0]["mem_peak_bytes"][0].get<int64_t>(), 3 * 120576 * 4);
}

TEST_F(TrainCommandOnGpu, Bf16LearnsAndStaysNearF32) {
  PT_REQUIRE_GPU();
  const auto f32 = losses(train(base(20) + " --device cuda", "f32.jsonl"));
  const auto bf16 = losses(train(base(20) + " --device cuda --precision bf16", "bf16.jsonl"));
  ASSERT_EQ(bf16.size(), 20u);
  for (double l : bf16) EXPECT_TRUE(std::isfinite(l));
  EXPECT_LT(bf16.back(), bf16.front() - 0.1);  // it learns the pattern
  EXPECT_NEAR(bf16.back(), f32.back(), 0.05 * f32.back());
}

// Stopped at step 4 and resumed: the same steps 5..8 as the run that never stopped. Not bit
// for bit: the embedding and LayerNorm backward kernels sum with f32 atomics, whose order
// varies from run to run (docs/cuda.md), so the last bits of two GPU runs differ anyway.
TEST_F(TrainCommandOnGpu, ResumesExactly) {
  PT_REQUIRE_GPU();
  const auto whole = losses(train(base(8) + " --device cuda", "whole.jsonl"));
  const std::string ckpt = " --checkpoint-dir " + path("ckpt") + " --checkpoint-every 4";
  const auto r = test::run_paratrain(base(4) + " --device cuda" + ckpt, 300);
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto resumed = losses(train(base(8) + " --device cuda --resume" + ckpt, "resumed.jsonl"));
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t s = 0; s < 4; ++s) EXPECT_NEAR(resumed[s], whole[s + 4], 1e-5 * whole[s + 4]) << "step " << s + 5;
  // The final weights, written from the GPU, load on the host.
  const auto w = test::run_paratrain(base(2) + " --device cuda --save-final " + path("w.safetensors"), 300);
  ASSERT_EQ(w.rc, 0) << w.out;
  EXPECT_TRUE(fs::exists(path("w.safetensors")));
}

// --tp 2 on two GPUs (cuda:LOCAL_RANK, nccl) against --tp 2 on the CPU (shm): the same cut
// model, data and AdamW; only the summation order of the GEMMs, reductions, attention and the
// embedding/LayerNorm atomics differs (f32 both, no TF32; two ranks add a + b either way), as
// in F32FollowsTheCpuRunAndReportsTheGpu, so 6 steps stay within 1e-3 relative. With
// --sequence-parallel also dropout 0.1: its masks are drawn on the host from the same
// generator on both devices, so they are the same masks.
TEST_F(TrainCommandOnGpu, TensorParallelOnTwoGpusFollowsTheCpu) {
  PT_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << cuda::device_count();
  const std::string launch = "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                             " train --model gpt-nano --data " + path("tokens.bin") +
                             " --steps 6 --micro-batch 4 --grad-accum 2 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet --tp 2";
  for (const std::string extra : {"", " --sequence-parallel --dropout 0.1"}) {
    SCOPED_TRACE("--tp 2" + extra);
    const auto cpu = train(launch + extra + " --device cpu", "tp_cpu.jsonl");
    const auto gpu = train(launch + extra + " --device cuda", "tp_gpu.jsonl");
    ASSERT_EQ(cpu.size(), 6u);
    ASSERT_EQ(gpu.size(), 6u);
    for (size_t s = 0; s < 6; ++s) {
      const double a = cpu[s]["loss"], b = gpu[s]["loss"];
      EXPECT_NEAR(b, a, 1e-3 * std::abs(a)) << "step " << s + 1;
      EXPECT_NEAR(gpu[s]["grad_norm"].get<double>(), cpu[s]["grad_norm"].get<double>(),
                  1e-3 * cpu[s]["grad_norm"].get<double>())
          << "step " << s + 1;
    }
    EXPECT_EQ(gpu[0]["device"], "cuda:0");
    EXPECT_GT(gpu[0]["tp_comm_calls"].get<int64_t>(), 0);
    EXPECT_EQ(gpu[0]["tp_comm_bytes"], cpu[0]["tp_comm_bytes"]);  // the same collectives
    fs::remove(path("tp_cpu.jsonl"));
    fs::remove(path("tp_gpu.jsonl"));
  }
}

// Two ranks on two GPUs (cuda:LOCAL_RANK) over nccl against one GPU taking both halves of
// the batch as micro-batches: the same global batch, so the same losses up to summation order.
TEST_F(TrainCommandOnGpu, DdpOverNcclMatchesOneGpu) {
  PT_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << cuda::device_count();
  const std::string one = "train --model gpt-nano --data " + path("tokens.bin") +
                          " --steps 6 --micro-batch 4 --grad-accum 2 --seed 3 --quiet --device cuda";
  const auto single = losses(train(one, "one.jsonl"));
  const auto two = losses(train("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                                    " train --model gpt-nano --data " + path("tokens.bin") +
                                    " --steps 6 --micro-batch 4 --seed 3 --quiet --device cuda",
                                "two.jsonl"));
  ASSERT_EQ(two.size(), single.size());
  for (size_t s = 0; s < two.size(); ++s) EXPECT_NEAR(two[s], single[s], 1e-3 * single[s]) << "step " << s + 1;
}
