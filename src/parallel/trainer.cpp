#include "paratrain/parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "paratrain/amp/mixed_precision.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/env.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/training_state.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/data/token_loader.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/monitor/progress.h"
#include "paratrain/nn/classifiers.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/fsdp.h"
#include "paratrain/parallel/zero.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/load_balancer.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/parallel/tensor_parallel/gpt_plan.h"
#include "paratrain/parallel/tensor_parallel/grad_norm.h"

namespace paratrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool is_gpt(const std::string& m) { return m == "gpt-nano" || m == "gpt-mini" || m == "gpt2-124m" || m == "gpt"; }

// One model + its data: the trainer asks it for micro-batch losses and evaluations.
class Task {
 public:
  virtual ~Task() = default;
  virtual nn::Module& module() = 0;
  virtual int64_t steps_per_epoch() const = 0;
  // Fills a training batch (called on the prefetcher's worker thread only).
  virtual void fill(const data::BatchRequest& r, Tensor& inputs, Tensor& targets) = 0;
  // The mean loss over a batch.
  virtual Tensor loss(const Tensor& inputs, const Tensor& targets) = 0;
  virtual int64_t items_per_micro_batch() const = 0;  // tokens (GPT) or samples
  virtual bool counts_tokens() const = 0;
  virtual double flops_per_item() const = 0;
  virtual bool has_eval() const = 0;
  // Fills "val_loss" or "accuracy" in `out` (on rank 0; every rank calls it, `pg` may be null).
  virtual void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out) = 0;
  virtual nn::Module& init_target() { return module(); }
  virtual checkpoint::Metadata metadata() const = 0;
  // The generator random layers draw from, or null when the model has none.
  virtual Generator* generator() { return nullptr; }
};

class GptTask final : public Task {
 public:
  Generator* generator() override { return &model_->generator(); }
  GptTask(const TrainConfig& c, int64_t micro_batch, int dp, int tp) {
    nn::GPTConfig g = nn::GPTConfig::preset(c.model);
    if (c.n_layer) g.n_layer = c.n_layer;
    if (c.n_head) g.n_head = c.n_head;
    if (c.n_embd) g.n_embd = c.n_embd;
    if (c.block_size) g.block_size = c.block_size;
    if (c.vocab_size) g.vocab_size = c.vocab_size;
    g.dropout = c.dropout;
    g.validate();
    check_tensor_parallel_layout(g, tp, c.sequence_parallel);
    if (c.data.empty()) PT_THROW(InputError, "--model ", c.model, " needs --data FILE.bin (token file)");
    data::BatchLayout layout{micro_batch, c.grad_accum, dp};
    train_ = std::make_unique<data::TokenLoader>(c.data, g.block_size, layout, c.seed);
    check_vocab(train_->file(), c.data, g.vocab_size);
    if (!c.val_data.empty()) {
      val_ = std::make_unique<data::TokenEvalLoader>(c.val_data, g.block_size, micro_batch);
      check_vocab(val_->file(), c.val_data, g.vocab_size);
      if (val_->num_batches() < dp)
        PT_THROW(InputError, "--val-data ", c.val_data, " is too short for one evaluation batch of ", micro_batch,
                 " x ", dp, " windows of ", g.block_size + 1, " tokens");
    }
    model_ = std::make_unique<nn::GPT>(g, c.seed);
    cfg_ = g;
    micro_batch_ = micro_batch;
  }
  nn::Module& module() override { return *model_; }
  nn::GPT& gpt() { return *model_; }
  int64_t steps_per_epoch() const override { return train_->steps_per_epoch(); }
  void fill(const data::BatchRequest& r, Tensor& x, Tensor& y) override {
    train_->fill_range(r.step, r.micro_step, r.first, r.count, x, y);
  }
  Tensor loss(const Tensor& x, const Tensor& y) override { return model_->loss(x, y); }
  int64_t items_per_micro_batch() const override { return micro_batch_ * cfg_.block_size; }
  bool counts_tokens() const override { return true; }
  double flops_per_item() const override { return cfg_.flops_per_token(); }
  bool has_eval() const override { return val_ != nullptr; }
  // Evaluation batch g holds the B x dp windows [g*B*dp, (g+1)*B*dp) of the validation
  // file; rank r computes its part (windows of local batch g*dp + r). The loss is the mean
  // over all of them, so it does not depend on how the same B x dp is laid out over ranks.
  void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out) override {
    autograd::NoGradGuard ng;
    model_->eval();
    const int dp = pg ? pg->size() : 1, r = pg ? pg->rank() : 0;
    const int64_t total = val_->num_batches() / dp;
    const int64_t n = std::min<int64_t>(total, max_batches > 0 ? max_batches : total);
    double sum = 0;
    Tensor x, y;
    for (int64_t g = 0; g < n; ++g) {
      val_->fill(g * dp + r, x, y);
      sum += model_->loss(x, y).item();
    }
    model_->train();
    if (pg) {
      const float mine = static_cast<float>(sum);
      std::vector<float> all(static_cast<size_t>(dp));
      pg->allgather(&mine, all.data(), 1, DType::F32)->wait();
      sum = 0;
      for (float v : all) sum += v;
    }
    out["val_loss"] = sum / static_cast<double>(n * dp);
  }
  checkpoint::Metadata metadata() const override {
    return {{"format", "paratrain-gpt"},
            {"n_layer", std::to_string(cfg_.n_layer)},
            {"n_head", std::to_string(cfg_.n_head)},
            {"n_embd", std::to_string(cfg_.n_embd)},
            {"block_size", std::to_string(cfg_.block_size)},
            {"vocab_size", std::to_string(cfg_.vocab_size)}};
  }

 private:
  static void check_vocab(const data::TokenFile& f, const std::string& path, int64_t vocab) {
    if (f.size() > 0 && f.max_token() >= vocab)
      PT_THROW(InputError, path, ": token id ", f.max_token(), " does not fit --vocab-size ", vocab);
  }
  nn::GPTConfig cfg_;
  int64_t micro_batch_ = 0;
  std::unique_ptr<data::TokenLoader> train_;
  std::unique_ptr<data::TokenEvalLoader> val_;
  std::unique_ptr<nn::GPT> model_;
};

