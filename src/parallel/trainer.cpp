#include "paratrain/parallel/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <memory>
#include <ostream>
#include <sstream>
#include <thread>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/env.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/data/token_loader.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/nn/classifiers.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"

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
  // The loss of micro-step k of optimizer step `step` (data-parallel rank 0 of 1).
  virtual Tensor micro_loss(int64_t step, int64_t k) = 0;
  virtual int64_t items_per_micro_batch() const = 0;  // tokens (GPT) or samples
  virtual bool counts_tokens() const = 0;
  virtual double flops_per_item() const = 0;
  virtual bool has_eval() const = 0;
  // Fills "val_loss" or "accuracy" in `out`.
  virtual void evaluate(int64_t max_batches, nlohmann::json& out) = 0;
  virtual nn::Module& init_target() { return module(); }
  virtual checkpoint::Metadata metadata() const = 0;
};

class GptTask final : public Task {
 public:
  GptTask(const TrainConfig& c, int64_t micro_batch) {
    nn::GPTConfig g = nn::GPTConfig::preset(c.model);
    if (c.n_layer) g.n_layer = c.n_layer;
    if (c.n_head) g.n_head = c.n_head;
    if (c.n_embd) g.n_embd = c.n_embd;
    if (c.block_size) g.block_size = c.block_size;
    if (c.vocab_size) g.vocab_size = c.vocab_size;
    g.dropout = c.dropout;
    g.validate();
    if (c.data.empty()) PT_THROW(InputError, "--model ", c.model, " needs --data FILE.bin (token file)");
    data::BatchLayout layout{micro_batch, c.grad_accum, 1};
    train_ = std::make_unique<data::TokenLoader>(c.data, g.block_size, layout, c.seed);
    check_vocab(train_->file(), c.data, g.vocab_size);
    if (!c.val_data.empty()) {
      val_ = std::make_unique<data::TokenEvalLoader>(c.val_data, g.block_size, micro_batch);
      check_vocab(val_->file(), c.val_data, g.vocab_size);
      if (val_->num_batches() == 0)
        PT_THROW(InputError, "--val-data ", c.val_data, " is too short for one batch of ", micro_batch, " x ",
                 g.block_size + 1, " tokens");
    }
    model_ = std::make_unique<nn::GPT>(g, c.seed);
    cfg_ = g;
    micro_batch_ = micro_batch;
  }
  nn::Module& module() override { return *model_; }
  int64_t steps_per_epoch() const override { return train_->steps_per_epoch(); }
  Tensor micro_loss(int64_t step, int64_t k) override {
    train_->fill(step, k, 0, x_, y_);
    return model_->loss(x_, y_);
  }
  int64_t items_per_micro_batch() const override { return micro_batch_ * cfg_.block_size; }
  bool counts_tokens() const override { return true; }
  double flops_per_item() const override { return cfg_.flops_per_token(); }
  bool has_eval() const override { return val_ != nullptr; }
  void evaluate(int64_t max_batches, nlohmann::json& out) override {
    autograd::NoGradGuard ng;
    model_->eval();
    const int64_t n = std::min<int64_t>(val_->num_batches(), max_batches > 0 ? max_batches : val_->num_batches());
    double sum = 0;
    Tensor x, y;
    for (int64_t b = 0; b < n; ++b) {
      val_->fill(b, x, y);
      sum += model_->loss(x, y).item();
    }
    model_->train();
    out["val_loss"] = sum / static_cast<double>(n);
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
  Tensor x_, y_;
};

class ImageTask final : public Task {
 public:
  ImageTask(const TrainConfig& c, int64_t micro_batch) : micro_batch_(micro_batch) {
    if (c.dataset != "fashion-mnist")
      PT_THROW(InputError, "--model ", c.model, " needs --dataset fashion-mnist",
               c.dataset.empty() ? "" : (" (got '" + c.dataset + "')"));
    const std::string dir = c.data_dir.empty() ? data::kFashionMnistDir : c.data_dir;
    auto train = data::load_fashion_mnist(data::Split::Train, dir);
    auto test = data::load_fashion_mnist(data::Split::Test, dir);
    train_ = std::make_unique<data::ImageLoader>(train, data::BatchLayout{micro_batch, c.grad_accum, 1}, c.seed);
    test_ = std::make_unique<data::ImageEvalLoader>(test, 500);
    if (c.model == "cnn")
      model_ = std::make_unique<nn::CNNClassifier>(c.seed);
    else
      model_ = std::make_unique<nn::MLPClassifier>(c.seed);
    cnn_ = c.model == "cnn";
  }
  nn::Module& module() override { return *model_; }
  int64_t steps_per_epoch() const override { return train_->steps_per_epoch(); }
  Tensor micro_loss(int64_t step, int64_t k) override {
    train_->fill(step, k, 0, x_, y_);
    return model_->loss(x_, y_);
  }
  int64_t items_per_micro_batch() const override { return micro_batch_; }
  bool counts_tokens() const override { return false; }
  double flops_per_item() const override {
    // forward MACs x 2 x 3 (forward + backward)
    double macs = cnn_ ? (28.0 * 28 * 32 * 9 + 14.0 * 14 * 64 * 32 * 9 + 3136.0 * 128 + 128.0 * 10)
                       : (784.0 * 256 + 256.0 * 256 + 256.0 * 10);
    return 6.0 * macs;
  }
  bool has_eval() const override { return true; }
  void evaluate(int64_t, nlohmann::json& out) override {
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
  Tensor x_, y_;
};

int default_threads() {
  if (int64_t t = env::get_int("PARATRAIN_THREADS"); t > 0) return static_cast<int>(t);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t local = env::raw_int("LOCAL_WORLD_SIZE").value_or(env::raw_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1));
  return std::max(1, cores / static_cast<int>(std::max<int64_t>(local, 1)));
}

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
  if (!is_gpt(c.model) && c.model != "mlp" && c.model != "cnn")
    PT_THROW(InputError, "unknown --model '", c.model, "' (expected gpt-nano, gpt-mini, gpt2-124m, gpt, mlp or cnn)");
}

}  // namespace

