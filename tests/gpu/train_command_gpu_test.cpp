// `paratrain train --device cuda`, end to end through the binary: the losses of a GPU run
// against the same run on the CPU (gpt-nano, and the CNN classifier on a small set in
// Fashion-MNIST's format written by the test), mixed precision on the GPU, an exact resume
// there, the metrics' device figures (how often a step waits for the GPU among them), and DDP
// (with bf16 and PowerSGD compression, and --balance auto), --deterministic (bit for bit one
// GPU accumulating), ZeRO 3, tensor and pipeline parallelism with two ranks: over nccl on two
// GPUs where the machine has them, else sharing one GPU over shm (two_ranks_on_gpus). Skips
// without a GPU (PT_REQUIRE_GPU).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "gpu_run_dir.h"
#include "gpu_test_util.h"
#include "support/run_binary.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

class TrainCommandOnGpu : public test::GpuRunDir {
 protected:
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
};

// Fashion-MNIST's IDX files (uncompressed, which the loader accepts) in `dir`: `train` and
// `test` 28x28 images whose class (0..9) is a bright band of rows at 2*class..2*class+5 over
// noise, so a few steps of the CNN learn it.
void write_image_set(const std::string& dir, int train, int test) {
  auto be32 = [](std::ofstream& f, uint32_t v) {
    const unsigned char b[4] = {static_cast<unsigned char>(v >> 24), static_cast<unsigned char>(v >> 16),
                                static_cast<unsigned char>(v >> 8), static_cast<unsigned char>(v)};
    f.write(reinterpret_cast<const char*>(b), 4);
  };
  uint32_t state = 12345;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (const auto& [prefix, count] : {std::pair<std::string, int>{"train", train}, {"t10k", test}}) {
    std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
    std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
    be32(images, 2051), be32(images, static_cast<uint32_t>(count)), be32(images, 28), be32(images, 28);
    be32(labels, 2049), be32(labels, static_cast<uint32_t>(count));
    for (int i = 0; i < count; ++i) {
      const int label = static_cast<int>((next() >> 16) % 10);
      labels.put(static_cast<char>(label));
      for (int r = 0; r < 28; ++r)
        for (int c = 0; c < 28; ++c) {
          const int noise = static_cast<int>((next() >> 16) % 60);
          const bool band = r >= 2 * label && r < 2 * label + 6;
          images.put(static_cast<char>(band ? 180 + noise : noise));
        }
    }
  }
}

std::vector<double> losses(const std::vector<nlohmann::json>& m) {
  std::vector<double> out;
  for (const auto& j : m) out.push_back(j["loss"].get<double>());
  return out;
}

using test::two_ranks_on_gpus;

// A GPU run's losses and gradient norms within `rel` (relative) of the CPU run's, step by step.
void expect_follows(const std::vector<nlohmann::json>& gpu, const std::vector<nlohmann::json>& cpu, size_t steps,
                    double rel) {
  ASSERT_EQ(cpu.size(), steps);
  ASSERT_EQ(gpu.size(), steps);
  for (size_t s = 0; s < steps; ++s) {
    const double a = cpu[s]["loss"], b = gpu[s]["loss"];
    EXPECT_NEAR(b, a, rel * std::abs(a)) << "step " << s + 1;
    EXPECT_NEAR(gpu[s]["grad_norm"].get<double>(), cpu[s]["grad_norm"].get<double>(),
                rel * cpu[s]["grad_norm"].get<double>())
        << "step " << s + 1;
  }
}

// The accuracy of the last evaluation line of a metrics file (-1 without one).
double accuracy(const std::string& metrics) {
  double acc = -1;
  std::ifstream in(metrics);
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    if (j.contains("eval") && j.contains("accuracy")) acc = j["accuracy"].get<double>();
  }
  return acc;
}

}  // namespace

// f32 on the GPU follows the CPU's run: the same data, initialisation and AdamW, only the
// summation order of the GEMMs, reductions and attention differs (f32 both, no TF32), which
// moves the loss by ~1e-6 relative per step; 8 steps stay well within 1e-3.
TEST_F(TrainCommandOnGpu, F32FollowsTheCpuRunAndReportsTheGpu) {
  PT_REQUIRE_GPU();
  const auto cpu = train(base(8) + " --device cpu", "cpu.jsonl");
  const auto gpu = train(base(8) + " --device cuda", "gpu.jsonl");
  ASSERT_NO_FATAL_FAILURE(expect_follows(gpu, cpu, 8, 1e-3));
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
  // The host's waits for the GPU are counted on a GPU only.
  EXPECT_TRUE(gpu[0].contains("host_waits"));
  EXPECT_FALSE(cpu[0].contains("host_waits"));
}

