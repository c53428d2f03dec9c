// `paratrain train` with several ranks, as real processes: under `paratrain launch`, under
// a real `mpirun`, and with Slurm's variables set by hand. The three give the same final
// weights bit for bit (two ranks: a + b rounds the same in every algorithm), close to one
// process accumulating the same global batch, and with --deterministic bit-identical to it.
// Every spawned process has a deadline and is killed (its whole process group) past it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "parallel/train_multirank_util.h"
#include "paratrain/checkpoint/safetensors.h"

namespace fs = std::filesystem;
using namespace paratrain;

namespace {

using paratrain::test::kBin;
using paratrain::test::max_rel_diff;
using paratrain::test::Result;
using paratrain::test::TrainMultiRank;
using paratrain::test::read_text;
using paratrain::test::spawn;
using paratrain::test::split;

TEST_F(TrainMultiRank, LaunchMpirunAndSlurmGiveTheSameWeights) {
  // SGD: AdamW would turn the rounding noise of zero-gradient elements (key biases) into
  // full-size steps, which says nothing about data parallelism.
  const std::string opt = " --optimizer sgd --lr 0.1";
  Result one = single(train_args("--grad-accum 2 --save-final one.st" + opt));
  ASSERT_TRUE(one.ok()) << one.output;

  Result l = launch(2, train_args("--save-final launch.st --metrics m.jsonl" + opt));
  ASSERT_TRUE(l.ok()) << l.output;
  EXPECT_NE(l.output.find("global batch 4 x 1 x 2 = 8"), std::string::npos) << l.output;
  EXPECT_EQ(l.output.find("[1] paratrain train"), std::string::npos) << "only rank 0 prints: " << l.output;

  Result m = mpirun(2, train_args("--save-final mpi.st" + opt));
  ASSERT_TRUE(m.ok()) << m.output;
  Result s = slurm(2, train_args("--save-final slurm.st" + opt));
  ASSERT_TRUE(s.ok()) << s.output;

  const std::string w = read_text(path("launch.st"));
  ASSERT_FALSE(w.empty());
  EXPECT_TRUE(read_text(path("mpi.st")) == w) << "mpirun's weights differ from launch's";
  EXPECT_TRUE(read_text(path("slurm.st")) == w) << "Slurm's weights differ from launch's";
  EXPECT_LT(max_rel_diff(path("launch.st"), path("one.st")), 1e-6) << "2 ranks vs 1 process with K=2";

  // Metrics: rank 0 writes one line per step with per-rank arrays and the global rate.
  // The timings are intervals of one steady clock within rank 0's step (trainer.cpp, ddp.cpp):
  //   step t0 <= compute end (compute_ms_per_rank) <= finish() entry <= ... <= finish() exit <= step end,
  //   the first bucket launches during backward (every gpt-nano parameter gets a gradient),
  //   comm_ms = first launch .. finish() exit, exposed_comm_ms = finish() entry .. exit,
  //   data_wait_ms = time spent blocked in the loader's next(), inside the compute span.
  // So 0 < exposed <= comm < step, compute_ms = step - exposed, rank 0's compute + exposed <= step
  // and data_wait <= rank 0's compute. (data_wait may be ~0: a batch prepared in the
  // background is not waited for, so it has no lower bound to check.)
  // compute_ms_per_rank and step_ms_per_rank travel as f32 (the all-gather): a relative slack
  // of 1e-6 covers that rounding and nothing else.
  std::ifstream f(path("m.jsonl"));
  int lines = 0;
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) continue;
    ++lines;
    EXPECT_EQ(j["mem_peak_bytes"].size(), 2u) << line;
    ASSERT_EQ(j["mem_allocated_bytes"].size(), 2u) << line;
    ASSERT_EQ(j["mem_reserved_bytes"].size(), 2u) << line;
    for (int r = 0; r < 2; ++r) {
      EXPECT_GT(j["mem_allocated_bytes"][r].get<int64_t>(), 0) << "rank " << r << ": " << line;
      EXPECT_LE(j["mem_allocated_bytes"][r].get<int64_t>(), j["mem_reserved_bytes"][r].get<int64_t>()) << line;
    }
    ASSERT_EQ(j["step_ms_per_rank"].size(), 2u) << line;
    ASSERT_EQ(j["compute_ms_per_rank"].size(), 2u) << line;
    EXPECT_GT(j["tokens_per_s"].get<double>(), 0) << line;
    EXPECT_TRUE(std::isfinite(j["loss"].get<double>())) << line;
    EXPECT_FALSE(j.contains("host_waits")) << "a CPU run has no GPU to wait for: " << line;
    const double step_ms = j["step_ms"].get<double>(), comm = j["comm_ms"].get<double>(),
                 exposed = j["exposed_comm_ms"].get<double>(), compute = j["compute_ms"].get<double>(),
                 data_wait = j["data_wait_ms"].get<double>();
    const double rank0_compute = j["compute_ms_per_rank"][0].get<double>(), f32 = 1e-6 * step_ms;
    EXPECT_GT(comm, 0) << "2 ranks all-reduce their gradients every step: " << line;
    EXPECT_GT(exposed, 0) << line;
    EXPECT_LE(exposed, comm) << "finish() waits within the span that starts at the first bucket's launch: " << line;
    EXPECT_LT(comm, step_ms) << "the buckets launch and complete within the step: " << line;
    EXPECT_DOUBLE_EQ(compute + exposed, step_ms) << "compute_ms is the step less the exposed wait: " << line;
    EXPECT_NEAR(j["step_ms_per_rank"][0].get<double>(), step_ms, f32) << "rank 0's own step time: " << line;
    EXPECT_LE(rank0_compute + exposed, step_ms + f32) << "backward and finish() do not overlap: " << line;
    EXPECT_LE(data_wait, rank0_compute + f32) << "the loader is waited for inside the compute span: " << line;
    for (int r = 0; r < 2; ++r)  // both f32: rounding keeps the order
      EXPECT_LE(j["compute_ms_per_rank"][r].get<double>(), j["step_ms_per_rank"][r].get<double>())
          << "rank " << r << ": " << line;
  }
  EXPECT_EQ(lines, 10);
}

