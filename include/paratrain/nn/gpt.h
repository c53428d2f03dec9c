// GPT: the GPT-2 architecture with Hugging Face GPT-2 parameter names and shapes.
//
//   wte.weight [V,C], wpe.weight [T,C],
//   h.{i}.ln_1.{weight,bias} [C], h.{i}.attn.c_attn.weight [C,3C] .bias [3C],
//   h.{i}.attn.c_proj.weight [C,C] .bias [C], h.{i}.ln_2.{weight,bias} [C],
//   h.{i}.mlp.c_fc.weight [C,4C] .bias [4C], h.{i}.mlp.c_proj.weight [4C,C] .bias [C],
//   ln_f.{weight,bias} [C]; the LM head is tied to wte (logits = x @ wte^T).
// Pre-LayerNorm blocks (eps 1e-5), GELU in its tanh form, causal attention scaled by
// 1/sqrt(C/n_head), loss = mean cross-entropy over all B*T positions.
//
// Lifetimes and ownership: a GPT owns its blocks and their parameters (shared_ptr children,
// nn/module.h) and the Generator its dropout layers draw from, so the model must outlive any
// Dropout reference taken from it. Tensors a forward returns keep the graph of that forward
// (and what it saved) alive until they are released or backward runs.
// Thread-safety: not thread-safe: one thread builds, trains or runs a model at a time (its
// forward wrappers, dropout generator and recompute state are shared). Text generation:
// nn/generate.h.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "paratrain/nn/layers.h"

namespace paratrain::nn {

// What a forward recomputes in backward instead of keeping (recompute_blocks below).
enum class RecomputeMode { None, Full, Selective };

struct GPTConfig {
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t n_embd = 64;
  int64_t block_size = 64;
  int64_t vocab_size = 256;
  float dropout = 0.0f;

  // "gpt-nano", "gpt-mini", "gpt2-124m"; InputError for other names.
  static GPTConfig preset(const std::string& name);
  // InputError when a size is not positive or n_embd % n_head != 0.
  void validate() const;
  // Training FLOPs per token: 6N + 12 * n_layer * n_embd * block_size, N = parameters
  // without wpe (the PaLM / nanoGPT estimate; bench/torch_gpt_train.py uses the same).
  double flops_per_token() const;
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& cfg, Generator& gen);
  // (B,T,C) -> (B,T,C): c_proj(core(c_attn(x))), the core under autograd::checkpoint when
  // recompute_core() was called.
  Tensor forward(const Tensor& x) const;
  // The core attention, between c_attn's output and c_proj's input: qkv (B,T,3C') ->
  // (B,T,C'), C' = C, or C / tp after a tensor-parallel plan; the fused kernel
  // ops::causal_self_attention over n_head heads (scores, causal mask, softmax, the sum over
  // v). It has no parameters and draws no random numbers (this GPT has no dropout on the
  // attention weights, only on the residual branches). It reads n_head and nothing of
  // c_attn / c_proj, so it stays right when a plan replaces the projections.
  Tensor core(const Tensor& qkv) const;
  // --recompute selective: from now on forward runs the core under autograd::checkpoint
  // (`gen` replayed, though the core draws nothing): its forward keeps only its input qkv --
  // which c_attn's output is anyway -- and it is recomputed when backward reaches it.
  void recompute_core(Generator* gen);
  bool recomputes_core() const { return recompute_core_; }
  std::shared_ptr<Linear> c_attn, c_proj;
  // Heads this module computes: n_head, or n_head / tp after a tensor-parallel plan gave
  // c_attn whole heads of q, k and v only.
  int64_t n_head;

 private:
  bool recompute_core_ = false;
  Generator* core_gen_ = nullptr;
};

class GPTMLP : public Module {
 public:
  GPTMLP(const GPTConfig& cfg, Generator& gen);
  Tensor forward(const Tensor& x) const;
  std::shared_ptr<Linear> c_fc, c_proj;  // forward: c_proj(gelu(c_fc(x))), the gelu fused into c_fc
};

class GPTBlock : public Module {
 public:
  GPTBlock(const GPTConfig& cfg, Generator& gen);
  // Runs the block inside its forward wrappers (Module::add_forward_wrapper).
  Tensor forward(const Tensor& x) const;
  bool supports_forward_wrappers() const override { return true; }
  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<CausalSelfAttention> attn;
  std::shared_ptr<GPTMLP> mlp;
  std::shared_ptr<Dropout> drop;