// No sync in the hot path: after the first step, a step waits for its GPU exactly twice (one
// copy of every micro-batch's loss, one of the gradient norm's per-tensor sums), and fp16 once
// more (the loss scaler's inf/NaN flag), with 1 micro-batch a step or 4 alike: nothing waits per
// micro-batch, per layer or per tensor.
TEST_F(TrainCommandOnGpu, AStepWaitsForTheGpuAFixedFewTimesNotPerMicroBatch) {
  PT_REQUIRE_GPU();
  for (const std::string precision : {"fp32", "fp16"})
    for (int accum : {1, 4}) {
      SCOPED_TRACE(precision + ", grad-accum " + std::to_string(accum));
      const std::string args = "train --model gpt-nano --data " + path("tokens.bin") +
                               " --steps 4 --micro-batch 2 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet --device cuda" +
                               " --precision " + precision + " --grad-accum " + std::to_string(accum);
      const auto m = train(args, precision + std::to_string(accum) + ".jsonl");
      ASSERT_EQ(m.size(), 4u);
      for (size_t s = 1; s < m.size(); ++s)
        EXPECT_EQ(m[s]["host_waits"].get<int64_t>(), precision == "fp16" ? 3 : 2) << "step " << s + 1;
    }
}

// bf16, and fp16 with its dynamic loss scaler (the f16 attention and cross-entropy tables),
// each with the default attention and with the flash kernels (PARATRAIN_CUDA_ATTENTION=flash,
// which the child inherits): each learns and ends near the f32 run.
TEST_F(TrainCommandOnGpu, HalfPrecisionsLearnAndStayNearF32) {
  PT_REQUIRE_GPU();
  const auto f32 = losses(train(base(20) + " --device cuda", "f32.jsonl"));
  const char* outer = std::getenv("PARATRAIN_CUDA_ATTENTION");
  const std::string outer_form = outer ? outer : "";
  for (const std::string attention : {"", "flash"})  // "": the environment's form
    for (const std::string precision : {"bf16", "fp16"}) {
      SCOPED_TRACE(precision + " " + (attention.empty() ? "the environment's attention" : attention));
      if (!attention.empty()) ::setenv("PARATRAIN_CUDA_ATTENTION", attention.c_str(), 1);
      const auto half =
          losses(train(base(20) + " --device cuda --precision " + precision, precision + attention + ".jsonl"));
      if (outer) {
        ::setenv("PARATRAIN_CUDA_ATTENTION", outer_form.c_str(), 1);
      } else {
        ::unsetenv("PARATRAIN_CUDA_ATTENTION");
      }
      ASSERT_EQ(half.size(), 20u);
      for (double l : half) EXPECT_TRUE(std::isfinite(l));
      EXPECT_LT(half.back(), half.front() - 0.1);  // it learns the pattern
      EXPECT_NEAR(half.back(), f32.back(), 0.05 * f32.back());
    }
}

// Resumed from its step-4 checkpoint: the same steps 5..8 as the run that never stopped. The
// whole run saves at steps 4 and 8; pointing `latest` back at step_4 makes the resume start
// there (a resume must keep every setting, --steps included). Bit for bit: every CUDA kernel
// gives the same bits from run to run (no atomics, docs/cuda.md).
TEST_F(TrainCommandOnGpu, ResumesExactly) {
  PT_REQUIRE_GPU();
  const std::string ckpt = " --checkpoint-dir " + path("ckpt") + " --checkpoint-every 4";
  const auto whole = losses(train(base(8) + " --device cuda" + ckpt, "whole.jsonl"));
  ASSERT_EQ(whole.size(), 8u);
  ASSERT_TRUE(fs::exists(path("ckpt/step_4"))) << "no step-4 checkpoint";
  fs::remove_all(path("ckpt/step_8"));
  std::ofstream(path("ckpt/latest"), std::ios::trunc) << "step_4\n";
  const auto resumed = losses(train(base(8) + " --device cuda --resume" + ckpt, "resumed.jsonl"));
  ASSERT_EQ(resumed.size(), 4u);
  for (size_t s = 0; s < 4; ++s) EXPECT_EQ(resumed[s], whole[s + 4]) << "step " << s + 5;
  // The final weights, written from the GPU, load on the host.
  const auto w = test::run_paratrain(base(2) + " --device cuda --save-final " + path("w.safetensors"), 300);
  ASSERT_EQ(w.rc, 0) << w.out;
  EXPECT_TRUE(fs::exists(path("w.safetensors")));
}

