// A program's own model through the library loop (train/trainer.h, train/supervised_task.h):
// a user MLP in a SupervisedTask trains on 2 ranks exactly as on 1 rank accumulating 2
// micro-batches (losses and evaluation to 1e-5), also with ZeRO 1 and bf16; a run stopped
// after a checkpoint and resumed continues with the uninterrupted run's losses; metrics lines
// are written. Bad use is an InputError naming the problem: a dataset shorter than one global
// batch, a non-scalar loss or one without a gradient, an example of another shape, a model
// without parameters, the built-in tasks' fields, GPT-only options; across 2 real ranks,
// models whose parameters differ and datasets of different sizes fail on every rank, and
// tensor parallelism is refused. Multi-rank runs are real processes with a deadline.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/autograd/engine.h"
#include "paratrain/train/trainer.h"
#include "parallel/train_multirank_util.h"
#include "support/error_of.h"
#include "train/user_task_util.h"

namespace fs = std::filesystem;
using namespace paratrain;
using paratrain::testing::error_of;

namespace {

void expect_close(const std::vector<double>& a, const std::vector<double>& b, double rel, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_LE(std::abs(a[i] - b[i]), rel * std::abs(b[i])) << what << ": step " << i + 1 << ": " << a[i] << " vs " << b[i];
}

class UserTask : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("paratrain_user_task_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  struct Out {
    std::vector<double> losses;
    double val_loss = -1, accuracy = -1;
  };
  // The helper as `n` ranks (torchrun's variables, a fresh port) with `args`; rank 0's figures.
  test::Result ranks(int n, const std::string& args, Out* out = nullptr) {
    const std::string helper = std::string(PARATRAIN_TEST_BIN_DIR) + "/user_task_helper";
    const std::string file = path("out" + std::to_string(runs_++) + ".txt");
    const int port = test::free_port();
    std::vector<std::vector<std::string>> argvs, envs;
    for (int r = 0; r < n; ++r) {
      std::vector<std::string> argv = {helper, "out=" + file};
      for (auto& w : test::split(args)) argv.push_back(w);
      argvs.push_back(argv);
      envs.push_back({"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r), "WORLD_SIZE=" + std::to_string(n),
                      "LOCAL_WORLD_SIZE=" + std::to_string(n), "MASTER_ADDR=127.0.0.1",
                      "MASTER_PORT=" + std::to_string(port), "PARATRAIN_TOKEN=user-task-test"});
    }
    test::Result res = test::spawn(argvs, envs, dir_.string(), 60);
    if (out) {
      std::ifstream f(file);
      std::string key;
      double v;
      while (f >> key >> v) {
        if (key == "loss") out->losses.push_back(v);
        if (key == "val_loss") out->val_loss = v;
        if (key == "accuracy") out->accuracy = v;
      }
    }
    return res;
  }

  fs::path dir_;
  int runs_ = 0;
};

// ---- one process ----

TEST_F(UserTask, TrainsAndEvaluatesAndWritesMetrics) {
  test::BlobsRun run;
  train::TrainConfig cfg = test::blobs_config(12);
  cfg.metrics = path("m.jsonl");
  cfg.eval_every = 6;
  std::vector<int64_t> seen;
  std::ostringstream log;
  const train::TrainResult r = train::train(cfg, run.task, log, [&](const train::StepInfo& s) {
    seen.push_back(s.step);
    EXPECT_EQ(s.steps, 12);
    EXPECT_FALSE(s.skipped);
  });
  ASSERT_EQ(r.losses.size(), 12u);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_LT(r.losses.back(), 0.7 * r.losses.front()) << log.str();
  EXPECT_GT(r.accuracy, 0.6) << log.str();
  EXPECT_GT(r.val_loss, 0.0);
  EXPECT_NE(log.str().find("paratrain train: blobs-mlp"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("examples"), std::string::npos) << log.str();

  std::ifstream f(cfg.metrics);
  int steps = 0, evals = 0;
  for (std::string line; std::getline(f, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("eval")) {
      ++evals;
      EXPECT_TRUE(j.contains("val_loss") && j.contains("accuracy")) << line;
      continue;
    }
    ++steps;
    EXPECT_EQ(j["step"], steps - 1) << line;
    EXPECT_DOUBLE_EQ(j["loss"].get<double>(), r.losses[steps - 1]) << line;
    for (const char* k : {"lr", "grad_norm", "samples_per_s", "step_ms", "mfu", "mem_peak_bytes"})
      EXPECT_TRUE(j.contains(k)) << k << " missing: " << line;
  }
  EXPECT_EQ(steps, 12);
  EXPECT_EQ(evals, 2);  // after step 6 and after the last
}

// A run in two sessions (stop_at_step, then resume) has the uninterrupted run's losses, bit
// for bit; with ZeRO 1 and bf16 too.
TEST_F(UserTask, ResumeContinuesExactly) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    train::TrainConfig cfg = test::blobs_config(8);
    cfg.precision = precision;
    cfg.zero = std::string(precision) == "bf16" ? 1 : 0;
    cfg.checkpoint_every = 4;
    std::ostringstream log;
    train::TrainResult whole, first, second;
    {
      test::BlobsRun run;
      cfg.checkpoint_dir = path(std::string("whole_") + precision);
      whole = train::train(cfg, run.task, log);
    }
    cfg.checkpoint_dir = path(std::string("parts_") + precision);
    {
      test::BlobsRun run;
      cfg.stop_at_step = 4;
      first = train::train(cfg, run.task, log);
    }
    {
      test::BlobsRun run(16, 256, /*model_seed=*/99);  // other initial weights: the checkpoint's count
      cfg.stop_at_step = 0;
      cfg.resume = true;
      second = train::train(cfg, run.task, log);
    }
    ASSERT_EQ(whole.losses.size(), 8u) << log.str();
    ASSERT_EQ(first.losses.size(), 4u) << log.str();
    ASSERT_EQ(second.losses.size(), 4u) << log.str();
    EXPECT_EQ(second.start_step, 4);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(first.losses[i], whole.losses[i]) << "step " << i + 1;
      EXPECT_EQ(second.losses[i], whole.losses[4 + i]) << "step " << 5 + i;
    }
    EXPECT_EQ(second.val_loss, whole.val_loss);
  }
}

