// train::verify() called as a library user calls it, in one process: a program's own task
// (the TinyMlp on the blobs of user_task_util.h) through a TaskFactory. With one rank the
// reduction and replica checks hold by construction; the single-process checks compare the
// run with its own grad_accum x dp reference and must agree to rounding.
#include <gtest/gtest.h>

#include <memory>
#include <sstream>

#include "paratrain/base/error.h"
#include "paratrain/train/verify.h"
#include "train/user_task_util.h"

using namespace paratrain;

namespace {

// Owns a BlobsRun (model, data and task together) and forwards to its task.
class OwnedBlobsTask final : public train::Task {
 public:
  nn::Module& module() override { return run_->task.module(); }
  void fill(const data::BatchRequest& r, Tensor& x, Tensor& y) override { run_->task.fill(r, x, y); }
  Tensor loss(const Tensor& x, const Tensor& y) override { return run_->task.loss(x, y); }
  std::string name() const override { return run_->task.name(); }
  void setup(const train::TaskLayout& l) override { run_->task.setup(l); }
  int64_t steps_per_epoch() const override { return run_->task.steps_per_epoch(); }
  int64_t num_examples() const override { return run_->task.num_examples(); }

 private:
  std::unique_ptr<test::BlobsRun> run_ = std::make_unique<test::BlobsRun>();
};

train::TaskFactory blobs() {
  return [](const train::TaskLayout&) { return std::make_unique<OwnedBlobsTask>(); };
}

TEST(VerifyLibrary, OwnTaskInOneProcessPasses) {
  train::TrainConfig cfg;
  cfg.steps = 3, cfg.micro_batch = 8, cfg.grad_accum = 2, cfg.optimizer = "sgd", cfg.lr = 0.1, cfg.threads = 1;
  std::ostringstream log;
  const train::VerifyReport r = train::verify(cfg, blobs(), log);
  EXPECT_TRUE(r.passed) << r.failure << "\n" << log.str();
  EXPECT_EQ(r.dp, 1);
  ASSERT_EQ(r.per_step.size(), 3u);
  ASSERT_EQ(r.tensors.size(), 4u);  // fc1/fc2 weight and bias
  EXPECT_TRUE(r.params_judged);     // SGD: judged with a tolerance
  for (const auto& t : r.tensors) {
    EXPECT_EQ(t.grad_abs, 0.0) << t.name;  // one rank: the applied gradient is its local one
    EXPECT_LE(t.global_rel, 1e-5) << t.name;
    EXPECT_LE(t.param_rel, 1e-4) << t.name;
  }
  EXPECT_NE(log.str().find("one data-parallel rank"), std::string::npos) << log.str();
  std::ostringstream table;
  train::print_verify_report(r, table);
  EXPECT_NE(table.str().find("verdict: PASS"), std::string::npos) << table.str();
  EXPECT_EQ(r.to_json()["tensors"].size(), 4u);
}

TEST(VerifyLibrary, RefusesWhatItCannotCheck) {
  train::TrainConfig cfg;
  cfg.steps = 1, cfg.micro_batch = 8;
  std::ostringstream log;
  cfg.zero = 3;
  EXPECT_THROW(train::verify(cfg, blobs(), log), InputError);
  cfg.zero = 0, cfg.save_final = "x.st";
  EXPECT_THROW(train::verify(cfg, blobs(), log), InputError);
}

}  // namespace
