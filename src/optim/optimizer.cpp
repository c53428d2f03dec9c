#include "paratrain/optim/optimizer.h"

#include <cmath>
#include <map>
#include <utility>
#include <vector>

#include "paratrain/autograd/profiler.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/kernels/tensor_reduce.h"

namespace paratrain::optim {

using kernels::kernel;
using kernels::Registry;

namespace {
bool decays(int64_t dim, bool decay_2d_only) { return !decay_2d_only || dim >= 2; }

void load_named(const std::map<std::string, Tensor>& state, const std::string& name, Tensor& dst) {
  auto it = state.find(name);
  if (it == state.end()) PT_THROW(InputError, "optimizer state: missing tensor '", name, "'");
  if (it->second.shape() != dst.shape())
    PT_THROW(InputError, "optimizer state: tensor '", name, "' has shape ", shape_str(it->second.shape()),
             ", expected ", shape_str(dst.shape()));
  dst.copy_(it->second);
}

// InputError unless the parameter, its gradient and its state (undefined ones skipped) are on
// one device: the update kernel runs there.
void expect_one_device(const char* opt, const std::string& name, const Tensor& p, const Tensor& g,
                       std::initializer_list<const Tensor*> state) {
  const DeviceSpec d = p.device_spec();
  if (g.device_spec() != d)
    PT_THROW(InputError, opt, ": parameter '", name, "' is on ", d.str(), " but its gradient is on ",
             g.device_spec().str());
  for (const Tensor* s : state)
    if (s->defined() && s->device_spec() != d)
      PT_THROW(InputError, opt, ": parameter '", name, "' is on ", d.str(), " but its state is on ",
               s->device_spec().str(), " (build the optimizer after moving the model with Module::to)");
}
}  // namespace

void Optimizer::set_param_dims(std::vector<int64_t> dims) {
  if (!dims.empty() && dims.size() != params_.size())
    PT_THROW(InputError, "optimizer: ", dims.size(), " parameter dims for ", params_.size(), " parameters");
  param_dims_ = std::move(dims);
}

int64_t Optimizer::param_dim(size_t i) const {
  return param_dims_.empty() ? params_[i].second.dim() : param_dims_[i];
}

AdamW::AdamW(NamedParams params, const AdamWOptions& opts) : Optimizer(std::move(params)), opts_(opts) {
  lr_ = opts.lr;
  for (auto& [name, p] : params_) {
    m_.push_back(p.new_zeros(p.shape(), DType::F32));
    v_.push_back(p.new_zeros(p.shape(), DType::F32));
  }
}

// One multi-tensor update per device (every parameter of a model is on one): on a GPU a few
// launches for all of them; on the CPU the same bits as one call per tensor.
void AdamW::step() {
  autograd::profiler::OpScope op_scope("adamw.step", false);
  ++step_;
  std::vector<Tensor> grads;  // contiguous gradients, alive until the updates are queued
  std::map<std::pair<int, int>, std::pair<Tensor, std::vector<kernels::cpu::AdamWTensor>>> by_device;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    grads.push_back(g.contiguous());
    expect_one_device("AdamW", params_[i].first, p, grads.back(), {&m_[i], &v_[i]});
    const float wd = decays(param_dim(i), opts_.decay_2d_only) ? static_cast<float>(opts_.weight_decay) : 0.0f;
    auto& [first, list] = by_device[{static_cast<int>(p.device()), p.device_index()}];
    if (!first.defined()) first = p;
    list.push_back({p.data<float>(), grads.back().data<float>(), m_[i].data<float>(), v_[i].data<float>(), p.numel(), wd});
  }
  for (auto& [device, entry] : by_device)
    kernel(&Registry::adamw_update_multi, entry.first)(entry.second.data(), static_cast<int64_t>(entry.second.size()),
                                                        static_cast<float>(lr_), static_cast<float>(opts_.beta1),
                                                        static_cast<float>(opts_.beta2), static_cast<float>(opts_.eps),
                                                        step_);
}

std::map<std::string, Tensor> AdamW::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i) {
    out[params_[i].first + ".exp_avg"] = m_[i];
    out[params_[i].first + ".exp_avg_sq"] = v_[i];
  }
  return out;
}

void AdamW::load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps_taken) {
  for (size_t i = 0; i < params_.size(); ++i) {
    load_named(state, params_[i].first + ".exp_avg", m_[i]);
    load_named(state, params_[i].first + ".exp_avg_sq", v_[i]);
  }
  step_ = steps_taken;
}

SGD::SGD(NamedParams params, const SGDOptions& opts) : Optimizer(std::move(params)), opts_(opts) {
  lr_ = opts.lr;
  for (auto& [name, p] : params_) {
    buf_.push_back(opts.momentum != 0.0 ? p.new_zeros(p.shape(), DType::F32) : Tensor());
    has_buf_.push_back(false);
  }
}

void SGD::step() {
  autograd::profiler::OpScope op_scope("sgd.step", false);
  ++step_;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor& p = params_[i].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    expect_one_device("SGD", params_[i].first, p, g, {&buf_[i]});
    const float wd = decays(param_dim(i), opts_.decay_2d_only) ? static_cast<float>(opts_.weight_decay) : 0.0f;
    kernel(&Registry::sgd_update, p)(p.data<float>(), g.data<float>(), buf_[i].defined() ? buf_[i].data<float>() : nullptr, p.numel(),
                  static_cast<float>(lr_), static_cast<float>(opts_.momentum), static_cast<float>(opts_.dampening), wd,
                  opts_.nesterov, !has_buf_[i]);
    has_buf_[i] = true;
  }
}

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < params_.size(); ++i)
    if (buf_[i].defined()) out[params_[i].first + ".momentum_buffer"] = buf_[i];
  return out;
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& state, int64_t steps_taken) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!buf_[i].defined()) continue;
    load_named(state, params_[i].first + ".momentum_buffer", buf_[i]);
    has_buf_[i] = steps_taken > 0;
  }
  step_ = steps_taken;
}

double LRSchedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup);
  if (kind == Kind::Constant) return lr;
  const int64_t span = std::max<int64_t>(total - warmup, 1);
  const double progress = std::min(1.0, static_cast<double>(step - warmup) / static_cast<double>(span));
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

LRSchedule::Kind LRSchedule::parse(const std::string& name) {
  if (name == "constant") return Kind::Constant;
  if (name == "cosine") return Kind::Cosine;
  PT_THROW(InputError, "unknown --lr-schedule '", name, "' (expected constant or cosine)");
}

double grad_norm(const NamedParams& params) {
  std::vector<Tensor> grads;
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (g.defined()) grads.push_back(g.contiguous());
  }
  return std::sqrt(kernels::sum_of_squares(grads));  // one read-back, not one per tensor
}

double clip_grad_norm(const NamedParams& params, double max_norm, double norm) {
  if (max_norm <= 0.0 || norm <= max_norm) return norm;
  const float coef = static_cast<float>(max_norm / (norm + 1e-6));
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    PT_CHECK(g.is_contiguous(), "gradients are contiguous");
    kernel(&Registry::scale, g)(g.data<float>(), g.data<float>(), coef, g.numel());
  }
  return norm;
}

}  // namespace paratrain::optim