TEST_F(UserTask, DatasetShorterThanAGlobalBatchIsNamed) {
  test::BlobsRun run(16, /*n_train=*/10);
  train::TrainConfig cfg = test::blobs_config(2);
  cfg.grad_accum = 2;  // 8 x 2 = 16 examples a step
  const std::string msg = error_of<InputError>([&] { train::train(cfg, run.task, std::cerr); });
  EXPECT_NE(msg.find("task 'blobs-mlp': the training dataset has 10 examples, fewer than one global batch of 16"),
            std::string::npos)
      << msg;
}

// A dataset whose example 5 is wider than example 0.
class RaggedDataset final : public train::Dataset {
 public:
  int64_t size() const override { return 16; }
  train::Example get(int64_t i) const override {
    return {Tensor::full({i == 5 ? 3 : 2}, 0.5), Tensor::full({}, static_cast<double>(i % 3), DType::I32)};
  }
};

TEST_F(UserTask, ExampleOfAnotherShapeIsNamed) {
  test::TinyMlp model(8, 1);
  RaggedDataset data;
  train::SupervisedTask task(
      model, [&](const Tensor& x, const Tensor& y) { return ops::cross_entropy(model.forward(x), y); }, data);
  train::TrainConfig cfg = test::blobs_config(1);
  cfg.grad_accum = 2;  // the step's 16 examples are the whole dataset
  const std::string msg = error_of<InputError>([&] { train::train(cfg, task, std::cerr); });
  EXPECT_NE(msg.find("training example 5's input is f32 [3], but training example 0's is f32 [2]"), std::string::npos)
      << msg;
}

TEST_F(UserTask, LossMustBeAScalarWithAGradient) {
  test::BlobsRun run;
  train::TrainConfig cfg = test::blobs_config(1);
  {
    train::SupervisedTask task(run.model, [&](const Tensor& x, const Tensor&) { return run.model.forward(x); },
                               run.train_set);
    const std::string msg = error_of<InputError>([&] { train::train(cfg, task, std::cerr); });
    EXPECT_NE(msg.find("the loss function returned a tensor of shape [8, 3]; it must return the batch's mean loss as a scalar"),
              std::string::npos)
        << msg;
  }
  {
    train::SupervisedTask task(run.model, [&](const Tensor& x, const Tensor& y) {
      autograd::NoGradGuard ng;
      return ops::cross_entropy(run.model.forward(x), y);
    }, run.train_set);
    const std::string msg = error_of<InputError>([&] { train::train(cfg, task, std::cerr); });
    EXPECT_NE(msg.find("the loss does not depend on the model's parameters"), std::string::npos) << msg;
  }
}

class NoParameters : public nn::Module {};

