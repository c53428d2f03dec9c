#include "paratrain/parallel/tensor_parallel/gpt_plan.h"

#include "paratrain/base/error.h"
#include "paratrain/parallel/tensor_parallel/layers.h"

namespace paratrain::parallel {

void check_tensor_parallel_layout(const nn::GPTConfig& cfg, int tp, bool sequence_parallel) {
  if (tp <= 1) return;
  if (cfg.n_head % tp != 0)
    PT_THROW(InputError, "--tp ", tp, " does not divide the ", cfg.n_head,
             " attention heads (--n-head): each tensor-parallel rank computes whole heads");
  if (cfg.n_embd % tp != 0)
    PT_THROW(InputError, "--tp ", tp, " does not divide the width --n-embd ", cfg.n_embd);
  if (sequence_parallel && cfg.block_size % tp != 0)
    PT_THROW(InputError, "--sequence-parallel: --tp ", tp, " does not divide the sequence length --block-size ",
             cfg.block_size);
}

checkpoint::TensorCut TensorParallelPlan::cut_of(const std::string& key) const {
  if (auto it = cuts_.find(key); it != cuts_.end()) return it->second;
  if (const auto dot = key.rfind('.'); dot != std::string::npos)
    if (auto it = cuts_.find(key.substr(0, dot)); it != cuts_.end()) return it->second;
  return {};
}

std::map<std::string, Tensor> TensorParallelPlan::gather_whole(const std::map<std::string, Tensor>& local) const {
  std::map<std::string, Tensor> whole;
  const int n = size();
  for (const auto& [key, t] : local) {  // std::map: the same order on every rank
    const checkpoint::TensorCut cut = cut_of(key);
    if (cut.replicated() || n == 1) {
      whole[key] = t;
      continue;
    }
    // Gathered on the part's device, joined on the host (the whole tensor goes to a file or
    // to a whole model: host memory; a part on a GPU comes back once, all parts together).
    const Tensor part = t.contiguous();
    Tensor all = part.new_empty({n * part.numel()});
    tp_->allgather(part, all);
    const Tensor host = all.to(DeviceSpec{});
    std::vector<Tensor> parts;
    for (int i = 0; i < n; ++i) parts.push_back(host.narrow(0, i * part.numel(), part.numel()).reshape(part.shape()));
    whole[key] = checkpoint::join_tensor(parts, cut);
  }
  return whole;
}

std::map<std::string, Tensor> TensorParallelPlan::cut_local(const std::map<std::string, Tensor>& whole) const {
  std::map<std::string, Tensor> local;
  for (const auto& [key, t] : whole) {
    const checkpoint::TensorCut cut = cut_of(key);
    // Cut on the host (a whole tensor on a GPU is copied down once); the part on the host.
    local[key] = cut.replicated() || size() == 1 ? t : checkpoint::cut_tensor(t.to(DeviceSpec{}), cut, tp_->rank(), size());
  }
  return local;
}

TensorParallelPlan parallelize_gpt(nn::GPT& model, std::shared_ptr<comm::ProcessGroup> pg,
                                   const TensorParallelOptions& options) {
  if (!pg || pg->size() == 1) return {};
  const int n = pg->size();
  check_tensor_parallel_layout(model.config(), n, options.sequence_parallel);
  auto tp = std::make_shared<TpGroup>(pg);
  const bool sp = options.sequence_parallel;
  std::map<std::string, checkpoint::TensorCut> cuts;

  auto wte = std::make_shared<VocabParallelEmbedding>(*model.wte, tp, sp);
  cuts["wte.weight"] = wte->weight_cut();
  model.wte = wte;
  model.replace_module("wte", wte);

  for (size_t i = 0; i < model.h.size(); ++i) {
    nn::GPTBlock& block = *model.h[i];
    const std::string p = "h." + std::to_string(i) + ".";
    auto c_attn = std::make_shared<ColumnParallelLinear>(*block.attn->c_attn, 3, tp, sp);
    auto attn_proj = std::make_shared<RowParallelLinear>(*block.attn->c_proj, tp, sp);
    auto c_fc = std::make_shared<ColumnParallelLinear>(*block.mlp->c_fc, 1, tp, sp);
    auto mlp_proj = std::make_shared<RowParallelLinear>(*block.mlp->c_proj, tp, sp);
    cuts[p + "attn.c_attn.weight"] = c_attn->weight_cut();
    cuts[p + "attn.c_attn.bias"] = c_attn->bias_cut();
    cuts[p + "attn.c_proj.weight"] = attn_proj->weight_cut();
    cuts[p + "mlp.c_fc.weight"] = c_fc->weight_cut();
    cuts[p + "mlp.c_fc.bias"] = c_fc->bias_cut();
    cuts[p + "mlp.c_proj.weight"] = mlp_proj->weight_cut();
    block.attn->c_attn = c_attn, block.attn->replace_module("c_attn", c_attn);
    block.attn->c_proj = attn_proj, block.attn->replace_module("c_proj", attn_proj);
    block.mlp->c_fc = c_fc, block.mlp->replace_module("c_fc", c_fc);
    block.mlp->c_proj = mlp_proj, block.mlp->replace_module("c_proj", mlp_proj);
    block.attn->n_head = model.config().n_head / n;
    if (sp) {
      auto ln_1 = std::make_shared<SequenceParallelLayerNorm>(*block.ln_1, tp);
      auto ln_2 = std::make_shared<SequenceParallelLayerNorm>(*block.ln_2, tp);
      auto drop = std::make_shared<SequenceParallelDropout>(*block.drop, tp);
      block.ln_1 = ln_1, block.replace_module("ln_1", ln_1);
      block.ln_2 = ln_2, block.replace_module("ln_2", ln_2);
      block.drop = drop, block.replace_module("drop", drop);
    }
  }
  if (sp) {
    auto ln_f = std::make_shared<SequenceParallelLayerNorm>(*model.ln_f, tp);
    model.ln_f = ln_f;
    model.replace_module("ln_f", ln_f);
  }
  if (!model.is_training()) model.eval();
  return TensorParallelPlan(tp, std::move(cuts));
}

}  // namespace paratrain::parallel
