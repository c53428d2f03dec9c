// SupervisedTask (train/supervised_task.h): a user's Module, loss function and Dataset as a
// Task -- batches stacked from the examples the data order picks, evaluation over the
// validation set cut into fixed batches shared out among the data-parallel ranks.
#include "paratrain/train/supervised_task.h"

#include <algorithm>
#include <vector>

#include "device_placement.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"

namespace paratrain::train {

namespace {

std::string describe(DType dt, const Shape& s) { return std::string(dtype_name(dt)) + " " + shape_str(s); }

// `t` as a tensor of `shape` and `dtype` (reallocated only when it is not one).
void ensure(Tensor& t, const Shape& shape, DType dtype) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dtype) t = Tensor::empty(shape, dtype);
}

}  // namespace

SupervisedTask::SupervisedTask(nn::Module& model, LossFn loss, const Dataset& train, SupervisedOptions options)
    : model_(model), loss_(std::move(loss)), train_(train), options_(std::move(options)) {
  if (!loss_) PT_THROW(InputError, "SupervisedTask '", options_.name, "': the loss function is empty");
}

void SupervisedTask::setup(const TaskLayout& layout) {
  const std::string who = "task '" + options_.name + "'";
  if (options_.eval_batch < 1)
    PT_THROW(InputError, who, ": SupervisedOptions::eval_batch must be at least 1, got ", options_.eval_batch);
  if (train_.size() < 1) PT_THROW(InputError, who, ": the training dataset is empty");
  const Example first = train_.get(0);
  if (!first.input.defined() || !first.target.defined())
    PT_THROW(InputError, who, ": training example 0 has an undefined ", first.input.defined() ? "target" : "input");
  spec_ = {first.input.shape(), first.target.shape(), first.input.dtype(), first.target.dtype()};
  if (const Dataset* v = options_.validation) {
    if (v->size() < 1) PT_THROW(InputError, who, ": the validation dataset is empty");
    Tensor x, y;
    gather(*v, "validation", {0}, x, y);  // its shapes are the training examples'
  }
  order_.emplace(train_.size(), layout.batch_layout(), layout.seed, who + ": the training dataset");
  steps_per_epoch_ = order_->steps_per_epoch();
}

void SupervisedTask::gather(const Dataset& dataset, const char* which, const std::vector<int64_t>& indices,
                            Tensor& inputs, Tensor& targets) const {
  const int64_t n = static_cast<int64_t>(indices.size());
  Shape in_shape{n}, tg_shape{n};
  in_shape.insert(in_shape.end(), spec_.input.begin(), spec_.input.end());
  tg_shape.insert(tg_shape.end(), spec_.target.begin(), spec_.target.end());
  ensure(inputs, in_shape, spec_.input_dtype);
  ensure(targets, tg_shape, spec_.target_dtype);
  for (int64_t i = 0; i < n; ++i) {
    const Example e = dataset.get(indices[i]);
    const auto check = [&](const Tensor& t, const char* part, DType dt, const Shape& s) {
      if (!t.defined() || t.dtype() != dt || t.shape() != s)
        PT_THROW(InputError, "task '", options_.name, "': ", which, " example ", indices[i], "'s ", part, " is ",
                 t.defined() ? describe(t.dtype(), t.shape()) : std::string("undefined"), ", but training example 0's is ",
                 describe(dt, s), " (every example must have the same shapes and dtypes)");
    };
    check(e.input, "input", spec_.input_dtype, spec_.input);
    check(e.target, "target", spec_.target_dtype, spec_.target);
    inputs.select(0, i).copy_(e.input);
    targets.select(0, i).copy_(e.target);
  }
}

void SupervisedTask::fill(const data::BatchRequest& r, Tensor& inputs, Tensor& targets) {
  PT_CHECK(order_.has_value(), "SupervisedTask::fill before setup()");
  gather(train_, "training", order_->items_range(r.step, r.micro_step, r.first, r.count), inputs, targets);
}

Tensor SupervisedTask::loss(const Tensor& inputs, const Tensor& targets) { return loss_(inputs, targets); }

void SupervisedTask::evaluate(int64_t max_batches, comm::ProcessGroup* pg, nlohmann::json& out, const LossFn& loss) {
  const Dataset& v = *options_.validation;
  const int64_t B = options_.eval_batch;
  int64_t batches = (v.size() + B - 1) / B;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  const int dp = pg ? pg->size() : 1, rank = pg ? pg->rank() : 0;
  // Per batch: loss x examples, correct, examples. Each slot is filled by one rank and zero on
  // the others, so the sum over ranks is exact and the totals do not depend on the layout.
  std::vector<float> sums(3 * static_cast<size_t>(batches), 0.0f);
  {
    autograd::NoGradGuard no_grad;
    const bool was_training = model_.is_training();
    model_.eval();
    const DeviceSpec device = model_device(model_);
    Tensor x, y;
    for (int64_t b = rank; b < batches; b += dp) {
      const int64_t begin = b * B, n = std::min(B, v.size() - begin);
      std::vector<int64_t> idx(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) idx[i] = begin + i;
      gather(v, "validation", idx, x, y);
      // On the model's device (a GPU run): the loss and the user's `correct` see the batch there.
      const Tensor xd = x.to(device), yd = y.to(device);
      const Tensor l = loss ? loss(xd, yd) : loss_(xd, yd);
      if (!l.defined() || l.numel() != 1)
        PT_THROW(InputError, "task '", options_.name, "': the loss function returned ",
                 l.defined() ? "a tensor of shape " + shape_str(l.shape()) : std::string("an undefined tensor"),
                 " on a validation batch; it must return the batch's mean loss as a scalar");
      sums[3 * b] = static_cast<float>(l.item() * static_cast<double>(n));
      sums[3 * b + 1] = options_.correct ? static_cast<float>(options_.correct(xd, yd)) : 0.0f;
      sums[3 * b + 2] = static_cast<float>(n);
    }
    model_.train(was_training);
  }
  if (pg && dp > 1) pg->allreduce(sums.data(), sums.size(), DType::F32)->wait();
  double loss_sum = 0, correct = 0, count = 0;
  for (int64_t b = 0; b < batches; ++b) loss_sum += sums[3 * b], correct += sums[3 * b + 1], count += sums[3 * b + 2];
  out["val_loss"] = loss_sum / count;
  if (options_.correct) out["accuracy"] = correct / count;
}

checkpoint::Metadata SupervisedTask::metadata() const {
  checkpoint::Metadata m = {{"format", "paratrain-task"}, {"task", options_.name}};
  for (const auto& [k, v] : options_.metadata) m[k] = v;
  return m;
}

}  // namespace paratrain::train
