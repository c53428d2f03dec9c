// `paratrain train --tp N` as real processes under `paratrain launch`, against one process
// training the same global batch: gpt-nano and gpt-mini with tp 2 and 4, dp 2 x tp 2,
// sequence parallelism, ZeRO 1 over dp, a vocabulary not divisible by tp, dropout on; the
// per-rank memory; the tensor-parallel traffic against its formula; bad layouts.
//
// Tolerances. Tensor parallelism changes the order of sums (a row-parallel layer adds two
// partial products; the loss adds two shards' exponentials), so results agree to rounding,
// not bit for bit. With SGD (momentum 0.9) every weight agrees to 1e-5 relative after 10
// steps: that is the rounding check. AdamW divides each element's step by its own gradient
// scale, so an element whose gradient is pure rounding noise (the key bias: softmax ignores
// a constant per row, so its exact gradient is 0) takes full-size steps of random sign in
// any two runs that sum in another order: one process against 2 DDP ranks shows 2.4e-4 on
// c_attn.bias with eps 1e-8. The AdamW runs therefore use eps 1e-6 (as the PyTorch parity
// tests do) and check every step's loss and every 2-D weight to 1e-5; 1-D tensors (zero-
// initialised biases whose whole value is ten Adam steps) to 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/train_multirank_util.h"
#include "paratrain/checkpoint/safetensors.h"

namespace fs = std::filesystem;
using namespace paratrain;