 private:
  Tensor body(const Tensor& x) const;
};

class GPT : public Module {
 public:
  // Initialised as GPT-2: N(0, 0.02) weights, c_proj weights N(0, 0.02/sqrt(2*n_layer)),
  // zero biases, LayerNorm weight 1 and bias 0; all draws from Generator(seed).
  GPT(const GPTConfig& cfg, uint64_t seed);
  const GPTConfig& config() const { return cfg_; }

  // tokens (B,T) i32 -> logits (B,T,V)
  Tensor forward(const Tensor& tokens) const;
  // Mean cross-entropy of next-token prediction; targets (B,T) i32 (-1 ignored).
  Tensor loss(const Tensor& tokens, const Tensor& targets) const;
  // The final hidden states (B,T,C), before the LM head.
  Tensor hidden(const Tensor& tokens) const;
  // One pipeline stage's part of the forward: blocks [first_block, end_block) applied to x.
  // The first stage (first_block 0) takes token ids (B,T) and embeds them; the others take
  // the hidden states (B,T,C) the stage before produced. The last stage (end_block ==
  // n_layer) ends with ln_f and the tied head: logits (B,T,V), or the mean loss when
  // `targets` is given; the others return hidden states. Chaining the stages computes
  // exactly forward() / loss() (the same ops in the same order). Forward wrappers of the
  // model are not run (those of the blocks are). InputError for an empty or out-of-range
  // block range.
  Tensor stage_forward(const Tensor& x, int64_t first_block, int64_t end_block, const Tensor& targets = Tensor()) const;
  // forward, loss and hidden each run inside the model's forward wrappers (the wrapper's
  // input is the token tensor).
  bool supports_forward_wrappers() const override { return true; }
  // The generator dropout draws its masks from (its state goes into training checkpoints).
  Generator& generator() { return gen_; }
  // What recompute_blocks set up on this model (None until it runs).
  RecomputeMode recompute_mode() const { return recompute_; }

  std::shared_ptr<Embedding> wte, wpe;
  std::vector<std::shared_ptr<GPTBlock>> h;
  std::shared_ptr<LayerNorm> ln_f;

 private:
  Tensor hidden_states(const Tensor& tokens) const;
  friend void recompute_blocks(GPT& model, RecomputeMode mode);
  GPTConfig cfg_;
  Generator gen_;
  RecomputeMode recompute_ = RecomputeMode::None;
};

// Activation recomputation (--recompute none|full|selective). Gradients and losses are bit
// for bit those without it in every mode (dropout and autocast included: the model's dropout
// generator is replayed and the forward's autocast mode re-entered, autograd/checkpoint.h).
//
// Full: each block's activations are recomputed in backward instead of kept
// (autograd::checkpoint around every block), so a forward keeps only each block's input;
// about one more forward per step. Adds the blocks' first (innermost) forward wrapper: call
// it before anything else wraps the blocks (fully sharded data parallelism's wrappers go
// outside it). InputError when a block already has wrappers.
//
// Selective (Korthikanti et al. 2022, Megatron-LM's selective activation recomputation): only
// each block's core attention (CausalSelfAttention::core, between c_attn's output and c_proj's
// input) is recomputed; the layernorms', linears', GELU's and dropouts' saved activations are
// kept. Adds no block wrapper (any wrappers may come before or after it), and it works after a
// tensor-parallel plan replaced the projections (and before: the core reads the module's
// n_head when it runs). What it saves depends on the attention kernel: ours is fused and keeps
// no T x T matrix -- it saves qkv (c_attn's output, kept anyway), its output (c_proj's input,
// kept anyway) and the row log-sum-exp (B, n_head, T) f32 -- so selective drops only the
// log-sum-exp, 4 * B * n_head * T bytes per block, and costs one attention forward per block
// in backward. (With an unfused attention it would drop the (B, n_head, T, T) scores,
// softmax and attention-dropout mask, which is what the method was made for.)
//
// None does nothing. InputError when recompute_blocks already ran on the model (with any mode
// but None).
void recompute_blocks(GPT& model, RecomputeMode mode = RecomputeMode::Full);
// "none", "full", "selective" <-> RecomputeMode; InputError naming the value for another name.
RecomputeMode recompute_mode_from_name(const std::string& name);
const char* recompute_mode_name(RecomputeMode mode);

}  // namespace paratrain::nn