TEST_F(TrainMultiRank, BalanceAutoGivesTheSlowRankLessAndKeepsTheGradient) {
  // Rank 1 behaves like a device 20x slower. --balance auto measures it and moves items of
  // every micro-step to rank 0; the loss weights keep the gradient the global-batch mean, so
  // the weights stay those of one process accumulating the same global batch.
  // The split follows measured compute times (a few ms a step here, on a shared machine), so
  // the slowdown keeps a 10x margin: 20x gives 7 of 8 sequences to rank 0, and fewer than 5
  // would take a measured ratio under 5:3, twelve times less than the simulated one.
  const std::string args = "train --model gpt-nano --data t.bin --steps 16 --micro-batch 4 --quiet --optimizer sgd --lr 0.1 ";
  Result one = single(args + "--grad-accum 2 --save-final one.st");
  ASSERT_TRUE(one.ok()) << one.output;
  std::vector<std::string> argv = {kBin, "launch", "--nproc-per-node", "2", "--", kBin};
  for (auto& a : split(args + "--balance auto --save-final bal.st --metrics bal.jsonl")) argv.push_back(a);
  Result l = spawn({argv}, {{"PARATRAIN_SIMULATE_SLOWDOWN=1:20"}}, dir_, 120);
  ASSERT_TRUE(l.ok()) << l.output;
  EXPECT_NE(l.output.find("balance: from step"), std::string::npos) << l.output;
  std::vector<int64_t> last;
  std::ifstream f(path("bal.jsonl"));
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (!j.contains("eval")) last = j["micro_batch_per_rank"].get<std::vector<int64_t>>();
  }
  ASSERT_EQ(last.size(), 2u);
  EXPECT_EQ(last[0] + last[1], 8);
  EXPECT_GE(last[0], 5) << "the fast rank should take most of each micro-step's 8 sequences";
  EXPECT_LT(max_rel_diff(path("bal.st"), path("one.st")), 1e-5) << "balanced 2 ranks vs 1 process, K=2";
}

TEST_F(TrainMultiRank, MalformedSimulatedSlowdownIsAUsageError) {
  std::vector<std::string> argv = {kBin};
  for (auto& a : split(train_args(""))) argv.push_back(a);
  Result a = spawn({argv}, {{"PARATRAIN_SIMULATE_SLOWDOWN=1-3"}}, dir_, 60);
  EXPECT_EQ(a.codes[0], 2) << a.output;
  EXPECT_NE(a.output.find("PARATRAIN_SIMULATE_SLOWDOWN='1-3' is not RANK:FACTOR"), std::string::npos) << a.output;
  Result b = spawn({argv}, {{"PARATRAIN_SIMULATE_SLOWDOWN=0:0.5"}}, dir_, 60);
  EXPECT_EQ(b.codes[0], 2) << b.output;
  EXPECT_NE(b.output.find("factor must be at least 1"), std::string::npos) << b.output;
}

TEST_F(TrainMultiRank, ValidationTooShortForOneBatchOfAllRanksIsNamed) {
  // 4 windows of 65 tokens: one evaluation batch of 4 for one rank, none of 4 x 2 for two.
  paratrain::test::write_structured_token_file(path("v.bin"), 4 * 64 + 1);
  Result one = single(train_args("--val-data v.bin"));
  EXPECT_TRUE(one.ok()) << one.output;
  Result two = launch(2, train_args("--val-data v.bin"));
  EXPECT_FALSE(two.timed_out) << two.output;
  EXPECT_NE(two.codes[0], 0) << two.output;
  EXPECT_NE(two.output.find("--val-data v.bin is too short for one evaluation batch of 4 x 2 windows"),
            std::string::npos)
      << two.output;
}