class ImageTask final : public Task {
 public:
  ImageTask(const TrainConfig& c, int64_t micro_batch, int dp) : micro_batch_(micro_batch) {
    if (c.dataset != "fashion-mnist")
      PT_THROW(InputError, "--model ", c.model, " needs --dataset fashion-mnist",
               c.dataset.empty() ? "" : (" (got '" + c.dataset + "')"));
    const std::string dir = c.data_dir.empty() ? data::kFashionMnistDir : c.data_dir;
    auto train = data::load_fashion_mnist(data::Split::Train, dir);
    auto test = data::load_fashion_mnist(data::Split::Test, dir);
    train_ = std::make_unique<data::ImageLoader>(train, data::BatchLayout{micro_batch, c.grad_accum, dp}, c.seed);
    test_ = std::make_unique<data::ImageEvalLoader>(test, 500);
    if (c.model == "cnn")
      model_ = std::make_unique<nn::CNNClassifier>(c.seed);
    else
      model_ = std::make_unique<nn::MLPClassifier>(c.seed);
    cnn_ = c.model == "cnn";
  }
  nn::Module& module() override { return *model_; }
  int64_t steps_per_epoch() const override { return train_->steps_per_epoch(); }
  void fill(const data::BatchRequest& r, Tensor& x, Tensor& y) override {
    train_->fill_range(r.step, r.micro_step, r.first, r.count, x, y);
  }
  Tensor loss(const Tensor& x, const Tensor& y) override { return model_->loss(x, y); }
  int64_t items_per_micro_batch() const override { return micro_batch_; }
  bool counts_tokens() const override { return false; }
  double flops_per_item() const override {
    // forward MACs x 2 x 3 (forward + backward)
    double macs = cnn_ ? (28.0 * 28 * 32 * 9 + 14.0 * 14 * 64 * 32 * 9 + 3136.0 * 128 + 128.0 * 10)
                       : (784.0 * 256 + 256.0 * 256 + 256.0 * 10);
    return 6.0 * macs;
  }
  bool has_eval() const override { return true; }
  void evaluate(int64_t, comm::ProcessGroup* pg, nlohmann::json& out) override {
    if (pg && pg->rank() != 0) return;  // rank 0 evaluates the whole test set alone
    autograd::NoGradGuard ng;
    model_->eval();
    int64_t correct = 0, total = 0;
    Tensor x, y;
    for (int64_t b = 0; b < test_->num_batches(); ++b) {
      const int64_t n = test_->fill(b, x, y);
      auto logits = model_->forward(x).to_vector();
      const int32_t* labels = y.data<int32_t>();
      for (int64_t i = 0; i < n; ++i) {
        const float* row = logits.data() + i * 10;
        correct += (std::max_element(row, row + 10) - row) == labels[i];
      }
      total += n;
    }
    model_->train();
    out["accuracy"] = static_cast<double>(correct) / static_cast<double>(total);
  }
  checkpoint::Metadata metadata() const override { return {{"format", cnn_ ? "paratrain-cnn" : "paratrain-mlp"}}; }

 private:
  int64_t micro_batch_;
  bool cnn_ = false;
  std::unique_ptr<data::ImageLoader> train_;
  std::unique_ptr<data::ImageEvalLoader> test_;
  std::unique_ptr<nn::Classifier> model_;
};

int default_threads(const comm::JobEnv& job) {
  if (int64_t t = env::get_int("PARATRAIN_THREADS"); t > 0) return static_cast<int>(t);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t local = env::raw_int("LOCAL_WORLD_SIZE").value_or(env::raw_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1));
  local = std::max<int64_t>(local, job.local_world_size);
  return std::max(1, cores / static_cast<int>(std::max<int64_t>(local, 1)));
}

// PARATRAIN_SIMULATE_SLOWDOWN=R:F -> F on rank R (1 elsewhere): the rank idles (F-1) x its
// compute time after each micro-step, like a device F times slower.
double simulated_slowdown(int rank) {
  const std::string v = env::get_string("PARATRAIN_SIMULATE_SLOWDOWN");
  if (v.empty()) return 1.0;
  const auto colon = v.find(':');
  int r = -1;
  double f = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    r = std::stoi(v.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    f = std::stod(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    PT_THROW(InputError, "PARATRAIN_SIMULATE_SLOWDOWN='", v, "' is not RANK:FACTOR (e.g. 1:2.5)");
  }
  if (!(f >= 1.0)) PT_THROW(InputError, "PARATRAIN_SIMULATE_SLOWDOWN factor must be at least 1, got ", f);
  return r == rank ? f : 1.0;
}

// A stream that drops everything (ranks other than 0 print nothing).
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

void validate(const TrainConfig& c) {
  if (c.device != "cpu")
    PT_THROW(InputError, "--device ", c.device, " is not available: this build of paratrain has no CUDA support");
  if (c.grad_accum < 1) PT_THROW(InputError, "--grad-accum must be at least 1, got ", c.grad_accum);
  if (c.micro_batch < 0) PT_THROW(InputError, "--micro-batch must be positive, got ", c.micro_batch);
  if (c.steps < 0) PT_THROW(InputError, "--steps must not be negative, got ", c.steps);
  if (c.epochs < 0) PT_THROW(InputError, "--epochs must not be negative, got ", c.epochs);
  if (c.optimizer != "adamw" && c.optimizer != "sgd")
    PT_THROW(InputError, "unknown --optimizer '", c.optimizer, "' (expected adamw or sgd)");
  optim::LRSchedule::parse(c.lr_schedule);
  if (c.warmup_steps < 0) PT_THROW(InputError, "--warmup-steps must not be negative");
  if (c.grad_clip < 0) PT_THROW(InputError, "--grad-clip must not be negative (0 = off)");
  if (c.threads < 0) PT_THROW(InputError, "--threads must be positive (0 = automatic)");
  if (c.backend != "auto" && c.backend != "shm" && c.backend != "tcp" && c.backend != "mpi")
    PT_THROW(InputError, "unknown --backend '", c.backend, "' (expected auto, shm, tcp or mpi)");
  if (c.dp < 0 || c.tp < 0 || c.pp < 0)
    PT_THROW(InputError, "--dp ", c.dp, " --tp ", c.tp, " --pp ", c.pp, ": sizes must be positive (0 = derived)");
  if (!(c.bucket_mb > 0)) PT_THROW(InputError, "--bucket-mb must be positive, got ", c.bucket_mb);
  if (c.zero < 0 || c.zero > 3)
    PT_THROW(InputError, "--zero must be 0, 1, 2 or 3 (0 = off, 1 = shard the optimizer state, 2 = also the gradients, "
             "3 = also the parameters), got ", c.zero);
  compress_options(c.compress, c.powersgd_rank, c.powersgd_start_iter, c.seed, c.deterministic);  // InputError if bad
  amp::parse_precision(c.precision);  // InputError if bad
  if (!c.loss_scale.empty()) amp::LossScalerOptions::parse(c.loss_scale);
  if (c.loss_scale_growth_interval < 1)
    PT_THROW(InputError, "--loss-scale-growth-interval must be at least 1, got ", c.loss_scale_growth_interval);
  if (c.save_dtype != "f32" && c.save_dtype != "bf16")
    PT_THROW(InputError, "unknown --save-dtype '", c.save_dtype, "' (expected f32 or bf16)");
  if (c.balance != "none" && c.balance != "auto")
    PT_THROW(InputError, "unknown --balance '", c.balance, "' (expected none or auto)");
  if (c.balance == "auto" && c.deterministic)
    PT_THROW(InputError, "--balance auto cannot be combined with --deterministic (a bit-identical run needs the "
             "fixed even split of every micro-batch)");
  if (c.checkpoint_every < 0) PT_THROW(InputError, "--checkpoint-every must not be negative (0 = only after the last step)");
  if (c.checkpoint_dir.empty() && c.checkpoint_every > 0)
    PT_THROW(InputError, "--checkpoint-every needs --checkpoint-dir DIR");
  if (c.checkpoint_dir.empty() && c.resume) PT_THROW(InputError, "--resume needs --checkpoint-dir DIR");
  if (!is_gpt(c.model) && c.model != "mlp" && c.model != "cnn")
    PT_THROW(InputError, "unknown --model '", c.model, "' (expected gpt-nano, gpt-mini, gpt2-124m, gpt, mlp or cnn)");
  if (c.zero == 3 && !is_gpt(c.model))
    PT_THROW(InputError, "--zero 3 shards the GPT models block by block, not --model ", c.model, " (use --zero 1 or 2)");
  if (c.zero == 3 && c.compress == "powersgd")
    PT_THROW(InputError, "--compress powersgd cannot be combined with --zero 3 (PowerSGD compresses all-reduced "
             "matrices; with --zero 3, --compress bf16|fp16 gathers and reduce-scatters in 16 bits)");
  if (c.zero == 3 && c.compress != "none" && c.deterministic)
    PT_THROW(InputError, "--compress ", c.compress,
             " cannot be combined with --deterministic (compressed gradients are not bit-identical to one process)");
  if (c.zero3_prefetch < 0) PT_THROW(InputError, "--zero3-prefetch must not be negative, got ", c.zero3_prefetch);
  if (c.recompute != "none" && c.recompute != "full" && c.recompute != "selective")
    PT_THROW(InputError, "unknown --recompute '", c.recompute, "' (expected none, full or selective)");
  if (c.recompute == "selective")
    PT_THROW(InputError, "--recompute selective is not built yet (--recompute full recomputes every block)");
  if (c.recompute == "full" && !is_gpt(c.model))
    PT_THROW(InputError, "--recompute full recomputes the GPT models' blocks, not --model ", c.model);
}

// What a checkpoint records about the run: the data layout, and every setting that changes
// the arithmetic (a resume under different values would not continue the same run).
nlohmann::json run_config(const TrainConfig& c, int64_t micro_batch, const MeshShape& mesh, int64_t steps, double lr) {
  return {{"layout",
           {{"micro_batch", micro_batch},
            {"grad_accum", c.grad_accum},
            {"dp", mesh.dp},
            {"tp", mesh.tp},
            {"pp", mesh.pp},
            {"seed", c.seed},
            {"zero", c.zero}}},
          {"math",
           {{"model", c.model},         {"n_layer", c.n_layer},           {"n_head", c.n_head},
            {"n_embd", c.n_embd},       {"block_size", c.block_size},     {"vocab_size", c.vocab_size},
            {"dropout", c.dropout},     {"steps", steps},                 {"optimizer", c.optimizer},
            {"lr", lr},                 {"beta1", c.beta1},               {"beta2", c.beta2},
            {"eps", c.eps},             {"momentum", c.momentum},         {"weight_decay", c.weight_decay},
            {"lr_schedule", c.lr_schedule}, {"warmup_steps", c.warmup_steps}, {"min_lr", c.min_lr},
            {"grad_clip", c.grad_clip}, {"seed", c.seed},
            {"precision", amp::precision_name(amp::parse_precision(c.precision))},
            {"loss_scale", !c.loss_scale.empty()                                                ? c.loss_scale
                           : amp::default_loss_scale(amp::parse_precision(c.precision)).enabled ? "dynamic"
                                                                                                : "none"},
            {"loss_scale_growth_interval", c.loss_scale_growth_interval}}}};
}

// InputError unless `saved` (from the checkpoint) describes the same run as `now`: every
// "math" setting equal, and the same global batch (micro_batch x grad_accum x dp) and seed.
void check_resume_config(const std::string& ckpt, const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.contains("math") || !saved.contains("layout"))
    PT_THROW(InputError, "checkpoint ", ckpt, " does not record the run's configuration; cannot resume from it");
  // Settings added after checkpoints already existed: a checkpoint without them was saved
  // with their defaults.
  static const nlohmann::json kLaterDefaults = {
      {"precision", "fp32"}, {"loss_scale", "none"}, {"loss_scale_growth_interval", 2000}};
  for (const auto& [key, value] : now["math"].items()) {
    const nlohmann::json* was = saved["math"].contains(key) ? &saved["math"][key]
                                : kLaterDefaults.contains(key) ? &kLaterDefaults[key]
                                                               : nullptr;
    if (!was || *was != value)
      PT_THROW(InputError, "cannot resume from ", ckpt, ": it was saved with ", key, " = ",
               was ? was->dump() : std::string("(none)"), ", this run has ", key, " = ", value.dump(),
               " (resume with the same settings)");
  }
  const auto& a = saved["layout"];
  const auto& b = now["layout"];
  const int64_t ga = a.value("micro_batch", int64_t(0)) * a.value("grad_accum", int64_t(0)) * a.value("dp", int64_t(0));
  const int64_t gb = b["micro_batch"].get<int64_t>() * b["grad_accum"].get<int64_t>() * b["dp"].get<int64_t>();
  if (ga != gb)
    PT_THROW(InputError, "cannot resume from ", ckpt, ": its global batch is ", a.value("micro_batch", 0), " x ",
             a.value("grad_accum", 0), " x ", a.value("dp", 0), " = ", ga, " (micro-batch x grad-accum x ranks), this run's is ",
             b["micro_batch"].get<int64_t>(), " x ", b["grad_accum"].get<int64_t>(), " x ", b["dp"].get<int64_t>(), " = ", gb,
             "; choose --micro-batch/--grad-accum so that the global batch is the same");
}

