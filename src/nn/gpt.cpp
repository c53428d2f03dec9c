#include "paratrain/nn/gpt.h"

#include "paratrain/autograd/checkpoint.h"

#include <cmath>
#include <optional>
#include <string>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/trace.h"

namespace paratrain::nn {

namespace {
// One part of the model's forward when tracing (base/trace.h): a span "forward <part>" (part
// "embedding", "block <index>", "ln_f", "head"), and the part as the scope label of the autograd
// nodes recorded meanwhile, so the backward shows "backward <part>". Nothing when off.
class ForwardPart {
 public:
  explicit ForwardPart(const char* part, int64_t index = -1) {
    if (!trace::enabled()) return;
    const char* label = index < 0 ? part : trace::intern(std::string(part) + " " + std::to_string(index));
    label_.emplace(label);
    span_.emplace(std::string("forward ") + label, "forward", true);
  }

 private:
  std::optional<trace::LabelScope> label_;
  std::optional<trace::Span> span_;  // closed before the label is restored
};
}  // namespace

GPTConfig GPTConfig::preset(const std::string& name) {
  GPTConfig c;
  if (name == "gpt-nano") {
    c = {2, 2, 64, 64, 256, 0.0f};
  } else if (name == "gpt-mini") {
    c = {6, 6, 384, 256, 4096, 0.0f};
  } else if (name == "gpt2-124m") {
    c = {12, 12, 768, 1024, 50257, 0.0f};
  } else if (name == "gpt") {
    c = {2, 2, 64, 64, 256, 0.0f};
  } else {
    PT_THROW(InputError, "unknown GPT preset '", name, "' (expected gpt-nano, gpt-mini, gpt2-124m or gpt)");
  }
  return c;
}

void GPTConfig::validate() const {
  if (n_layer <= 0 || n_head <= 0 || n_embd <= 0 || block_size <= 0 || vocab_size <= 0)
    PT_THROW(InputError, "GPT sizes must be positive (n_layer ", n_layer, ", n_head ", n_head, ", n_embd ", n_embd,
             ", block_size ", block_size, ", vocab_size ", vocab_size, ")");
  if (n_embd % n_head != 0) PT_THROW(InputError, "--n-embd ", n_embd, " is not divisible by --n-head ", n_head);
  if (vocab_size > 65536) PT_THROW(InputError, "--vocab-size ", vocab_size, " exceeds 65536 (tokens are stored as uint16)");
  if (dropout < 0.0f || dropout >= 1.0f) PT_THROW(InputError, "--dropout ", dropout, " is outside [0, 1)");
}

double GPTConfig::flops_per_token() const {
  // 6N + 12 L C T (the PaLM / nanoGPT estimate), N = every parameter except wpe (the tied LM
  // head is counted once, through wte). bench/torch_gpt_train.py uses the same formula.
  const double C = static_cast<double>(n_embd), L = static_cast<double>(n_layer);
  const double n = static_cast<double>(vocab_size) * C + L * (12.0 * C * C + 13.0 * C) + 2.0 * C;
  return 6.0 * n + 12.0 * L * C * static_cast<double>(block_size);
}

namespace {
void init_gpt_linear(Linear& l, Generator& gen, float std) {
  fill_normal(l.weight, gen, 0.0f, std);
  if (l.bias.defined()) l.bias.zero_();
}
}  // namespace

CausalSelfAttention::CausalSelfAttention(const GPTConfig& cfg, Generator& gen) : n_head(cfg.n_head) {
  const int64_t C = cfg.n_embd;
  c_attn = register_module("c_attn", std::make_shared<Linear>(C, 3 * C, true, WeightLayout::InOut, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(C, C, true, WeightLayout::InOut, gen));
}

Tensor CausalSelfAttention::forward(const Tensor& x) const {
  const Tensor qkv = c_attn->forward(x);
  const Tensor y = recompute_core_
                       ? autograd::checkpoint([this](const Tensor& in) { return core(in); }, qkv, core_gen_)
                       : core(qkv);
  return c_proj->forward(y);
}

Tensor CausalSelfAttention::core(const Tensor& qkv) const { return ops::causal_self_attention(qkv, n_head); }

void CausalSelfAttention::recompute_core(Generator* gen) {
  recompute_core_ = true;
  core_gen_ = gen;
}

GPTMLP::GPTMLP(const GPTConfig& cfg, Generator& gen) {
  const int64_t C = cfg.n_embd;
  c_fc = register_module("c_fc", std::make_shared<Linear>(C, 4 * C, true, WeightLayout::InOut, gen));
  c_proj = register_module("c_proj", std::make_shared<Linear>(4 * C, C, true, WeightLayout::InOut, gen));
}

Tensor GPTMLP::forward(const Tensor& x) const { return c_proj->forward(c_fc->forward_gelu(x)); }

GPTBlock::GPTBlock(const GPTConfig& cfg, Generator& gen) {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(cfg.n_embd));
  attn = register_module("attn", std::make_shared<CausalSelfAttention>(cfg, gen));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(cfg.n_embd));
  mlp = register_module("mlp", std::make_shared<GPTMLP>(cfg, gen));
  drop = register_module("drop", std::make_shared<Dropout>(cfg.dropout, gen));
}

Tensor GPTBlock::forward(const Tensor& x) const {
  return wrapped_forward(x, [this](const Tensor& in) { return body(in); });
}

Tensor GPTBlock::body(const Tensor& x) const {
  Tensor a = attn->forward(ln_1->forward(x));
  Tensor x1 = ops::add(x, drop->forward(a));
  Tensor m = mlp->forward(ln_2->forward(x1));
  return ops::add(x1, drop->forward(m));
}