// The CNN classifier (conv2d and max-pool kernels on the GPU) follows the CPU's run: the same
// images, initialisation and AdamW; f32 on both sides, only summation orders differ (the
// GEMMs of the convolutions and linear layers, the bias and loss reductions), ~1e-6 relative
// per step. A max-pool whose two largest values sit within rounding could route one gradient
// elsewhere (a rare, small change), so 1e-3 relative over 6 steps leaves room for that too.
// The test-set accuracy is computed from the GPU's logits and equals the CPU's up to a
// near-tie image or two.
TEST_F(TrainCommandOnGpu, CnnFollowsTheCpuRun) {
  PT_REQUIRE_GPU();
  write_image_set(dir_, 512, 200);
  const std::string args = "train --model cnn --dataset fashion-mnist --data-dir " + dir_ +
                           " --steps 6 --micro-batch 32 --grad-accum 2 --lr 2e-3 --seed 3 --quiet";
  const auto cpu = train(args + " --device cpu", "cnn_cpu.jsonl");
  const auto gpu = train(args + " --device cuda", "cnn_gpu.jsonl");
  ASSERT_NO_FATAL_FAILURE(expect_follows(gpu, cpu, 6, 1e-3));
  EXPECT_EQ(gpu[0]["device"], "cuda:0");
  EXPECT_LT(gpu.back()["loss"].get<double>(), gpu.front()["loss"].get<double>());
  const double cpu_acc = accuracy(path("cnn_cpu.jsonl")), gpu_acc = accuracy(path("cnn_gpu.jsonl"));
  ASSERT_GE(gpu_acc, 0.0) << "no evaluation line in the GPU run's metrics";
  EXPECT_NEAR(gpu_acc, cpu_acc, 2.0 / 200);
  // bf16 autocast runs the convolutions in bf16 on the GPU, and learns as well.
  const auto bf16 = losses(train(args + " --device cuda --precision bf16", "cnn_bf16.jsonl"));
  ASSERT_EQ(bf16.size(), 6u);
  for (double l : bf16) EXPECT_TRUE(std::isfinite(l));
  EXPECT_NEAR(bf16.back(), gpu.back()["loss"].get<double>(), 0.05 * gpu.back()["loss"].get<double>());
}

// --tp 2 on two ranks (two_ranks_on_gpus: two GPUs over nccl, or one shared over shm) against
// --tp 2 on the CPU (shm): the same cut model, data and AdamW; only the summation order of the GEMMs, reductions, attention and the
// LayerNorm parameter sums differs (f32 both, no TF32; two ranks add a + b either way), as
// in F32FollowsTheCpuRunAndReportsTheGpu, so 6 steps stay within 1e-3 relative; plain and
// with --sequence-parallel (without dropout: a GPU draws other masks than the CPU).
TEST_F(TrainCommandOnGpu, TensorParallelOnTwoRanksFollowsTheCpu) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const std::string launch = "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                             " train --model gpt-nano --data " + path("tokens.bin") +
                             " --steps 6 --micro-batch 4 --grad-accum 2 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet --tp 2";
  for (const std::string extra : {"", " --sequence-parallel"}) {
    SCOPED_TRACE("--tp 2" + extra);
    const auto cpu = train(launch + extra + " --device cpu", "tp_cpu.jsonl");
    const auto gpu = train(launch + extra + two_ranks_on_gpus(), "tp_gpu.jsonl");
    ASSERT_NO_FATAL_FAILURE(expect_follows(gpu, cpu, 6, 1e-3));
    EXPECT_EQ(gpu[0]["device"], "cuda:0");
    EXPECT_GT(gpu[0]["tp_comm_calls"].get<int64_t>(), 0);
    EXPECT_EQ(gpu[0]["tp_comm_bytes"], cpu[0]["tp_comm_bytes"]);  // the same collectives
    fs::remove(path("tp_cpu.jsonl"));
    fs::remove(path("tp_gpu.jsonl"));
  }
}