TrainResult train(const TrainConfig& cfg, std::ostream& log) {
  validate(cfg);
  kernels::cpu::set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads());
  const bool gpt = is_gpt(cfg.model);
  const int64_t micro_batch = cfg.micro_batch > 0 ? cfg.micro_batch : (gpt ? 8 : 64);

  // ---- everything that can be wrong with the input is checked before any file is written ----
  std::unique_ptr<Task> task;
  if (gpt)
    task = std::make_unique<GptTask>(cfg, micro_batch);
  else
    task = std::make_unique<ImageTask>(cfg, micro_batch);
  nn::Module& model = task->module();
  if (!cfg.init_from.empty()) model.load_state_dict(checkpoint::load_safetensors(cfg.init_from), true, "transformer.");
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

  auto params = model.named_parameters();
  std::unique_ptr<optim::Optimizer> opt;
  if (cfg.optimizer == "adamw") {
    optim::AdamWOptions o;
    o.lr = lr, o.beta1 = cfg.beta1, o.beta2 = cfg.beta2, o.eps = cfg.eps, o.weight_decay = cfg.weight_decay;
    opt = std::make_unique<optim::AdamW>(params, o);
  } else {
    optim::SGDOptions o;
    o.lr = lr, o.momentum = cfg.momentum, o.weight_decay = cfg.weight_decay;
    opt = std::make_unique<optim::SGD>(params, o);
  }
  monitor::MetricsWriter metrics(cfg.metrics);

  const int64_t items_per_step = task->items_per_micro_batch() * cfg.grad_accum;
  log << "paratrain train: " << cfg.model << ", " << model.num_parameters() << " parameters, " << steps
      << " steps, global batch " << micro_batch << " x " << cfg.grad_accum << " x 1 = " << micro_batch * cfg.grad_accum
      << (gpt ? " sequences" : " images") << ", " << kernels::cpu::num_threads() << " threads\n";

  const double peak_flops = metrics.enabled() ? monitor::measured_gemm_peak_flops() : 0.0;
  Allocator& alloc = allocator_for(Device::CPU);
  alloc.reset_peak();
  TrainResult result;
  result.steps = steps;
  const auto t_start = Clock::now();
  double timed_seconds = 0;
  int64_t timed_items = 0;
  const float inv_accum = 1.0f / static_cast<float>(cfg.grad_accum);
  Tensor accum_seed = Tensor::full({}, inv_accum);

  auto run_eval = [&](int64_t step) {
    if (!task->has_eval()) return;
    nlohmann::json e = {{"step", step}, {"eval", true}};
    task->evaluate(cfg.eval_batches, e);
    if (e.contains("val_loss")) result.val_loss = e["val_loss"];
    if (e.contains("accuracy")) result.accuracy = e["accuracy"];
    metrics.write(e);
    log << "\n" << "eval step " << step << ": "
        << (e.contains("val_loss") ? "val_loss " + std::to_string(result.val_loss)
                                   : "accuracy " + std::to_string(result.accuracy))
        << "\n";
  };

  for (int64_t step = 0; step < steps; ++step) {
    const auto t0 = Clock::now();
    const double step_lr = sched.at(step);
    opt->set_lr(step_lr);
    model.zero_grad();
    double loss_sum = 0;
    for (int64_t k = 0; k < cfg.grad_accum; ++k) {
      Tensor loss = task->micro_loss(step, k);
      loss_sum += loss.item();
      autograd::backward(loss, accum_seed);
    }
    const double loss = loss_sum / static_cast<double>(cfg.grad_accum);
    if (!std::isfinite(loss)) PT_THROW(Error, "training diverged: loss is ", loss, " at step ", step);
    const double norm = optim::grad_norm(params);
    optim::clip_grad_norm(params, cfg.grad_clip, norm);
    opt->step();
    const double step_s = seconds_since(t0);
    if (step > 0 || steps == 1) {  // the first step pays for first-touch of memory
      timed_seconds += step_s;
      timed_items += items_per_step;
    }
    const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds
                                          : static_cast<double>(items_per_step) / step_s;
    result.last_loss = loss;
    if (metrics.enabled()) {
      auto st = alloc.stats();
      nlohmann::json m = {{"step", step},
                          {"loss", loss},
                          {"lr", step_lr},
                          {"grad_norm", norm},
                          {"step_ms", step_s * 1e3},
                          {"compute_ms", step_s * 1e3},
                          {"comm_ms", 0.0},
                          {"exposed_comm_ms", 0.0},
                          {"mfu", peak_flops > 0 ? task->flops_per_item() * items_per_step / step_s / peak_flops : 0.0},
                          {"loss_scale", 1.0},
                          {"mem_peak_bytes", {st.peak_bytes_in_use}},
                          {"step_ms_per_rank", {step_s * 1e3}}};
      m[task->counts_tokens() ? "tokens_per_s" : "samples_per_s"] = static_cast<double>(items_per_step) / step_s;
      metrics.write(m);
    }
    if (!cfg.quiet) {
      const double eta = (steps - step - 1) * (timed_seconds > 0 ? timed_seconds / std::max<int64_t>(step, 1) : step_s);
      std::ostringstream line;
      line << "\rstep " << step + 1 << "/" << steps << " | loss " << std::fixed << std::setprecision(4) << loss
           << " | lr " << std::scientific << std::setprecision(2) << step_lr << std::fixed << " | "
           << std::setprecision(0) << rate << (task->counts_tokens() ? " tok/s" : " samples/s") << " | ETA "
           << monitor::format_duration(eta) << "   ";
      log << line.str() << std::flush;
    }
    if (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && step + 1 < steps) run_eval(step + 1);
  }
  if (!cfg.quiet) log << "\n";
  run_eval(steps);
  const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds : 0.0;
  (task->counts_tokens() ? result.tokens_per_s : result.samples_per_s) = rate;
  result.peak_bytes = alloc.stats().peak_bytes_in_use;
  log << "done: " << steps << " steps in " << monitor::format_duration(seconds_since(t_start)) << ", "
      << std::setprecision(0) << std::fixed << rate << (task->counts_tokens() ? " tokens/s" : " samples/s")
      << ", peak memory " << std::setprecision(1) << static_cast<double>(result.peak_bytes) / (1 << 20) << " MiB\n";
  if (autograd::profiler::enabled()) log << autograd::profiler::report();
  if (!cfg.save_final.empty()) {
    checkpoint::save_safetensors(cfg.save_final, model.state_dict(), task->metadata());
    log << "saved " << cfg.save_final << "\n";
  }
  return result;
}

}  // namespace paratrain::parallel
