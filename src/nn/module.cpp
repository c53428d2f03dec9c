#include "paratrain/nn/module.h"

#include <set>

namespace paratrain::nn {

Tensor& Module::register_parameter(const std::string& name, Tensor t) {
  t.set_requires_grad(true);
  params_.emplace_back(name, t);
  return params_.back().second;
}

void Module::collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [name, t] : params_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", out);
  for (auto& [name, t] : out)
    if (t.name().empty()) t.set_name(name);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::zero_grad(bool set_to_none) {
  for (auto& [name, t] : named_parameters()) {
    if (set_to_none)
      t.set_grad(Tensor());
    else if (t.grad().defined())
      t.grad().zero_();
  }
}

void Module::to(DeviceSpec device) {
  for (auto& [name, t] : named_parameters()) {
    t.move_to_(device);
    Tensor g = t.grad();
    if (g.defined()) g.move_to_(device);  // g shares the storage of the .grad autograd keeps
  }
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : named_parameters()) out[name] = t.detach();
  return out;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state_in, bool strict,
                             const std::string& strip_prefix) {
  std::map<std::string, Tensor> state;
  for (const auto& [name, t] : state_in) {
    std::string n = name;
    if (!strip_prefix.empty() && n.rfind(strip_prefix, 0) == 0) n = n.substr(strip_prefix.size());
    state[n] = t;
  }
  auto params = named_parameters();
  // Validate everything before changing anything.
  std::set<std::string> expected;
  for (auto& [name, p] : params) {
    expected.insert(name);
    auto it = state.find(name);
    if (it == state.end()) PT_THROW(InputError, "missing tensor '", name, "' (expected shape ", shape_str(p.shape()), ")");
    if (it->second.shape() != p.shape())
      PT_THROW(InputError, "tensor '", name, "' has shape ", shape_str(it->second.shape()), ", expected ",
               shape_str(p.shape()));
    if (!dtype_is_float(it->second.dtype()))
      PT_THROW(InputError, "tensor '", name, "' has dtype ", dtype_name(it->second.dtype()), ", expected a float type");
  }
  if (strict)
    for (const auto& [name, t] : state)
      if (!expected.count(name)) PT_THROW(InputError, "unexpected tensor '", name, "' for this model");
  for (auto& [name, p] : params) {
    Tensor dst = p.detach();
    dst.copy_(state.at(name));
  }
}

void Module::replace_module(const std::string& name, std::shared_ptr<Module> m) {
  for (auto& [n, child] : children_)
    if (n == name) {
      child = std::move(m);
      return;
    }
  PT_THROW(InputError, "replace_module: no child module named '", name, "'");
}

Module& Module::child(const std::string& name) const {
  for (const auto& [n, c] : children_)
    if (n == name) return *c;
  PT_THROW(InputError, "no child module named '", name, "'");
}

void Module::add_forward_wrapper(ForwardWrapper w) {
  if (!supports_forward_wrappers())
    PT_THROW(InputError, "add_forward_wrapper: this module's forward does not run wrappers (only GPTBlock and GPT do)");
  wrappers_.push_back(std::move(w));
}

Tensor Module::wrapped_forward(const Tensor& x, const ForwardBody& body) const {
  if (wrappers_.empty()) return body(x);
  // wrappers_[0] sits right around the body and gets `body` itself (which it may keep, e.g.
  // to run it again in backward); the others get the chain inside them, valid during the call.
  std::function<Tensor(size_t, const Tensor&)> run = [&](size_t depth, const Tensor& in) -> Tensor {
    if (depth == 0) return body(in);
    if (depth == 1) return wrappers_[0](in, body);
    return wrappers_[depth - 1](in, [&](const Tensor& y) { return run(depth - 1, y); });
  };
  return run(wrappers_.size(), x);
}

}  // namespace paratrain::nn
