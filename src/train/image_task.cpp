// The built-in classifier task: an MLP or CNN on Fashion-MNIST, with the test-set accuracy.
#include <algorithm>
#include <memory>

#include "builtin_tasks.h"
#include "device_placement.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/nn/classifiers.h"

namespace paratrain::train {

namespace {

class ImageTask final : public Task {
 public:
  ImageTask(const TrainConfig& c, int64_t micro_batch, int dp) : name_(c.model) {
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
  std::string name() const override { return name_; }
  const char* example_noun() const override { return "images"; }
  bool counts_tokens() const override { return false; }
  double flops_per_item() const override {
    // forward MACs x 2 x 3 (forward + backward)
    double macs = cnn_ ? (28.0 * 28 * 32 * 9 + 14.0 * 14 * 64 * 32 * 9 + 3136.0 * 128 + 128.0 * 10)
                       : (784.0 * 256 + 256.0 * 256 + 256.0 * 10);
    return 6.0 * macs;
  }
  bool has_eval() const override { return true; }
  void evaluate(int64_t, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn&) override {
    if (pg && pg->rank() != 0) return;  // rank 0 evaluates the whole test set alone
    autograd::NoGradGuard ng;
    model_->eval();
    int64_t correct = 0, total = 0;
    Tensor x, y;
    for (int64_t b = 0; b < test_->num_batches(); ++b) {
      const int64_t n = test_->fill(b, x, y);
      auto logits = model_->forward(x.to(model_device(*model_))).to_vector();
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
  std::string name_;
  bool cnn_ = false;
  std::unique_ptr<data::ImageLoader> train_;
  std::unique_ptr<data::ImageEvalLoader> test_;
  std::unique_ptr<nn::Classifier> model_;
};

}  // namespace

std::unique_ptr<Task> make_image_task(const TrainConfig& c, int64_t micro_batch, int dp) {
  return std::make_unique<ImageTask>(c, micro_batch, dp);
}

}  // namespace paratrain::train
