// Optimizers with exactly torch.optim's semantics, LR schedules and global-norm clipping.
//
// An Optimizer holds named parameters (the Module's named_parameters()) and their state.
// step() applies one update from each parameter's .grad (a parameter without a gradient is
// skipped, as in PyTorch). Weight decay applies to parameters with dim >= 2 only when
// decay_2d_only is set (GPT practice; DESIGN.md: "AdamW decays 2-D weights only").
// state_dict()/load_state_dict() expose the state as named tensors ("<param>.exp_avg",
// "<param>.exp_avg_sq", "<param>.momentum_buffer") plus the step count, for checkpoints.
//
// Lifetimes: an Optimizer keeps the parameter tensors it is given (handles sharing their
// storage), so it updates the model's parameters in place and keeps that storage alive; its
// state tensors are its own. state_dict() returns handles to that state (not copies).
// Devices: the state is made on each parameter's device when the optimizer is built, so move
// the model first (Module::to); step() throws InputError naming the parameter when a
// parameter, its gradient and its state are not on one device.
// Thread-safety: not thread-safe: one thread steps an optimizer, and no other thread may
// use the parameters or their .grad during step(). Schedules and clipping are functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::optim {

using NamedParams = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  explicit Optimizer(NamedParams params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  int64_t steps_taken() const { return step_; }
  const NamedParams& params() const { return params_; }
  // For an optimizer over pieces of parameters (ZeRO hands each rank 1-D slices of them):
  // dims[i] is the dimensionality of the whole parameter entry i belongs to, which the
  // weight-decay rule (decay_2d_only: dim >= 2) then uses instead of the entry's own dim().
  // InputError unless there is one value per entry. Empty (the default): each entry's dim().
  void set_param_dims(std::vector<int64_t> dims);

  virtual std::map<std::string, Tensor> state_dict() const = 0;
  // InputError naming the tensor when a state tensor is missing or has the wrong shape.
  virtual void load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps_taken) = 0;

 protected:
  // The dimensionality the weight-decay rule sees for entry i (set_param_dims, else dim()).
  int64_t param_dim(size_t i) const;

  NamedParams params_;
  std::vector<int64_t> param_dims_;
  double lr_ = 1e-3;
  int64_t step_ = 0;
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  bool decay_2d_only = true;
};

class AdamW final : public Optimizer {
 public:
  AdamW(NamedParams params, const AdamWOptions& opts);
  void step() override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps_taken) override;

 private:
  AdamWOptions opts_;
  std::vector<Tensor> m_, v_;
};

struct SGDOptions {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
  bool decay_2d_only = false;
};

class SGD final : public Optimizer {
 public:
  SGD(NamedParams params, const SGDOptions& opts);
  void step() override;
  std::map<std::string, Tensor> state_dict() const override;
  void load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps_taken) override;

 private:
  SGDOptions opts_;
  std::vector<Tensor> buf_;
  std::vector<bool> has_buf_;
};

// Learning rate at optimizer step `step` (0-based): linear warm-up from lr/warmup to lr over
// `warmup` steps, then constant or cosine decay to min_lr at `total` steps.
struct LRSchedule {
  enum class Kind { Constant, Cosine } kind = Kind::Constant;
  double lr = 1e-3, min_lr = 0.0;
  int64_t warmup = 0, total = 1;
  double at(int64_t step) const;
  static Kind parse(const std::string& name);  // "constant" | "cosine"; InputError otherwise
};

// The global L2 norm of the gradients (parameters without gradients count as zero): each
// gradient's sum of squares into a device slot, one read-back, added in parameter order
// (kernels::sum_of_squares).
double grad_norm(const NamedParams& params);
// Scales every gradient by min(1, max_norm / (norm + 1e-6)) when norm > max_norm, as
// torch.nn.utils.clip_grad_norm_. Returns the norm before clipping.
double clip_grad_norm(const NamedParams& params, double max_norm, double norm);

}  // namespace paratrain::optim