// The one warning line about the incomplete checkpoints (killed saves) a resume passes over.
std::string ignored_checkpoints_warning(const checkpoint::ResumePoint& p) {
  std::string names;
  for (const auto& d : p.ignored) names += (names.empty() ? "" : ", ") + d;
  return "warning: ignoring incomplete checkpoint" + std::string(p.ignored.size() > 1 ? "s " : " ") + names +
         " (no manifest.json: a save was interrupted)" +
         (p.checkpoint ? "" : "; no complete checkpoint, starting from step 0");
}

// Each rank finds its resume point on its own; the answer is a function of the files
// (checkpoint::find_resume_point), so the ranks agree unless the directory changed while
// they read it. Checked before any step runs: ranks at different steps would fail later in
// a collective, or train on wrong weights. Error naming the ranks otherwise.
void check_ranks_start_at_the_same_step(comm::ProcessGroup& pg, int64_t start_step, const std::string& dir) {
  std::vector<int64_t> all(static_cast<size_t>(pg.size()));
  pg.allgather(&start_step, all.data(), 1, DType::I64)->wait();
  for (int r = 1; r < pg.size(); ++r)
    if (all[r] != all[0])
      PT_THROW(Error, "rank ", pg.rank(), ": the ranks disagree on where to resume: rank 0 starts at step ", all[0],
               ", rank ", r, " at step ", all[r], " (each rank reads ", dir,
               " on its own; did it change while the job started?)");
}

// A test hook's value RANK:STEP from variable `var` (unset: nullopt). InputError when it is
// malformed or STEP is below `min_step`.
std::optional<std::pair<int64_t, int64_t>> rank_and_step(const char* var, int64_t min_step) {
  const std::string v = env::get_string(var);
  if (v.empty()) return std::nullopt;
  const auto colon = v.find(':');
  int64_t r = -1, n = -1;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    r = std::stoll(v.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    n = std::stoll(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    PT_THROW(InputError, var, "='", v, "' is not RANK:STEP (e.g. 0:2)");
  }
  if (r < 0 || n < min_step) PT_THROW(InputError, var, "='", v, "': RANK must be >= 0 and STEP >= ", min_step);
  return std::make_pair(r, n);
}

// PARATRAIN_TEST_KILL_IN_SAVE=R:N, a test hook: the step N whose save rank R dies in (it
// SIGKILLs itself once its files of step_N are written, before the manifest), or -1 on
// other ranks, when unset, and in a group restarted by the launcher (restart_count > 0), so
// that the restarted run gets past it.
int64_t test_kill_in_save_step(int rank, int64_t restart_count) {
  const auto rs = rank_and_step("PARATRAIN_TEST_KILL_IN_SAVE", 1);
  return rs && rs->first == rank && restart_count == 0 ? rs->second : -1;
}

// PARATRAIN_TEST_INJECT_INF=R:N, a test hook: rank R puts an inf into its gradient after the
// reduction of step N (0-based), so that the loss scaler must skip that step on every rank;
// -1 on other ranks and when unset.
int64_t test_inject_inf_step(int rank) {
  const auto rs = rank_and_step("PARATRAIN_TEST_INJECT_INF", 0);
  return rs && rs->first == rank ? rs->second : -1;
}

void inject_inf(const optim::NamedParams& params, int rank, int64_t step) {
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0 || g.dtype() != DType::F32) continue;
    g.data<float>()[0] = std::numeric_limits<float>::infinity();
    std::cerr << "rank " << rank << ": PARATRAIN_TEST_INJECT_INF: inf in the gradient of " << name << " at step "
              << step << "\n";
    return;
  }
}