namespace {
// "h" in the parameter names is a container module with children "0", "1", ...
class ModuleList : public Module {
 public:
  template <typename M>
  void add(std::shared_ptr<M> m) {
    register_module(std::to_string(count_++), m);
  }

 private:
  int count_ = 0;
};
}  // namespace

GPT::GPT(const GPTConfig& cfg, uint64_t seed) : cfg_(cfg), gen_(seed) {
  cfg_.validate();
  const float std = 0.02f;
  const float proj_std = 0.02f / std::sqrt(2.0f * static_cast<float>(cfg.n_layer));
  wte = register_module("wte", std::make_shared<Embedding>(cfg.vocab_size, cfg.n_embd, gen_, std));
  wpe = register_module("wpe", std::make_shared<Embedding>(cfg.block_size, cfg.n_embd, gen_, std));
  auto list = register_module("h", std::make_shared<ModuleList>());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto block = std::make_shared<GPTBlock>(cfg_, gen_);
    init_gpt_linear(*block->attn->c_attn, gen_, std);
    init_gpt_linear(*block->attn->c_proj, gen_, proj_std);
    init_gpt_linear(*block->mlp->c_fc, gen_, std);
    init_gpt_linear(*block->mlp->c_proj, gen_, proj_std);
    list->add(block);
    h.push_back(block);
  }
  ln_f = register_module("ln_f", std::make_shared<LayerNorm>(cfg.n_embd));
}

Tensor GPT::hidden(const Tensor& tokens) const {
  return wrapped_forward(tokens, [this](const Tensor& t) { return hidden_states(t); });
}

Tensor GPT::hidden_states(const Tensor& tokens) const {
  if (tokens.dim() != 2) PT_THROW(InputError, "GPT input must be (B,T) token ids, got ", shape_str(tokens.shape()));
  if (tokens.size(1) > cfg_.block_size)
    PT_THROW(InputError, "sequence length ", tokens.size(1), " exceeds the block size ", cfg_.block_size);
  Tensor x;
  {
    ForwardPart part("embedding");
    x = wte->forward_with_positions(tokens, *wpe);
  }
  for (size_t i = 0; i < h.size(); ++i) {
    ForwardPart part("block", static_cast<int64_t>(i));
    x = h[i]->forward(x);
  }
  ForwardPart part("ln_f");
  return ln_f->forward(x);
}

Tensor GPT::stage_forward(const Tensor& x, int64_t first_block, int64_t end_block, const Tensor& targets) const {
  const int64_t L = static_cast<int64_t>(h.size());
  if (first_block < 0 || end_block > L || first_block >= end_block)
    PT_THROW(InputError, "GPT stage: blocks [", first_block, ", ", end_block, ") are not a non-empty range of the ", L,
             " blocks");
  Tensor out = x;
  if (first_block == 0) {
    if (x.dim() != 2) PT_THROW(InputError, "GPT first stage input must be (B,T) token ids, got ", shape_str(x.shape()));
    if (x.size(1) > cfg_.block_size)
      PT_THROW(InputError, "sequence length ", x.size(1), " exceeds the block size ", cfg_.block_size);
    ForwardPart part("embedding");
    out = wte->forward_with_positions(x, *wpe);
  } else if (x.dim() != 3 || x.size(2) != cfg_.n_embd) {
    PT_THROW(InputError, "GPT stage input must be (B,T,", cfg_.n_embd, ") hidden states, got ", shape_str(x.shape()));
  }
  for (int64_t i = first_block; i < end_block; ++i) {
    ForwardPart part("block", i);
    out = h[static_cast<size_t>(i)]->forward(out);
  }
  if (end_block < L) return out;
  {
    ForwardPart part("ln_f");
    out = ln_f->forward(out);
  }
  ForwardPart part("head");
  return targets.defined() ? wte->tied_loss(out, targets) : wte->tied_logits(out);
}

void recompute_blocks(GPT& model, RecomputeMode mode) {
  if (mode == RecomputeMode::None) return;
  if (model.recompute_ != RecomputeMode::None)
    PT_THROW(InputError, "recompute_blocks: the model already recomputes (", recompute_mode_name(model.recompute_),
             "); it runs once per model");
  Generator* gen = &model.generator();
  if (mode == RecomputeMode::Full) {
    for (auto& block : model.h)
      if (block->has_forward_wrappers())
        PT_THROW(InputError, "recompute_blocks: a block already has forward wrappers; recompute must be the innermost");
    for (auto& block : model.h)
      block->add_forward_wrapper([gen](const Tensor& x, const Module::ForwardBody& body) {
        return autograd::checkpoint(body, x, gen);
      });
  } else {
    for (auto& block : model.h) block->attn->recompute_core(gen);
  }
  model.recompute_ = mode;
}

RecomputeMode recompute_mode_from_name(const std::string& name) {
  if (name == "none") return RecomputeMode::None;
  if (name == "full") return RecomputeMode::Full;
  if (name == "selective") return RecomputeMode::Selective;
  PT_THROW(InputError, "--recompute '", name, "' is not one of none, full, selective");
}

const char* recompute_mode_name(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::None: return "none";
    case RecomputeMode::Full: return "full";
    case RecomputeMode::Selective: return "selective";
  }
  return "none";
}

Tensor GPT::forward(const Tensor& tokens) const {
  return wrapped_forward(tokens, [this](const Tensor& t) {
    Tensor hidden = hidden_states(t);
    ForwardPart part("head");
    return wte->tied_logits(hidden);
  });
}

Tensor GPT::loss(const Tensor& tokens, const Tensor& targets) const {
  return wrapped_forward(tokens, [&](const Tensor& t) {
    Tensor hidden = hidden_states(t);
    ForwardPart part("head");
    return wte->tied_loss(hidden, targets);
  });
}

}  // namespace paratrain::nn