namespace {

using paratrain::test::load_weights;
using paratrain::test::max_rel_diff;
using paratrain::test::Result;
using paratrain::test::spawn;
using paratrain::test::TrainMultiRank;
using paratrain::test::Weights;

const std::string kSgd = " --optimizer sgd --lr 0.1 --momentum 0.9";
const std::string kAdamW = " --optimizer adamw --lr 1e-3 --eps 1e-6";

class TensorParallelTrain : public TrainMultiRank {
 protected:
  // Runs `args` with n ranks (0: one process) and asserts success.
  void train(int n, const std::string& args, double timeout_s = 120) {
    Result r = n == 0 ? single(args, timeout_s) : launch(n, args, timeout_s);
    ASSERT_TRUE(r.ok()) << r.output;
  }
  static std::string nano(const std::string& extra) {
    return "train --model gpt-nano --data t.bin --steps 10 --micro-batch 4 --threads 1 --quiet " + extra;
  }
};

TEST_F(TensorParallelTrain, GptNanoTp2AndTp4MatchOneProcess) {
  // gpt-nano with 4 heads, so that tp 4 gives each rank whole heads.
  const std::string heads = " --n-head 4";
  for (const std::string& opt : {kSgd, kAdamW}) {
    const bool adam = opt == kAdamW;
    train(0, nano("--save-final one.st --metrics one.jsonl" + heads + opt));
    train(2, nano("--tp 2 --save-final tp2.st --metrics tp2.jsonl" + heads + opt));
    train(4, nano("--tp 4 --save-final tp4.st --metrics tp4.jsonl" + heads + opt));
    std::printf("  %s\n", adam ? "AdamW" : "SGD");
    expect_weights_near("tp2.st", "one.st", 1e-5, adam ? 1e-3 : 0);
    expect_weights_near("tp4.st", "one.st", 1e-5, adam ? 1e-3 : 0);
    expect_losses_near("tp2.jsonl", "one.jsonl", 1e-5);
    expect_losses_near("tp4.jsonl", "one.jsonl", 1e-5);
  }
  const auto m = steps_of("tp4.jsonl");
  ASSERT_EQ(m.size(), 10u);
  EXPECT_EQ(m[0]["layout"], (nlohmann::json{{"dp", 1}, {"tp", 4}, {"pp", 1}}));
  EXPECT_EQ(m[0]["mem_peak_bytes"].size(), 4u);
}

TEST_F(TensorParallelTrain, GptMiniTp2AndTp4MatchOneProcessAndTp2HalvesPerRankMemory) {
  const std::string mini = "train --model gpt-mini --data t.bin --vocab-size 256 --steps 10 --micro-batch 2 --threads 1 --quiet ";
  for (const std::string& opt : {kSgd, kAdamW}) {
    train(0, mini + "--save-final one.st --metrics one.jsonl" + opt, 240);
    train(2, mini + "--tp 2 --save-final tp2.st --metrics tp2.jsonl" + opt, 240);
    std::printf("  %s\n", opt == kAdamW ? "AdamW" : "SGD");
    expect_weights_near("tp2.st", "one.st", 1e-5, opt == kAdamW ? 1e-3 : 0);
    expect_losses_near("tp2.jsonl", "one.jsonl", 1e-5);
  }
  // Per-rank peak memory (the allocator's, after the first step's first touch): parameters,
  // gradients and AdamW state are halved, and so are the activations inside attention and
  // the MLP; the LayerNorm inputs and the residual stream stay whole on every rank.
  const auto one = steps_of("one.jsonl"), tp2 = steps_of("tp2.jsonl");
  const double one_peak = one.back()["mem_peak_bytes"][0].get<double>();
  double tp2_peak = 0;
  for (const auto& p : tp2.back()["mem_peak_bytes"]) tp2_peak = std::max(tp2_peak, p.get<double>());
  std::printf("  gpt-mini per-rank peak: one process %.1f MiB, tp 2 %.1f MiB (%.2fx)\n", one_peak / (1 << 20),
              tp2_peak / (1 << 20), tp2_peak / one_peak);
  EXPECT_LT(tp2_peak, 0.7 * one_peak);
  // tp 4 needs heads divisible by 4: gpt-mini with 8 heads of 48.
  train(0, mini + "--n-head 8 --save-final one8.st" + kAdamW, 240);
  train(4, mini + "--n-head 8 --tp 4 --save-final tp4.st" + kAdamW, 240);
  expect_weights_near("tp4.st", "one8.st", 1e-5, 1e-3);
}

TEST_F(TensorParallelTrain, DataParallelTimesTensorParallelWithAndWithoutZero) {
  // dp 2 x tp 2 (4 ranks) against one process accumulating the same global batch of 8.
  train(0, nano("--grad-accum 2 --save-final one.st" + kSgd));
  train(4, nano("--tp 2 --save-final dp2tp2.st --metrics m.jsonl" + kSgd));
  expect_weights_near("dp2tp2.st", "one.st", 1e-5);
  EXPECT_EQ(steps_of("m.jsonl")[0]["layout"], (nlohmann::json{{"dp", 2}, {"tp", 2}, {"pp", 1}}));
  // ZeRO 1 and 2 over the dp group (momentum state and, for 2, gradients sharded).
  train(4, nano("--tp 2 --zero 1 --save-final z1.st" + kSgd));
  expect_weights_near("z1.st", "one.st", 1e-5);
  train(4, nano("--tp 2 --zero 2 --sequence-parallel --save-final z2.st" + kSgd));
  expect_weights_near("z2.st", "one.st", 1e-5);
  // Gradient compression over dp: bf16 buckets (the gradients' bf16 rounding, 2^-9).
  train(4, nano("--tp 2 --compress bf16 --save-final c.st --metrics c.jsonl" + kSgd));
  expect_weights_near("c.st", "one.st", 1e-2);
  const auto c = steps_of("c.jsonl");
  EXPECT_EQ(c[0]["comm_bytes"].get<int64_t>() * 2, c[0]["comm_bytes_uncompressed"].get<int64_t>()) << c[0].dump();
}

TEST_F(TensorParallelTrain, SequenceParallelPaddedVocabularyAndDropout) {
  train(0, nano("--save-final one.st" + kSgd));
  train(2, nano("--tp 2 --sequence-parallel --save-final sp.st --metrics sp.jsonl" + kSgd));
  expect_weights_near("sp.st", "one.st", 1e-5);
  EXPECT_TRUE(steps_of("sp.jsonl")[0]["sequence_parallel"].get<bool>());
  // 257 tokens over 2 ranks: padded to 258 inside, never in the file.
  train(0, nano("--vocab-size 257 --save-final v1.st" + kSgd));
  train(2, nano("--vocab-size 257 --tp 2 --save-final v2.st" + kSgd));
  expect_weights_near("v2.st", "v1.st", 1e-5);
  EXPECT_EQ(checkpoint::load_safetensors(path("v2.st")).at("wte.weight").shape(), (Shape{257, 64}));
  // Dropout: the masks do not depend on the tensor-parallel layout (replicated regions draw
  // one stream on every rank; the sequence-split ones take their rows of the same mask).
  train(0, nano("--dropout 0.1 --save-final d1.st" + kSgd));
  train(2, nano("--dropout 0.1 --tp 2 --save-final d2.st" + kSgd));
  train(2, nano("--dropout 0.1 --tp 2 --sequence-parallel --save-final d3.st" + kSgd));
  expect_weights_near("d2.st", "d1.st", 1e-5);
  expect_weights_near("d3.st", "d1.st", 1e-5);
  // And dropout matters: without it the weights are far from these.
  EXPECT_GT(max_rel_diff(path("d1.st"), path("one.st")), 1e-3);
}

TEST_F(TensorParallelTrain, TrafficMatchesTheFormulaAndIsReported) {
  train(2, nano("--tp 2 --grad-accum 2 --metrics m.jsonl"));
  // Per micro-batch of N = B x T tokens, C wide, L layers (payload per rank, f32): forward one
  // all-reduce after the embedding and two per layer, backward two per layer and one at the
  // head's input, all of N x C; the loss's MAX of N and SUM of 2N floats.
  const int64_t N = 4 * 64, C = 64, L = 2, K = 2;
  const int64_t expected = K * ((4 * L + 2) * N * C * 4 + 3 * N * 4);
  for (const auto& m : steps_of("m.jsonl")) {
    EXPECT_EQ(m["tp_comm_bytes"].get<int64_t>(), expected) << m.dump();
    EXPECT_EQ(m["tp_comm_calls"].get<int64_t>(), K * (1 + 2 * L + 2 * L + 1 + 2)) << m.dump();
    EXPECT_GT(m["tp_comm_ms"].get<double>(), 0.0) << m.dump();
    EXPECT_LT(m["tp_comm_ms"].get<double>(), m["step_ms"].get<double>()) << m.dump();
  }
}

TEST_F(TensorParallelTrain, BadLayoutsExitTwoWithOneLineAndWriteNothing) {
  struct Case {
    int ranks;
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {2, "--tp 3", "does not divide the 2 ranks"},
      {2, "--dp 2 --tp 2", "layout --dp 2 --tp 2 --pp ? does not divide the 2 ranks"},
      {2, "--dp 1 --tp 1 --pp 1", "dp 1 x tp 1 x pp 1 = 1 ranks, but this job has 2"},
      {2, "--tp 2 --n-head 3 --n-embd 96", "--tp 2 does not divide the 3 attention heads"},
      {2, "--pp 2 --n-layer 1", "2 pipeline stages, but the model has only 1 blocks"},
      {2, "--tp 2 --sequence-parallel --block-size 63", "does not divide the sequence length --block-size 63"},
      {0, "--sequence-parallel", "--sequence-parallel needs --tp 2 or more"},
      {0, "--tp 2", "does not divide the 1 ranks"},
  };
  for (const auto& c : cases) {
    const std::string args = nano(c.args + " --save-final out.st --metrics m.jsonl --checkpoint-dir ck");
    Result r = c.ranks ? launch(c.ranks, args) : single(args);
    ASSERT_FALSE(r.timed_out) << r.output;
    EXPECT_EQ(r.codes[0], 2) << c.args << ":\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << ":\n" << r.output;
    EXPECT_FALSE(fs::exists(path("out.st")) || fs::exists(path("m.jsonl")) || fs::exists(path("ck"))) << c.args;
  }
  Result mlp = launch(2, "train --model mlp --dataset fashion-mnist --steps 1 --tp 2 --quiet");
  EXPECT_EQ(mlp.codes[0], 2) << mlp.output;
  EXPECT_NE(mlp.output.find("tensor parallelism is built for the GPT models"), std::string::npos) << mlp.output;
  mlp = launch(2, "train --model mlp --dataset fashion-mnist --steps 1 --pp 2 --quiet");
  EXPECT_EQ(mlp.codes[0], 2) << mlp.output;
  EXPECT_NE(mlp.output.find("pipeline parallelism cuts the GPT models' blocks"), std::string::npos) << mlp.output;
}

TEST_F(TensorParallelTrain, EvaluationMixedPrecisionAndInitFrom) {
  // Evaluation: tp ranks compute one replica's validation loss together.
  const std::string val = " --val-data t.bin --eval-batches 4";
  train(0, nano("--save-final one.st --metrics one.jsonl" + val));
  train(2, nano("--tp 2 --metrics tp2.jsonl" + val));
  auto val_loss = [&](const std::string& m) {
    std::ifstream f(path(m));
    double v = -1;
    for (std::string line; std::getline(f, line);)
      if (auto j = nlohmann::json::parse(line); j.contains("eval")) v = j["val_loss"].get<double>();
    return v;
  };
  ASSERT_GT(val_loss("one.jsonl"), 0);
  EXPECT_NEAR(val_loss("tp2.jsonl"), val_loss("one.jsonl"), 1e-5 * val_loss("one.jsonl"));
  // bf16 autocast: the same run to bf16 rounding.
  train(0, nano("--precision bf16 --metrics b1.jsonl"));
  train(2, nano("--precision bf16 --tp 2 --metrics b2.jsonl"));
  expect_losses_near("b2.jsonl", "b1.jsonl", 1e-4);
  // fp16: an inf on one rank of dp 2 x tp 2 makes every rank skip that step.
  {
    Result inj = spawn({{"env", "PARATRAIN_TEST_INJECT_INF=3:2", paratrain::test::kBin, "launch", "--nproc-per-node", "4",
                         "--", paratrain::test::kBin, "train", "--model", "gpt-nano", "--data", "t.bin", "--steps", "5",
                         "--micro-batch", "4", "--threads", "1", "--quiet", "--precision", "fp16", "--tp", "2",
                         "--metrics", "inf.jsonl"}},
                       {{}}, dir_, 120);
    ASSERT_TRUE(inj.ok()) << inj.output;
    const auto m = steps_of("inf.jsonl");
    ASSERT_EQ(m.size(), 5u);
    for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["skipped"].get<bool>(), i == 2) << m[i].dump();
    EXPECT_EQ(m[3]["loss_scale"].get<double>(), m[2]["loss_scale"].get<double>() / 2);
  }
  // --init-from: any HF-named file into any layout (lr 0: the file comes back bit for bit).
  train(2, "train --model gpt-nano --data t.bin --steps 1 --lr 0 --threads 1 --quiet --tp 2 --init-from one.st "
           "--save-final back.st");
  EXPECT_TRUE(paratrain::test::read_text(path("back.st")) == paratrain::test::read_text(path("one.st")));
}

}  // namespace