// Pipeline parallelism on two ranks (two stages: over nccl's posting-order send/recv on two
// GPUs, or over shm's tagged send/recv of staged buffers on one) follows
// the CPU's --pp 2 run with the same schedule: the same data, initialisation and AdamW, f32
// both sides, only summation orders differ (as in TensorParallelOnTwoRanksFollowsTheCpu). The
// final weights are gathered from both stages' GPU buffers into a file of
// the CPU run's size: every tensor, with its shape, is there.
TEST_F(TrainCommandOnGpu, PipelineOnTwoRanksFollowsTheCpu) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const std::string launch = "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                             " train --model gpt-nano --data " + path("tokens.bin") +
                             " --steps 6 --micro-batch 4 --grad-accum 4 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet --pp 2";
  for (const std::string schedule : {"1f1b", "zb1p", "interleaved"}) {
    SCOPED_TRACE("--pp 2 --pp-schedule " + schedule);
    // interleaved: 2 chunks per GPU, 4 stages, so 4 blocks (gpt-nano has 2)
    const std::string run = launch + " --pp-schedule " + schedule + (schedule == "interleaved" ? " --n-layer 4" : "");
    const auto cpu = train(run + " --device cpu --save-final " + path("pp_cpu.safetensors"), "pp_cpu.jsonl");
    const auto gpu = train(run + two_ranks_on_gpus() + " --save-final " + path("pp_gpu.safetensors"), "pp_gpu.jsonl");
    ASSERT_NO_FATAL_FAILURE(expect_follows(gpu, cpu, 6, 1e-3));
    EXPECT_EQ(gpu[0]["device"], "cuda:0");
    ASSERT_TRUE(fs::exists(path("pp_gpu.safetensors")));
    EXPECT_EQ(fs::file_size(path("pp_gpu.safetensors")), fs::file_size(path("pp_cpu.safetensors")));
    for (const char* f : {"pp_cpu.jsonl", "pp_gpu.jsonl", "pp_cpu.safetensors", "pp_gpu.safetensors"}) fs::remove(path(f));
  }
}

// Two ranks (two_ranks_on_gpus) against one GPU taking both halves of
// the batch as micro-batches: the same global batch, so the same losses up to summation order.
TEST_F(TrainCommandOnGpu, DdpOnTwoRanksMatchesOneGpu) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const std::string one = "train --model gpt-nano --data " + path("tokens.bin") +
                          " --steps 6 --micro-batch 4 --grad-accum 2 --seed 3 --quiet --device cuda";
  const auto single = losses(train(one, "one.jsonl"));
  const auto two = losses(train("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                                    " train --model gpt-nano --data " + path("tokens.bin") +
                                    " --steps 6 --micro-batch 4 --seed 3 --quiet" + two_ranks_on_gpus(),
                                "two.jsonl"));
  ASSERT_EQ(two.size(), single.size());
  for (size_t s = 0; s < two.size(); ++s) EXPECT_NEAR(two[s], single[s], 1e-3 * single[s]) << "step " << s + 1;
  // bf16 gradient compression: the buckets cast on the GPUs, the mean summed in bf16
  const auto bf16 = losses(train("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                                     " train --model gpt-nano --data " + path("tokens.bin") +
                                     " --steps 6 --micro-batch 4 --seed 3 --quiet --compress bf16" +
                                     two_ranks_on_gpus(),
                                 "two_bf16.jsonl"));
  ASSERT_EQ(bf16.size(), single.size());
  for (size_t s = 0; s < bf16.size(); ++s) EXPECT_NEAR(bf16[s], single[s], 2e-2 * single[s]) << "bf16, step " << s + 1;
}

