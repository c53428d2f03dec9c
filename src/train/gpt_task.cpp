// The built-in GPT task: a GPT language model on a token file (DESIGN.md data order), with
// the validation loss over --val-data.
#include <algorithm>
#include <memory>
#include <vector>

#include "builtin_tasks.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/data/token_loader.h"
#include "paratrain/kernels/tensor_reduce.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/tensor_parallel/gpt_plan.h"

namespace paratrain::train {

namespace {

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
    parallel::check_tensor_parallel_layout(g, tp, c.sequence_parallel);
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
    name_ = c.model;
  }
  nn::Module& module() override { return *model_; }
  nn::GPT* gpt() override { return model_.get(); }
  int64_t steps_per_epoch() const override { return train_->steps_per_epoch(); }
  void fill(const data::BatchRequest& r, Tensor& x, Tensor& y) override {
    train_->fill_range(r.step, r.micro_step, r.first, r.count, x, y);
  }
  Tensor loss(const Tensor& x, const Tensor& y) override { return model_->loss(x, y); }
  std::string name() const override { return name_; }
  int64_t items_per_example() const override { return cfg_.block_size; }
  const char* example_noun() const override { return "sequences"; }
  bool counts_tokens() const override { return true; }
  double flops_per_item() const override { return cfg_.flops_per_token(); }
  bool has_eval() const override { return val_ != nullptr; }
  // Evaluation batch g holds the B x dp windows [g*B*dp, (g+1)*B*dp) of the validation
  // file; rank r computes its part (windows of local batch g*dp + r). The loss is the mean
  // over all of them, so it does not depend on how the same B x dp is laid out over ranks.
  void evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn& loss) override {
    autograd::NoGradGuard ng;
    model_->eval();
    const int dp = pg ? pg->size() : 1, r = pg ? pg->rank() : 0;
    const int64_t total = val_->num_batches() / dp;
    const int64_t n = std::min<int64_t>(total, max_batches > 0 ? max_batches : total);
    std::vector<Tensor> losses;  // read back together after the last batch (one wait on a GPU)
    Tensor x, y;
    for (int64_t g = 0; g < n; ++g) {
      val_->fill(g * dp + r, x, y);
      losses.push_back(loss ? loss(x, y) : model_->loss(x, y));
    }
    double sum = 0;
    for (double l : kernels::values_of(losses)) sum += l;
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
  std::string name_;
  std::unique_ptr<data::TokenLoader> train_;
  std::unique_ptr<data::TokenEvalLoader> val_;
  std::unique_ptr<nn::GPT> model_;
};

}  // namespace

std::unique_ptr<Task> make_gpt_task(const TrainConfig& c, int64_t micro_batch, int dp, int tp) {
  return std::make_unique<GptTask>(c, micro_batch, dp, tp);
}

}  // namespace paratrain::train