TEST_F(UserTask, RefusesWhatItCannotTrain) {
  test::BlobsRun run;
  // The built-in tasks' fields.
  train::TrainConfig cfg = test::blobs_config(1);
  cfg.data = "tokens.bin";
  EXPECT_NE(error_of<InputError>([&] { train::train(cfg, run.task, std::cerr); })
                .find("TrainConfig::data is set (tokens.bin), but only the built-in tasks read it"),
            std::string::npos);
  // What cuts a GPT.
  cfg = test::blobs_config(1);
  cfg.zero = 3;
  EXPECT_NE(error_of<InputError>([&] { train::train(cfg, run.task, std::cerr); })
                .find("TrainConfig::zero = 3 shards a GPT block by block, and task 'blobs-mlp' has no GPT"),
            std::string::npos);
  cfg = test::blobs_config(1);
  cfg.recompute = "full";
  EXPECT_NE(error_of<InputError>([&] { train::train(cfg, run.task, std::cerr); }).find("TrainConfig::recompute = full"),
            std::string::npos);
  // No steps and no epoch length: a hand-written Task that leaves steps_per_epoch() at 0.
  struct Bare final : train::Task {
    test::TinyMlp m{4, 1};
    nn::Module& module() override { return m; }
    void fill(const data::BatchRequest&, Tensor&, Tensor&) override {}
    Tensor loss(const Tensor&, const Tensor&) override { return Tensor(); }
  } bare;
  cfg = test::blobs_config(0);
  EXPECT_NE(error_of<InputError>([&] { train::train(cfg, bare, std::cerr); }).find("TrainConfig::steps is 0"),
            std::string::npos);
  // A model without parameters.
  NoParameters none;
  train::SupervisedTask empty(none, [](const Tensor& x, const Tensor&) { return x; }, run.train_set);
  EXPECT_NE(error_of<InputError>([&] { train::train(test::blobs_config(1), empty, std::cerr); })
                .find("has no parameter that requires a gradient"),
            std::string::npos);
  // Nothing was written.
  EXPECT_TRUE(fs::is_empty(dir_));
}

// ---- real ranks ----

// 2 ranks x 1 micro-batch = 1 rank x 2 micro-batches: the same losses and evaluation.
TEST_F(UserTask, TwoRanksMatchOneRankAccumulating) {
  Out one, two;
  test::Result a = ranks(1, "steps=8 accum=2", &one);
  ASSERT_TRUE(a.ok()) << a.output;
  test::Result b = ranks(2, "steps=8 accum=1", &two);
  ASSERT_TRUE(b.ok()) << b.output;
  ASSERT_EQ(one.losses.size(), 8u) << a.output;
  expect_close(two.losses, one.losses, 1e-5, "2 ranks vs 1");
  EXPECT_LT(one.losses.back(), one.losses.front());
  EXPECT_NEAR(two.val_loss, one.val_loss, 1e-5 * one.val_loss);
  EXPECT_NEAR(two.accuracy, one.accuracy, 1e-9);
}

// ZeRO 1 + bf16 on 2 ranks: close to 1 rank accumulating; stopped after a checkpoint and
// resumed, the uninterrupted run's losses.
TEST_F(UserTask, ZeroOneBf16OnTwoRanksResumes) {
  Out one, whole, first, second;
  const std::string common = "zero=1 precision=bf16 steps=8 every=4 ";
  ASSERT_TRUE(ranks(1, common + "accum=2 ckpt=c1", &one).ok());
  test::Result w = ranks(2, common + "ckpt=cw", &whole);
  ASSERT_TRUE(w.ok()) << w.output;
  ASSERT_EQ(whole.losses.size(), 8u) << w.output;
  expect_close(whole.losses, one.losses, 1e-3, "2 ranks vs 1, ZeRO 1 bf16");
  EXPECT_LT(whole.losses.back(), whole.losses.front());
  test::Result s1 = ranks(2, common + "ckpt=cs stop=4", &first);
  ASSERT_TRUE(s1.ok()) << s1.output;
  test::Result s2 = ranks(2, common + "ckpt=cs resume=1", &second);
  ASSERT_TRUE(s2.ok()) << s2.output;
  ASSERT_EQ(first.losses.size(), 4u);
  ASSERT_EQ(second.losses.size(), 4u) << s2.output;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(first.losses[i], whole.losses[i]) << "step " << i + 1;
    EXPECT_EQ(second.losses[i], whole.losses[4 + i]) << "step " << 5 + i;
  }
}

// Models that differ across ranks, or datasets of different sizes: an InputError on every
// rank naming the difference (not a hang, not a silent run). Tensor parallelism: refused.
TEST_F(UserTask, RanksThatDisagreeFailOnEveryRank) {
  test::Result m = ranks(2, "mismatch=1");
  ASSERT_FALSE(m.timed_out) << m.output;
  EXPECT_EQ(m.codes, (std::vector<int>{2, 2})) << m.output;
  for (const char* r : {"rank 0 error", "rank 1 error"}) EXPECT_NE(m.output.find(r), std::string::npos) << m.output;
  EXPECT_NE(m.output.find("the ranks hold different models; first difference at parameter #0: rank 0 has fc1.weight"),
            std::string::npos)
      << m.output;

  test::Result d = ranks(2, "n=256 n1=250");
  ASSERT_FALSE(d.timed_out) << d.output;
  EXPECT_EQ(d.codes, (std::vector<int>{2, 2})) << d.output;
  EXPECT_NE(d.output.find("the ranks' tasks differ: rank 0's training data has 256 examples (16 steps per epoch), "
                          "rank 1's has 250 (15)"),
            std::string::npos)
      << d.output;

  test::Result tp = ranks(2, "tp=2");
  EXPECT_EQ(tp.codes, (std::vector<int>{2, 2})) << tp.output;
  EXPECT_NE(tp.output.find("TrainConfig::tp = 2: tensor parallelism cuts a GPT's layers"), std::string::npos)
      << tp.output;
}

}  // namespace