std::vector<Tensor> grads_of(const optim::NamedParams& params) {
  std::vector<Tensor> g;
  g.reserve(params.size());
  for (const auto& [name, p] : params) g.push_back(p.grad());
  return g;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, std::ostream& log_out) {
  validate(cfg);
  const comm::JobEnv job = comm::read_job_env();
  const int world = job.world_size;
  const int rank = job.rank;
  // ---- the device mesh: dp x tp x pp = world, checked before anything else ----
  const MeshShape shape = resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, world);
  if (shape.pp > 1)
    PT_THROW(InputError, "--pp ", shape.pp, ": pipeline parallelism is not built yet; lay the ", world,
             " ranks out with --dp and --tp");
  if (shape.tp > 1 && !is_gpt(cfg.model))
    PT_THROW(InputError, "--tp ", shape.tp, ": tensor parallelism is built for the GPT models, not --model ", cfg.model);
  if (cfg.sequence_parallel && shape.tp == 1) PT_THROW(InputError, "--sequence-parallel needs --tp 2 or more");
  if (shape.tp > 1 && cfg.balance == "auto")
    PT_THROW(InputError, "--balance auto cannot be combined with --tp ", shape.tp,
             " (the ranks of a tensor-parallel group share every micro-batch)");
  const int dp = shape.dp;
  const int dp_rank = mesh_coord(rank, shape).dp;
  kernels::cpu::set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads(job));
  const bool gpt = is_gpt(cfg.model);
  const int64_t micro_batch = cfg.micro_batch > 0 ? cfg.micro_batch : (gpt ? 8 : 64);
  NullBuffer null_buf;
  std::ostream null_log(&null_buf);
  std::ostream& log = rank == 0 ? log_out : null_log;

  // ---- everything that can be wrong with the input is checked before any file is written ----
  std::unique_ptr<Task> task;
  if (gpt)
    task = std::make_unique<GptTask>(cfg, micro_batch, dp, shape.tp);
  else
    task = std::make_unique<ImageTask>(cfg, micro_batch, dp);
  nn::Module& model = task->module();
  const int64_t steps = cfg.steps > 0 ? cfg.steps
                                      : std::max<int64_t>(1, static_cast<int64_t>(std::llround(
                                                                 (cfg.epochs > 0 ? cfg.epochs : 1.0) *
                                                                 static_cast<double>(task->steps_per_epoch()))));
  const double lr = cfg.lr >= 0 ? cfg.lr : (cfg.optimizer == "sgd" ? 0.05 : (gpt ? 6e-4 : 1e-3));
  optim::LRSchedule sched;
  sched.kind = optim::LRSchedule::parse(cfg.lr_schedule);
  sched.lr = lr;
  sched.min_lr = cfg.min_lr >= 0 ? cfg.min_lr : lr / 10;
  sched.warmup = cfg.warmup_steps;
  sched.total = steps;

  // ---- resume: the whole checkpoint is verified and read before anything is applied ----
  const nlohmann::json this_run = run_config(cfg, micro_batch, shape, steps, lr);
  std::optional<checkpoint::TrainingState> resumed;
  // A group restarted by `paratrain launch --max-restarts` (TORCHELASTIC_RESTART_COUNT > 0)
  // resumes from its checkpoints without being told (issue: launcher restarts).
  const int64_t restart_count = env::raw_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  const bool looked_for_checkpoint = cfg.resume || (restart_count > 0 && !cfg.checkpoint_dir.empty());
  const int64_t kill_in_save = test_kill_in_save_step(rank, restart_count);
  if (looked_for_checkpoint) {
    if (!cfg.resume) log << "restart " << restart_count << " of the group: resuming from " << cfg.checkpoint_dir << "\n";
    const checkpoint::ResumePoint point = checkpoint::find_resume_point(cfg.checkpoint_dir);
    if (!point.ignored.empty()) log << ignored_checkpoints_warning(point) << "\n";
    if (const auto& ckpt = point.checkpoint) {
      resumed = checkpoint::load_training_state(*ckpt);
      check_resume_config(*ckpt, resumed->config, this_run);
      if (resumed->step > steps)
        PT_THROW(InputError, "cannot resume from ", *ckpt, ": it is at step ", resumed->step, ", beyond --steps ", steps);
      log << "resuming from " << *ckpt << " (step " << resumed->step << " of " << steps << ")";
      if (resumed->world_size != world) log << ", saved by " << resumed->world_size << " ranks, now " << world;
      if (!resumed->optimizer_shards.empty())
        log << ", optimizer state from " << resumed->optimizer_shards.size() << " shard(s)"
            << (cfg.zero > 0 ? (resumed->optimizer_shards.size() != static_cast<size_t>(world) ? ", re-cut" : "")
                             : ", assembled");
      log << "\n";
    } else if (point.ignored.empty()) {
      log << "no checkpoint in " << cfg.checkpoint_dir << ": starting from step 0\n";
    }
  }
  if (resumed)
    model.load_state_dict(resumed->model, true);
  else if (!cfg.init_from.empty())
    model.load_state_dict(checkpoint::load_safetensors(cfg.init_from), true, "transformer.");
  const int64_t start_step = resumed ? resumed->step : 0;

  // ---- the mesh's groups; tensor parallelism cuts the (whole, initialised or loaded) model,
  // then DDP runs over the data-parallel group ----
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  if (world > 1) {
    comm::ProcessGroupOptions po;
    po.backend = cfg.backend;
    po.deterministic = cfg.deterministic;
    pg = comm::create_process_group_from_env(po);
    if (looked_for_checkpoint) check_ranks_start_at_the_same_step(*pg, start_step, cfg.checkpoint_dir);
  }
  const DeviceMesh mesh(pg, shape);
  const TensorParallelPlan plan =
      gpt ? parallelize_gpt(static_cast<GptTask&>(*task).gpt(), mesh.tp(), {cfg.sequence_parallel}) : TensorParallelPlan();
  // --recompute full: the blocks' innermost wrapper (ZeRO 3's gathers go around it).
  if (cfg.recompute == "full") nn::recompute_blocks(static_cast<GptTask&>(*task).gpt());
  std::unique_ptr<DistributedDataParallel> ddp;
  std::unique_ptr<FullyShardedDataParallel> fsdp;  // --zero 3: the parameters sharded too, block by block
  if (cfg.zero == 3) {
    FsdpOptions o;
    o.deterministic = cfg.deterministic;
    o.reshard_after_forward = cfg.zero3_reshard_after_forward;
    o.prefetch = cfg.zero3_prefetch;
    if (cfg.compress == "bf16" || cfg.compress == "fp16") o.comm_dtype = cfg.compress == "bf16" ? DType::BF16 : DType::F16;
    std::vector<nn::Module*> units;
    for (auto& block : static_cast<GptTask&>(*task).gpt().h) units.push_back(block.get());
    fsdp = std::make_unique<FullyShardedDataParallel>(model, units, mesh.dp(), o);  // dp rank 0's weights
  } else if (mesh.dp() || cfg.deterministic || cfg.zero > 0) {
    DdpOptions o;
    o.deterministic = cfg.deterministic;
    o.zero_stage = cfg.zero;  // ZeRO: gradients reduce-scattered into per-rank shards
    o.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * (1 << 20));
    o.first_bucket_bytes = std::min<size_t>(o.bucket_bytes, size_t(1) << 20);
    o.compress = compress_options(cfg.compress, cfg.powersgd_rank, cfg.powersgd_start_iter, cfg.seed);
    ddp = std::make_unique<DistributedDataParallel>(model, mesh.dp(), o);  // broadcasts dp rank 0's weights
  }

  auto params = model.named_parameters();
  GradientShards* shards = fsdp ? static_cast<GradientShards*>(fsdp.get()) : cfg.zero > 0 ? ddp.get() : nullptr;
  // ZeRO (--zero 1|2|3): the optimizer holds state for, and updates, this rank's pieces only.
  const optim::NamedParams opt_params = shards ? zero_pieces(*shards) : params;
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.optimizer == "adamw") {
    optim::AdamWOptions o;
    o.lr = lr, o.beta1 = cfg.beta1, o.beta2 = cfg.beta2, o.eps = cfg.eps, o.weight_decay = cfg.weight_decay;
    opt = std::make_unique<optim::AdamW>(opt_params, o);
  } else {
    optim::SGDOptions o;
    o.lr = lr, o.momentum = cfg.momentum, o.weight_decay = cfg.weight_decay;
    opt = std::make_unique<optim::SGD>(opt_params, o);
  }
  std::unique_ptr<ZeroOptimizer> zero;
  if (shards) zero = std::make_unique<ZeroOptimizer>(*shards, *opt);
  // Mixed precision (docs/amp.md): the forward under autocast with the parameters' half
  // copies made once per step; the loss scaler's skip decision is agreed by every rank.
  const DType compute_dtype = amp::parse_precision(cfg.precision);
  amp::LossScalerOptions scaler_options = cfg.loss_scale.empty() ? amp::default_loss_scale(compute_dtype)
                                                                  : amp::LossScalerOptions::parse(cfg.loss_scale);
  scaler_options.growth_interval = cfg.loss_scale_growth_interval;
  amp::MixedPrecision mp(compute_dtype, scaler_options);
  // ZeRO 3 keeps no copy of the whole model across steps: each forward casts what it uses.
  autograd::WeightCastCache* const half_copies = fsdp ? nullptr : mp.half_copies();
  const int64_t inject_inf_step = test_inject_inf_step(rank);
  // Per rank, gathered after the first step (constant from then on): optimizer state bytes
  // and the gradient buffers held between steps.
  std::vector<int64_t> mem_optimizer_per_rank, mem_grad_per_rank, mem_param_per_rank;
  if (resumed) {
    // The checkpoint holds the whole state (any layout saved it); this rank's tensor-parallel
    // part of it, then (ZeRO) its pieces of that.
    const auto optimizer_state = plan.cut_local(resumed->optimizer);
    if (zero)
      zero->load_state(optimizer_state, resumed->optimizer_steps);  // this rank's pieces, re-cut
    else
      opt->load_state_dict(optimizer_state, resumed->optimizer_steps);
    if (Generator* gen = task->generator(); gen && resumed->rng) gen->set_state(*resumed->rng);
    if (mp.scaler().enabled()) mp.scaler().load_state(resumed->loss_scale, resumed->loss_scale_growth_tracker);
    resumed->model.clear();
    resumed->optimizer.clear();
  }
  // PARATRAIN_TEST_KILL_IN_SAVE: this rank dies in the save of step kill_in_save, after its
  // files and before the manifest, leaving an incomplete checkpoint (test hook).
  auto die_if_told = [&](int64_t done) {
    if (done != kill_in_save) return;
    std::cerr << "rank " << rank << ": PARATRAIN_TEST_KILL_IN_SAVE: killing this rank while it saves "
              << checkpoint::checkpoint_name(done) << " (before the manifest)" << std::endl;
    std::raise(SIGKILL);
  };
  // The state every checkpoint records besides the tensors.
  auto run_state = [&](int64_t done) {
    checkpoint::TrainingState st;
    st.step = done;
    st.model_metadata = task->metadata();
    st.zero_stage = cfg.zero;
    st.optimizer_steps = opt->steps_taken();
    st.loss_scale = mp.scaler().scale();
    st.loss_scale_growth_tracker = mp.scaler().growth_tracker();
    if (Generator* gen = task->generator()) st.rng = gen->state();
    st.world_size = world;
    st.config = this_run;
    return st;
  };
  // Unsharded state (no ZeRO, no tensor parallelism): rank 0 writes everything. Sharded: rank 0
  // prepares the directory; the dp-rank-0 rank of each tp index writes its part of the model
  // (with its optimizer state unless ZeRO shards it); with ZeRO every rank writes its pieces;
  // rank 0 gathers their sizes and CRCs and writes the rest and the manifest last
  // (training_state.h). A later load gets the whole state, for any layout.
  // ZeRO 3: no rank holds the whole model (or its tensor-parallel part), so every rank's
  // shard carries its pieces of the parameters too.
  auto save_checkpoint = [&](int64_t done) {
    const bool parted = plan.size() > 1 && !fsdp;
    if (!zero && !parted) {
      if (rank != 0) return die_if_told(done);  // it writes no file of the checkpoint
      checkpoint::TrainingState st = run_state(done);
      st.model = model.state_dict();
      st.optimizer = opt->state_dict();
      checkpoint::save_training_state(cfg.checkpoint_dir, st, 2, [&] { die_if_told(done); });
      return;
    }
    int32_t go = rank == 0 ? static_cast<int32_t>(checkpoint::prepare_checkpoint(cfg.checkpoint_dir, done)) : 0;
    if (pg) pg->broadcast(&go, 1, DType::I32, 0)->wait();
    if (!go) return;  // this step's checkpoint is already complete
    const MeshCoord me = mesh.coord();
    const auto crc_bits = [](const checkpoint::ShardFileInfo& f) {
      return static_cast<int64_t>(std::stoul(f.crc32, nullptr, 16));
    };
    int64_t info[4] = {0, 0, 0, 0};  // part bytes, part CRC, shard bytes, shard CRC
    if (parted && me.dp == 0) {
      const auto part = checkpoint::write_model_part(cfg.checkpoint_dir, done, me.tp, shape.tp, model.state_dict(),
                                                     zero ? std::map<std::string, Tensor>{} : opt->state_dict(),
                                                     plan.cuts(), opt->steps_taken());
      info[0] = static_cast<int64_t>(part.bytes), info[1] = crc_bits(part);
    }
    if (zero) {
      checkpoint::OptimizerShard shard = zero->shard_state();
      if (fsdp) shard.params = fsdp->parameter_pieces();
      const auto mine = checkpoint::write_optimizer_shard(cfg.checkpoint_dir, done, rank, world, shard,
                                                          opt->steps_taken(), me.tp, shape.tp);
      info[2] = static_cast<int64_t>(mine.bytes), info[3] = crc_bits(mine);
    }
    if (rank != 0) die_if_told(done);  // its files written; rank 0 never gets their CRCs: no manifest
    std::vector<int64_t> all(info, info + 4);
    if (pg) {
      all.resize(4 * static_cast<size_t>(world));
      pg->allgather(info, all.data(), 4, DType::I64)->wait();
    }
    if (rank != 0) return;
    const auto file = [&all](std::string name, int r, int at) {
      char crc[9];
      std::snprintf(crc, sizeof crc, "%08lx", static_cast<unsigned long>(all[4 * r + at + 1]));
      return checkpoint::ShardFileInfo{std::move(name), static_cast<uint64_t>(all[4 * r + at]), crc};
    };
    checkpoint::TrainingState st = run_state(done);
    if (parted || (fsdp && shape.tp > 1)) {
      st.tp_size = shape.tp;
      st.cuts = plan.cuts();
    }
    if (parted)
      st.model_parts.resize(static_cast<size_t>(shape.tp));
    else if (fsdp)
      st.model_in_shards = true;
    else
      st.model = model.state_dict();
    for (int r = 0; r < world; ++r) {
      const MeshCoord c = mesh_coord(r, shape);
      if (parted && c.dp == 0) st.model_parts[c.tp] = file(checkpoint::model_part_file_name(c.tp, shape.tp), r, 0);
      if (zero) st.optimizer_shards.push_back(file(checkpoint::optimizer_shard_file_name(r, world), r, 2));
    }
    checkpoint::save_training_state(cfg.checkpoint_dir, st, 2, [&] { die_if_told(done); });
  };
  monitor::MetricsWriter metrics(rank == 0 ? cfg.metrics : std::string());

  // Items (tokens or images) of one optimizer step over all ranks.
  const int64_t items_per_step = task->items_per_micro_batch() * cfg.grad_accum * dp;
  log << "paratrain train: " << cfg.model << ", " << model.num_parameters() << " parameters"
      << (plan.size() > 1 ? " on this rank" : "") << ", " << steps << " steps, global batch " << micro_batch << " x "
      << cfg.grad_accum << " x " << dp << " = " << micro_batch * cfg.grad_accum * dp << (gpt ? " sequences" : " images")
      << ", " << kernels::cpu::num_threads() << " threads" << (world > 1 ? " per rank" : "");
  if (pg)
    log << ", " << world << " ranks (" << pg->backend_name() << (cfg.deterministic ? ", deterministic" : "") << ")"
        << ", layout " << shape.str() << (cfg.sequence_parallel ? ", sequence parallel" : "");
  if (cfg.recompute != "none") log << ", recompute " << cfg.recompute;
  log << "\n";
  if (zero) {
    const ZeroMemory zm = zero->memory();
    const auto mib = [](int64_t b) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1 << 20);
      return o.str();
    };
    if (fsdp) {
      const FsdpMemory fm = fsdp->memory();
      log << "zero 3: per rank, parameters " << mib(fm.parameter_shard_bytes) << " MiB (unsharded "
          << mib(fm.parameter_bytes) << " MiB), gradient shard " << mib(fm.gradient_shard_bytes) << " MiB, optimizer state "
          << mib(zm.optimizer_bytes) << " MiB (unsharded " << mib(zm.optimizer_unsharded_bytes) << " MiB); "
          << fsdp->num_units() << " units gathered one at a time (largest " << mib(fm.largest_unit_bytes) << " MiB)"
          << (cfg.zero3_reshard_after_forward ? "" : ", kept from forward to backward") << "\n";
    } else
    log << "zero " << cfg.zero << ": per rank, optimizer state " << mib(zm.optimizer_bytes) << " MiB (unsharded "
        << mib(zm.optimizer_unsharded_bytes) << " MiB), gradient shard " << mib(zm.gradient_shard_bytes) << " MiB"
        << (cfg.zero == 2 ? "; the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB) are held only from zero_grad to the reduce-scatter"
                          : " next to the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB)")
        << "\n";
  }
  if (cfg.compress != "none")
    log << (!mesh.dp() ? "--compress " + cfg.compress + ": one data-parallel rank, nothing to send"
            : fsdp     ? "--compress " + cfg.compress + " with --zero 3: parameters all-gathered and gradients "
                         "reduce-scattered in " + cfg.compress + " (half the bytes; shards and optimizer stay f32)"
                       : compress_summary(model, ddp->options().compress))
        << "\n";

  // Every rank measures its hardware peak when rank 0 does, so their timings stay comparable.
  const double peak_flops = !cfg.metrics.empty() ? monitor::hardware_peak_flops() : 0.0;
  Allocator& alloc = allocator_for(Device::CPU);
  alloc.reset_peak();
  TrainResult result;
  result.steps = steps;
  const auto t_start = Clock::now();
  double timed_seconds = 0;
  int64_t timed_items = 0;
  const float inv_accum = 1.0f / static_cast<float>(cfg.grad_accum);
  const float base_seed = fsdp ? fsdp->backward_seed(cfg.grad_accum) : ddp ? ddp->backward_seed(cfg.grad_accum) : inv_accum;
  Tensor accum_seed = Tensor::full({}, base_seed);
  constexpr int kGathered = 4;  // per rank: weighted loss, step ms, compute ms, data-wait ms
  std::vector<float> gathered_f(kGathered * static_cast<size_t>(world));

  // Micro-batch sizes per rank (even unless --balance auto moves items to faster ranks), and
  // the background loader that prepares the next step's batches during this one.
  LoadBalancer balancer(dp, micro_batch, cfg.balance == "auto");
  if (cfg.balance == "auto" && world == 1) log << "--balance auto: one rank, nothing to balance\n";
  const double slowdown = simulated_slowdown(rank);
  double last_micro_s = 0;  // compute time of the last micro-step (for the simulated slowdown)
  if (slowdown > 1.0)
    std::cerr << "rank " << rank << ": PARATRAIN_SIMULATE_SLOWDOWN makes this rank " << slowdown << "x slower\n";
  data::BatchPrefetcher prefetcher(
      [&task](const data::BatchRequest& r, Tensor& x, Tensor& y) { task->fill(r, x, y); });
  auto request = [&](int64_t s, int64_t k) {
    return data::BatchRequest{s, k, balancer.first(dp_rank, s), balancer.count(dp_rank, s)};
  };
  auto announce = [&](int64_t s) {
    if (s < steps)
      for (int64_t k = 0; k < cfg.grad_accum; ++k) prefetcher.enqueue(request(s, k));
  };
  announce(start_step);
  std::vector<int64_t> gathered_peak(static_cast<size_t>(world));

  monitor::ProgressLine progress(log, steps, &log == &std::cerr && monitor::stderr_is_terminal());
  auto run_eval = [&](int64_t step) {
    if (!task->has_eval()) return;
    nlohmann::json e = {{"step", step}, {"eval", true}};
    {
      autograd::AutocastGuard autocast(compute_dtype, half_copies);
      // Collective (GPT): every rank takes part; the dp ranks share the batches, tp ranks compute
      // one replica together.
      task->evaluate(cfg.eval_batches, gpt ? mesh.dp().get() : pg.get(), e);
    }
    if (rank != 0) return;
    if (e.contains("val_loss")) result.val_loss = e["val_loss"];
    if (e.contains("accuracy")) result.accuracy = e["accuracy"];
    metrics.write(e);
    progress.finish();
    log << "eval step " << step << ": "
        << (e.contains("val_loss") ? "val_loss " + std::to_string(result.val_loss)
                                   : "accuracy " + std::to_string(result.accuracy))
        << "\n";
  };

  for (int64_t step = start_step; step < steps; ++step) {
    const auto t0 = Clock::now();
    const long faults_before = monitor::minor_page_faults();
    const double step_lr = sched.at(step);
    if (plan.size() > 1) plan.group()->take_stats();  // this step's tensor-parallel traffic from here
    opt->set_lr(step_lr);
    if (fsdp)
      fsdp->zero_grad();
    else if (ddp)
      ddp->zero_grad();
    else
      model.zero_grad();
    double loss_sum = 0;
    int64_t activation_bytes = 0;  // the most a forward left allocated for its backward (rank 0's)
    const double weight = balancer.weight(dp_rank, step);  // 1 unless --balance gave this rank more or less
    const double loss_scale = mp.scaler().scale();  // the scale this step's gradients carry
    accum_seed.data<float>()[0] = static_cast<float>(base_seed * weight * loss_scale);
    for (int64_t k = 0; k < cfg.grad_accum; ++k) {
      std::optional<NoSyncScope> no_sync;
      if (ddp && k + 1 < cfg.grad_accum) no_sync.emplace(ddp->no_sync());
      if (fsdp && k + 1 < cfg.grad_accum) no_sync.emplace(fsdp->no_sync());
      if (k == 0) announce(step + 1);
      const auto t_micro = Clock::now();
      const data::Batch& batch = prefetcher.next(request(step, k));
      Tensor loss;
      const int64_t in_use_before_forward = alloc.stats().bytes_in_use;
      {
        autograd::AutocastGuard autocast(compute_dtype, half_copies);
        loss = task->loss(batch.inputs, batch.targets);
      }
      // What the forward left allocated: the activations saved for backward (on the very first
      // step also the parameters' half copies, made then and kept).
      activation_bytes = std::max(activation_bytes, alloc.stats().bytes_in_use - in_use_before_forward);
      loss_sum += loss.item();
      const double forward_s = seconds_since(t_micro);
      // A simulated slow device is slow before its gradients exist: idle (F-1) x the last
      // micro-step's compute time (3 x this forward's at the very first) before backward.
      if (slowdown > 1.0)
        std::this_thread::sleep_for(
            std::chrono::duration<double>((slowdown - 1.0) * (last_micro_s > 0 ? last_micro_s : 3.0 * forward_s)));
      const auto t_backward = Clock::now();
      autograd::backward(loss, accum_seed);
      last_micro_s = forward_s + seconds_since(t_backward);
    }
    const double compute_s = seconds_since(t0);  // everything but waiting for the last buckets
    const double data_wait_s = prefetcher.take_wait_seconds();
    if (ddp) ddp->finish();  // .grad = mean over every micro-batch of every rank
    if (fsdp) fsdp->finish();  // this rank's shard of that mean
    if (step == inject_inf_step) inject_inf(opt_params, rank, step);
    // Loss scaling: the gradients are unscaled before clipping; a step with an inf/NaN on any
    // rank is skipped by all (the flag is reduced over the ranks that hold the gradients).
    const bool skipped = mp.scaler().enabled() && !mp.scaler().unscale_and_check(grads_of(opt_params), pg.get());
    double norm = std::numeric_limits<double>::quiet_NaN();
    if (skipped) {
      progress.finish();
      log << "step " << step + 1 << ": gradients hold inf/NaN at loss scale " << loss_scale << ": step skipped\n";
    } else {
      // The global norm: over the mesh with tensor parallelism (tp shards summed, replicated
      // parameters once); over every rank's shard of the averaged gradient with ZeRO; else
      // the gradients are already averaged.
      norm = plan.size() > 1 ? mesh_grad_norm(zero ? opt_params : params,
                                              [&plan](const std::string& n) { return plan.sharded(n); }, mesh,
                                              zero != nullptr)
             : zero          ? zero->grad_norm()
                             : optim::grad_norm(params);
      if (zero) {
        zero->clip_grad_norm(cfg.grad_clip, norm);
        zero->step();  // this rank's pieces, then the parameters are all-gathered
      } else {
        optim::clip_grad_norm(params, cfg.grad_clip, norm);
        opt->step();
      }
    }
    const TpCommStats tp_stats = plan.size() > 1 ? plan.group()->take_stats() : TpCommStats{};
    if (!skipped) mp.parameters_changed();  // the half copies are refreshed at the next forward
    mp.scaler().update();
    if (step == start_step) {  // memory per rank, as it stays between steps
      int64_t mine[3] = {0, 0, 0};  // optimizer state, gradients, parameters
      for (const auto& [key, t] : opt->state_dict()) mine[0] += static_cast<int64_t>(t.nbytes());
      if (fsdp)
        mine[1] = fsdp->gradient_bytes(), mine[2] = fsdp->memory().parameter_shard_bytes;
      else if (ddp)
        mine[1] = ddp->gradient_bytes();
      if (!fsdp)
        for (const auto& [name, p] : params) {
          mine[2] += static_cast<int64_t>(p.nbytes());
          if (!ddp) mine[1] += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
        }
      std::vector<int64_t> all(mine, mine + 3);
      if (pg) {
        all.resize(3 * static_cast<size_t>(world));
        pg->allgather(mine, all.data(), 3, DType::I64)->wait();
      }
      for (int r = 0; r < world; ++r) {
        mem_optimizer_per_rank.push_back(all[3 * r]);
        mem_grad_per_rank.push_back(all[3 * r + 1]);
        mem_param_per_rank.push_back(all[3 * r + 2]);
      }
    }
    double step_s = seconds_since(t0);
    double loss = loss_sum / static_cast<double>(cfg.grad_accum);
    std::vector<double> step_ms_per_rank = {step_s * 1e3};
    std::vector<int64_t> peak_per_rank = {alloc.stats().peak_bytes_in_use};
    std::vector<int64_t> micro_batch_per_rank = balancer.sizes_at(step);
    std::vector<double> compute_ms_per_rank = {compute_s * 1e3};
    if (pg) {
      // The reported loss is the mean over the global batch (each rank's mean weighted by its
      // share); step times, compute times and peaks are gathered per rank.
      const float mine[kGathered] = {static_cast<float>(loss * weight), static_cast<float>(step_s * 1e3),
                                     static_cast<float>(compute_s * 1e3), static_cast<float>(data_wait_s * 1e3)};
      auto w1 = pg->allgather(mine, gathered_f.data(), kGathered, DType::F32);
      auto w2 = pg->allgather(&peak_per_rank[0], gathered_peak.data(), 1, DType::I64);
      w1->wait();
      w2->wait();
      double sum = 0;
      step_ms_per_rank.clear();
      compute_ms_per_rank.clear();
      for (int r = 0; r < world; ++r) {
        sum += gathered_f[kGathered * r];
        step_ms_per_rank.push_back(gathered_f[kGathered * r + 1]);
        compute_ms_per_rank.push_back(gathered_f[kGathered * r + 2]);
      }
      loss = sum / world;
      peak_per_rank = gathered_peak;
      // The first two steps pay for first-touch of memory on every rank: not measured.
      if (step > start_step + 1 && balancer.observe(step, compute_ms_per_rank)) {
        const auto& next = balancer.sizes_at(step + 2);
        progress.finish();
        log << "balance: from step " << step + 3 << " micro-batches per rank [";
        for (int r = 0; r < world; ++r) log << (r ? ", " : "") << next[r];
        log << "] (measured compute ms per rank last step [";
        for (int r = 0; r < world; ++r) log << (r ? ", " : "") << std::lround(compute_ms_per_rank[r]);
        log << "])\n";
      }
    }
    if (!std::isfinite(loss)) PT_THROW(Error, "training diverged: loss is ", loss, " at step ", step);
    if (step > start_step || steps - start_step == 1) {  // the first step pays for first-touch of memory
      timed_seconds += step_s;
      timed_items += items_per_step;
    }
    const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds
                                          : static_cast<double>(items_per_step) / step_s;
    result.last_loss = loss;
    if (metrics.enabled()) {
      const FsdpStepStats z3 = fsdp ? fsdp->last_stats() : FsdpStepStats{};
      const double comm_ms = ddp ? ddp->last_stats().comm_ms : z3.gather_ms + z3.reduce_scatter_ms;
      const double exposed_ms =
          ddp ? ddp->last_stats().exposed_comm_ms : z3.gather_exposed_ms + z3.reduce_scatter_exposed_ms;
      nlohmann::json m = {{"step", step},
                          {"loss", loss},
                          {"lr", step_lr},
                          {"grad_norm", norm},
                          {"step_ms", step_s * 1e3},
                          {"compute_ms", step_s * 1e3 - exposed_ms},
                          {"comm_ms", comm_ms},
                          {"exposed_comm_ms", exposed_ms},
                          {"mfu", peak_flops > 0 ? task->flops_per_item() * items_per_step / step_s /
                                                       (peak_flops * world)
                                                 : 0.0},
                          {"peak_flops", peak_flops * world},
                          {"page_faults", monitor::minor_page_faults() - faults_before},
                          {"loss_scale", loss_scale},
                          {"skipped", skipped},
                          {"mem_peak_bytes", peak_per_rank},
                          {"step_ms_per_rank", step_ms_per_rank},
                          {"compute_ms_per_rank", compute_ms_per_rank},
                          {"data_wait_ms", data_wait_s * 1e3}};
      if (pg) m["world_size"] = world;
      m["mem_optimizer_bytes"] = mem_optimizer_per_rank;
      m["mem_grad_bytes"] = mem_grad_per_rank;
      m["mem_param_bytes"] = mem_param_per_rank;
      if (zero) m["zero"] = cfg.zero;
      if (mp.half()) m["precision"] = amp::precision_name(compute_dtype), m["mem_half_copy_bytes"] = mp.half_copy_bytes();
      m["mem_activation_bytes"] = activation_bytes;
      if (cfg.recompute != "none") m["recompute"] = cfg.recompute;
      if (ddp && mesh.dp())
        m["comm_bytes"] = ddp->last_stats().bytes, m["comm_bytes_uncompressed"] = ddp->last_stats().bytes_uncompressed;
      if (fsdp && mesh.dp()) {
        m["comm_bytes"] = z3.gather_bytes + z3.reduce_scatter_bytes;
        m["zero3"] = {{"gather_ms", z3.gather_ms},
                      {"gather_exposed_ms", z3.gather_exposed_ms},
                      {"reduce_scatter_ms", z3.reduce_scatter_ms},
                      {"reduce_scatter_exposed_ms", z3.reduce_scatter_exposed_ms},
                      {"gather_hidden_ms", std::max(0.0, z3.gather_ms - z3.gather_exposed_ms)},
                      {"reduce_scatter_hidden_ms", std::max(0.0, z3.reduce_scatter_ms - z3.reduce_scatter_exposed_ms)},
                      {"gathers", z3.gathers},
                      {"gather_bytes", z3.gather_bytes},
                      {"reduce_scatter_bytes", z3.reduce_scatter_bytes},
                      {"peak_gathered_units", z3.peak_gathered_units},
                      {"peak_gathered_bytes", z3.peak_gathered_bytes}};
      }
      m["layout"] = {{"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp}};
      if (plan.size() > 1) {
        m["tp_comm_ms"] = tp_stats.ms;
        m["tp_comm_bytes"] = tp_stats.bytes;
        m["tp_comm_calls"] = tp_stats.calls;
        if (cfg.sequence_parallel) m["sequence_parallel"] = true;
      }
      if (balancer.enabled()) m["micro_batch_per_rank"] = micro_batch_per_rank;
      m[task->counts_tokens() ? "tokens_per_s" : "samples_per_s"] = static_cast<double>(items_per_step) / step_s;
      metrics.write(m);
    }
    if (!cfg.quiet) {
      const double eta = (steps - step - 1) * (timed_seconds > 0 ? timed_seconds / std::max<int64_t>(step - start_step, 1) : step_s);
      std::ostringstream line;
      line << "step " << step + 1 << "/" << steps << " | loss " << std::fixed << std::setprecision(4) << loss
           << " | lr " << std::scientific << std::setprecision(2) << step_lr << std::fixed << " | "
           << std::setprecision(0) << rate << (task->counts_tokens() ? " tok/s" : " samples/s") << " | ETA "
           << monitor::format_duration(eta);
      if (mp.scaler().enabled()) line << " | scale " << std::setprecision(0) << loss_scale << (skipped ? " (skipped)" : "");
      if (plan.size() > 1) line << " | " << shape.str() << ", tp comm " << std::setprecision(1) << tp_stats.ms << " ms";
      progress.update(step, line.str());
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) || step + 1 == steps))
      save_checkpoint(step + 1);
    if (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && step + 1 < steps) run_eval(step + 1);
  }
  if (!cfg.checkpoint_dir.empty() && start_step == steps) save_checkpoint(steps);  // resumed at the end
  progress.finish();
  run_eval(steps);
  const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds : 0.0;
  (task->counts_tokens() ? result.tokens_per_s : result.samples_per_s) = rate;
  result.peak_bytes = alloc.stats().peak_bytes_in_use;
  log << "done: " << steps - start_step << " steps in " << monitor::format_duration(seconds_since(t_start)) << ", "
      << std::setprecision(0) << std::fixed << rate << (task->counts_tokens() ? " tokens/s" : " samples/s")
      << ", peak memory " << std::setprecision(1) << static_cast<double>(result.peak_bytes) / (1 << 20) << " MiB"
      << (world > 1 ? " (rank 0)" : "") << "\n";
  if (autograd::profiler::enabled()) log << autograd::profiler::report();
  // The whole model with its Hugging Face names, whatever the layout (gathered over tp: every
  // rank takes part).
  std::map<std::string, Tensor> weights;
  if (!cfg.save_final.empty()) weights = plan.gather_whole(fsdp ? fsdp->full_state() : model.state_dict());
  if (!cfg.save_final.empty() && rank == 0) {
    if (cfg.save_dtype == "bf16")
      for (auto& [name, t] : weights) t = t.to(DType::BF16);
    checkpoint::save_safetensors(cfg.save_final, weights, task->metadata());
    log << "saved " << cfg.save_final << "\n";
  }
  return result;
}

}  // namespace paratrain::parallel
