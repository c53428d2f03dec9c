// Your own model, loss and data, trained by paratrain's training loop: data parallel over the
// ranks, ZeRO 1 (optimizer state sharded), bf16 compute, checkpoints and resume. Written
// against paratrain's public headers only; copy it as the start of your own program.
//
//   paratrain launch --nproc-per-node 2 -- example_custom_model_train STEPS CKPT_DIR [--stop-at N] [--resume]
//
// The model is a small residual MLP that classifies the points of a three-armed 2-D spiral;
// the data is generated on the fly by a train::Dataset. The run lasts STEPS optimizer steps
// (the learning-rate schedule spans them); --stop-at N ends this session after step N, and
// --resume continues from the latest checkpoint in CKPT_DIR exactly where it stopped. Rank 0
// prints "step S loss X" after every step, and the validation accuracy at the end.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <paratrain/autograd/ops.h>
#include <paratrain/base/error.h>
#include <paratrain/comm/process_group.h>
#include <paratrain/nn/layers.h>
#include <paratrain/train/supervised_task.h>
#include <paratrain/train/trainer.h>

using namespace paratrain;

// [guide:model]
// x + fc2(gelu(fc1(layer_norm(x)))): a pre-norm residual block of width `w`.
class ResidualBlock : public nn::Module {
 public:
  ResidualBlock(int64_t w, Generator& gen) {
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(w));
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(w, 2 * w, true, nn::WeightLayout::OutIn, gen));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(2 * w, w, true, nn::WeightLayout::OutIn, gen));
  }
  Tensor forward(const Tensor& x) const {
    return ops::add(x, fc2->forward(ops::gelu(fc1->forward(norm->forward(x)))));
  }

 private:
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
};
// [/guide:model]

// points [B, 2] -> class logits [B, classes]
class ResidualMlp : public nn::Module {
 public:
  ResidualMlp(int64_t width, int depth, int64_t classes, uint64_t seed) : gen_(seed) {
    in_ = register_module("input", std::make_shared<nn::Linear>(2, width, true, nn::WeightLayout::OutIn, gen_));
    for (int i = 0; i < depth; ++i)
      blocks_.push_back(register_module("block" + std::to_string(i), std::make_shared<ResidualBlock>(width, gen_)));
    norm_ = register_module("norm", std::make_shared<nn::LayerNorm>(width));
    head_ = register_module("head", std::make_shared<nn::Linear>(width, classes, true, nn::WeightLayout::OutIn, gen_));
  }
  Tensor forward(const Tensor& points) const {
    Tensor h = in_->forward(points);
    for (const auto& b : blocks_) h = b->forward(h);
    return head_->forward(norm_->forward(h));
  }

 private:
  Generator gen_;  // the initial weights (the same on every rank; DDP also broadcasts rank 0's)
  std::shared_ptr<nn::Linear> in_, head_;
  std::shared_ptr<nn::LayerNorm> norm_;
  std::vector<std::shared_ptr<ResidualBlock>> blocks_;
};

// Point i of a noisy three-armed spiral and its arm, computed from (seed, i) alone: the same
// example for the same index on every rank and in every session, no shared state (get() may
// run on two threads at once).
class SpiralDataset : public train::Dataset {
 public:
  SpiralDataset(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  int64_t size() const override { return n_; }
  train::Example get(int64_t i) const override {
    Generator g(seed_ * 1000003u + static_cast<uint64_t>(i));
    const int arm = static_cast<int>(i % 3);
    const double t = g.uniform_f64();  // 0 at the centre, 1 at the arm's end
    const double angle = 2.0943951 * arm + 4.0 * t + 0.15 * g.normal();
    const std::vector<float> xy = {static_cast<float>(t * std::cos(angle)), static_cast<float>(t * std::sin(angle))};
    return {Tensor::from_vector(xy, {2}), Tensor::from_vector_i32({arm}, {})};
  }

 private:
  int64_t n_;
  uint64_t seed_;
};

// The number of rows whose largest logit is the label's.
int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::vector<float> l = logits.to(DType::F32).to_vector();
  const int64_t classes = logits.shape()[1];
  const int32_t* y = labels.data<int32_t>();
  int64_t correct = 0;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    int64_t best = 0;
    for (int64_t c = 1; c < classes; ++c)
      if (l[i * classes + c] > l[i * classes + best]) best = c;
    correct += best == y[i];
  }
  return correct;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s STEPS CKPT_DIR [--stop-at N] [--resume]\n", argv[0]);
    return 2;
  }
  try {
    const int rank = comm::read_job_env().rank;
    // [guide:config]
    train::TrainConfig cfg;
    cfg.steps = std::atoll(argv[1]);
    cfg.checkpoint_dir = argv[2];
    for (int i = 3; i < argc; ++i) {
      if (std::strcmp(argv[i], "--resume") == 0)
        cfg.resume = true;
      else if (std::strcmp(argv[i], "--stop-at") == 0 && i + 1 < argc)
        cfg.stop_at_step = std::atoll(argv[++i]);
      else
        throw InputError(std::string("unknown argument '") + argv[i] + "' (expected --stop-at N or --resume)");
    }
    cfg.checkpoint_every = 10;  // and after the last step of each session
    cfg.micro_batch = 32;       // per rank: a global batch of 32 x 2 ranks
    cfg.lr = 3e-3;
    cfg.warmup_steps = 5;
    cfg.weight_decay = 0.0;
    cfg.zero = 1;               // each rank keeps half of AdamW's state
    cfg.precision = "bf16";     // matrix products in bf16, master weights f32
    cfg.quiet = true;           // this program prints its own lines
    // [/guide:config]

    // [guide:task]
    ResidualMlp model(/*width=*/32, /*depth=*/2, /*classes=*/3, /*seed=*/42);
    SpiralDataset train_set(4096, /*seed=*/1), val_set(600, /*seed=*/2);
    train::SupervisedOptions opts;
    opts.name = "spiral-resmlp";
    opts.validation = &val_set;
    opts.correct = [&](const Tensor& x, const Tensor& y) { return count_correct(model.forward(x), y); };
    train::SupervisedTask task(
        model, [&](const Tensor& x, const Tensor& y) { return ops::cross_entropy(model.forward(x), y); }, train_set,
        opts);
    // [/guide:task]

    // [guide:run]
    const train::TrainResult r = train::train(cfg, task, std::cerr, [&](const train::StepInfo& s) {
      if (rank == 0) std::printf("step %lld loss %.9g\n", static_cast<long long>(s.step), s.loss);
    });
    if (rank == 0) {
      std::printf("trained steps %lld..%lld of %lld; validation accuracy %.4f\n",
                  static_cast<long long>(r.start_step + 1), static_cast<long long>(r.start_step + r.losses.size()),
                  static_cast<long long>(r.steps), r.accuracy);
      std::fflush(stdout);
    }
    // [/guide:run]
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