// --deterministic on two ranks: the group sums in rank order (nccl: the ranks' contributions
// gathered by grouped sends/recvs and combined by one kernel), so two ranks with one
// micro-batch each write the same weights, byte for byte, as one GPU accumulating both, as
// two CPU ranks do against one CPU process (AdamW: bit-identity leaves no noise to amplify).
TEST_F(TrainCommandOnGpu, DeterministicTwoRanksAreBitIdenticalToOneAccumulating) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  const std::string args = " train --model gpt-nano --data " + path("tokens.bin") +
                           " --steps 5 --micro-batch 4 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet"
                           " --deterministic --save-final ";
  const auto one = test::run_paratrain(args + path("one.st") + " --grad-accum 2 --device cuda", 300);
  ASSERT_EQ(one.rc, 0) << one.out;
  const auto two = test::run_paratrain("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) + args +
                                           path("two.st") + two_ranks_on_gpus(), 300);
  ASSERT_EQ(two.rc, 0) << two.out;
  auto bytes = [&](const std::string& name) {
    std::ifstream in(path(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const std::string w = bytes("one.st");
  ASSERT_FALSE(w.empty());
  EXPECT_TRUE(bytes("two.st") == w) << "two ranks --deterministic differ from one GPU --grad-accum 2";
}

// PowerSGD on two ranks (factors, error feedback and Gram-Schmidt on the devices, the two
// all-reduces over the group) follows the same PowerSGD run of two CPU ranks: the same arithmetic
// in f32 up to summation order. --balance auto on two ranks, rank 1 simulated 20x slower
// (PARATRAIN_SIMULATE_SLOWDOWN, idling before each backward): the compute it measures up to
// the step's loss read-back moves most of each micro-step's 8 sequences to rank 0.
TEST_F(TrainCommandOnGpu, PowerSgdAndBalanceAutoOnTwoRanks) {
  PT_REQUIRE_GPU();
  PT_REQUIRE_TWO_RANKS();
  auto two = [&](int steps) {
    return "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) + " train --model gpt-nano --data " +
           path("tokens.bin") + " --steps " + std::to_string(steps) +
           " --micro-batch 4 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet";
  };
  const std::string powersgd = " --compress powersgd --powersgd-rank 4 --powersgd-start-iter 2";
  const auto cpu = train(two(8) + powersgd + " --device cpu", "psgd_cpu.jsonl");
  const auto gpu = train(two(8) + powersgd + two_ranks_on_gpus(), "psgd_gpu.jsonl");
  expect_follows(gpu, cpu, 8, 1e-3);

  const auto r = test::run_shell_line("PARATRAIN_SIMULATE_SLOWDOWN=1:20 timeout 300 " + std::string(PARATRAIN_BIN) +
                                      " " + two(14) + two_ranks_on_gpus() + " --balance auto --metrics " +
                                      path("bal.jsonl") + " 2>&1");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("balance: from step"), std::string::npos) << r.out;
  std::vector<int64_t> last;
  std::ifstream in(path("bal.jsonl"));
  for (std::string l; std::getline(in, l);) {
    auto j = nlohmann::json::parse(l);
    if (!j.contains("eval")) last = j["micro_batch_per_rank"].get<std::vector<int64_t>>();
  }
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0] + last[1], 8);
  EXPECT_GE(last[0], 5) << "the fast GPU should take most of each micro-step's 8 sequences";
}

// ZeRO 3 on one GPU follows the plain one-GPU run (its units are gathered and reduced on the
// device; one rank moves no bytes, so only the order of the GPU kernels may differ); on two
// GPUs, f32 and with bf16 gathers and reduce-scatters (--compress bf16), against one GPU.
TEST_F(TrainCommandOnGpu, ZeroThreeMatchesPlainDataParallel) {
  PT_REQUIRE_GPU();
  const auto plain = losses(train(base(6) + " --device cuda", "plain.jsonl"));
  const auto zero3 = losses(train(base(6) + " --device cuda --zero 3", "zero3.jsonl"));
  ASSERT_EQ(zero3.size(), plain.size());
  for (size_t s = 0; s < plain.size(); ++s) EXPECT_NEAR(zero3[s], plain[s], 1e-4 * plain[s]) << "step " << s + 1;
  PT_REQUIRE_TWO_RANKS();
  const std::string two = "launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                          " train --model gpt-nano --data " + path("tokens.bin") +
                          " --steps 6 --micro-batch 4 --lr 1e-3 --grad-clip 1.0 --seed 3 --quiet --zero 3" +
                          two_ranks_on_gpus();
  const auto f32 = losses(train(two, "two_f32.jsonl"));
  const auto bf16 = losses(train(two + " --compress bf16", "two_bf16.jsonl"));
  ASSERT_EQ(f32.size(), plain.size());
  ASSERT_EQ(bf16.size(), plain.size());
  for (size_t s = 0; s < plain.size(); ++s) {
    EXPECT_NEAR(f32[s], plain[s], 1e-3 * plain[s]) << "f32, step " << s + 1;
    EXPECT_NEAR(bf16[s], plain[s], 2e-2 * plain[s]) << "bf16 collectives, step " << s + 1;
  }
}
