// Module: a tree of layers owning parameters under stable dotted names.
//
// A parameter's name is its path in the tree ("h.0.attn.c_attn.weight"); names and order of
// registration never depend on anything but the model's configuration, so every rank and
// every run see the same list (data-parallel buckets and checkpoints rely on it).
// Parameters are leaf Tensors with requires_grad; state_dict() returns them (sharing
// storage) and load_state_dict() copies into them, checking names, shapes and dtypes.
// Not thread-safe: one thread builds and trains a module.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::nn {

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its children, depth first in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Drops every parameter's gradient (set_to_none) or zeroes it in place.
  void zero_grad(bool set_to_none = true);

  // Moves every parameter of this module and its children (and its .grad, when it has one)
  // to `device` in place, as torch's module.to(device): each parameter keeps its identity --
  // the Tensor handles layers, state_dict() results and optimizers hold share the moved
  // storage (Tensor::move_to_) -- and its values, requires_grad and name. A parameter already
  // there (a tied one moved through another name, or every one for to(cpu) of a CPU model)
  // is left as it is. Build optimizers after the move: their state is made on the
  // parameters' device then. Half copies in a WeightCastCache are remade on the new device
  // on their next use. Raw pointers to parameter memory taken before (buckets of data
  // parallelism, views made by fully sharded data parallelism) are stale afterwards, so a
  // model is moved before it is wrapped. A failure part-way (a GPU out of memory) leaves the
  // parameters moved so far on `device`; ops then refuse the mixed model until to() succeeds.
  void to(DeviceSpec device);

  // name -> parameter, sharing storage.
  std::map<std::string, Tensor> state_dict() const;
  // Copies `state` into the parameters. A missing name, an unexpected name (when strict), a
  // wrong shape or dtype throws InputError naming the tensor; nothing is changed then.
  // Names may carry `strip_prefix` (e.g. "transformer.").
  void load_state_dict(const std::map<std::string, Tensor>& state, bool strict = true,
                       const std::string& strip_prefix = "");

  // Puts `m` where the direct child `name` was (same place in the name tree, so its
  // parameters keep their dotted names): how a tensor-parallel plan swaps a layer for its
  // parallel version. The caller also updates any typed pointer the parent keeps to the
  // child. InputError when there is no such child.
  void replace_module(const std::string& name, std::shared_ptr<Module> m);
  // The direct child `name`; InputError when there is none.
  Module& child(const std::string& name) const;

  // Code that runs around this module's forward: fully sharded data parallelism gathers a
  // unit's parameters before it and frees them after (parallel/fsdp.h). A wrapper gets the
  // input and the body (the module's own forward, with any wrapper added earlier inside it)
  // and returns what the body returns, having called it once. The first wrapper added (the
  // innermost) gets the module's own forward as `body`, which stays valid as long as the
  // module and may be kept and called again later (recompute in backward does); the others
  // get the chain inside them, valid only during the call. Only modules whose forward
  // goes through wrapped_forward() honour wrappers (GPTBlock, GPT); add_forward_wrapper on
  // another module is an InputError, so a wrapper never silently does nothing.
  using ForwardBody = std::function<Tensor(const Tensor&)>;
  using ForwardWrapper = std::function<Tensor(const Tensor& x, const ForwardBody& body)>;
  void add_forward_wrapper(ForwardWrapper w);
  void clear_forward_wrappers() { wrappers_.clear(); }
  bool has_forward_wrappers() const { return !wrappers_.empty(); }
  virtual bool supports_forward_wrappers() const { return false; }

 protected:
  Tensor& register_parameter(const std::string& name, Tensor t);
  // body(x), run inside the wrappers (the last added outermost).
  Tensor wrapped_forward(const Tensor& x, const ForwardBody& body) const;
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    children_.emplace_back(name, m);
    return m;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;

  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::vector<ForwardWrapper> wrappers_;
};

}  // namespace paratrain::nn