TEST_F(TrainMultiRank, RanksShareEvaluationOverTheSameWindowsAsOneProcess) {
  // lr 0: the weights stay the initial ones, so 1 rank x 8 and 2 ranks x 4 must score the
  // same 10 x 8 validation windows to rounding (before, rank 0 alone scored 10 x 4 of them).
  auto val_loss = [&](const std::string& metrics) {
    double v = -1;
    std::ifstream f(path(metrics));
    for (std::string line; std::getline(f, line);)
      if (auto j = nlohmann::json::parse(line); j.contains("eval")) v = j["val_loss"].get<double>();
    return v;
  };
  const std::string args =
      "train --model gpt-nano --data t.bin --val-data t.bin --steps 1 --lr 0 --eval-batches 10 --threads 1 --quiet ";
  Result one = single(args + "--micro-batch 8 --metrics one.jsonl");
  ASSERT_TRUE(one.ok()) << one.output;
  Result two = launch(2, args + "--micro-batch 4 --metrics two.jsonl");
  ASSERT_TRUE(two.ok()) << two.output;
  const double a = val_loss("one.jsonl"), b = val_loss("two.jsonl");
  ASSERT_GT(a, 0);
  EXPECT_NEAR(b, a, 1e-5 * a);
}

TEST_F(TrainMultiRank, BalanceRejectsDeterministicAndUnknownModes) {
  Result a = single(train_args("--balance auto --deterministic"));
  EXPECT_EQ(a.codes[0], 2) << a.output;
  EXPECT_NE(a.output.find("--balance auto cannot be combined with --deterministic"), std::string::npos) << a.output;
  Result b = single(train_args("--balance fast"));
  EXPECT_EQ(b.codes[0], 2) << b.output;
  EXPECT_NE(b.output.find("--balance"), std::string::npos) << b.output;
}

TEST_F(TrainMultiRank, DeterministicIsBitIdenticalToOneProcess) {
  // AdamW (the default): bit-identity leaves no rounding noise to amplify.
  Result one = single(train_args("--grad-accum 3 --deterministic --save-final one.st"));
  ASSERT_TRUE(one.ok()) << one.output;
  Result l = launch(3, train_args("--deterministic --save-final three.st"));
  ASSERT_TRUE(l.ok()) << l.output;
  Result s = slurm(3, train_args("--deterministic --backend tcp --save-final three_tcp.st"));
  ASSERT_TRUE(s.ok()) << s.output;
  const std::string w = read_text(path("one.st"));
  ASSERT_FALSE(w.empty());
  EXPECT_TRUE(read_text(path("three.st")) == w) << "3 ranks (shm) vs 1 process, max rel "
                                                << max_rel_diff(path("three.st"), path("one.st"));
  EXPECT_TRUE(read_text(path("three_tcp.st")) == w) << "3 ranks (tcp) vs 1 process";
}

TEST_F(TrainMultiRank, AccumulationAcrossRanks) {
  // 2 ranks x K=2 x 2 sequences against 1 process x 1 x 8 sequences (the same global batch).
  const std::string opt = " --optimizer sgd --lr 0.1";
  Result big = single("train --model gpt-nano --data t.bin --steps 10 --micro-batch 8 --quiet --save-final big.st" + opt);
  ASSERT_TRUE(big.ok()) << big.output;
  Result l = launch(2, "train --model gpt-nano --data t.bin --steps 10 --micro-batch 2 --grad-accum 2 --quiet "
                       "--save-final acc.st" + opt);
  ASSERT_TRUE(l.ok()) << l.output;
  EXPECT_NE(l.output.find("global batch 2 x 2 x 2 = 8"), std::string::npos) << l.output;
  EXPECT_LT(max_rel_diff(path("acc.st"), path("big.st")), 1e-6);
}

TEST_F(TrainMultiRank, BadDpIsAUsageError) {
  Result l = launch(2, train_args("--dp 3"));
  EXPECT_FALSE(l.timed_out) << l.output;
  EXPECT_NE(l.codes[0], 0) << l.output;
  EXPECT_NE(l.output.find("--dp 3"), std::string::npos) << l.output;
}

// Real data: the CNN on Fashion-MNIST with 2 ranks. Kept to 400 steps of 2 x 32 images (about
// 25k images, under half an epoch) so it runs in about a minute; the 90% needs
// several epochs and is a benchmark-length run, so the floor here is 85%.
TEST_F(TrainMultiRank, CnnFashionMnistTwoRanks) {
  ASSERT_TRUE(fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      << "Fashion-MNIST is missing: scripts/install_deps.sh installs dataset-fashion-mnist";
  Result l = launch(2, "train --model cnn --dataset fashion-mnist --steps 400 --micro-batch 32 --lr 2e-3 --quiet "
                       "--metrics cnn.jsonl", 240);
  ASSERT_TRUE(l.ok()) << l.output;
  double acc = -1;
  std::ifstream f(path("cnn.jsonl"));
  for (std::string line; std::getline(f, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) acc = j["accuracy"].get<double>();
  }
  EXPECT_GE(acc, 0.85) << l.output;
}

}  // namespace
