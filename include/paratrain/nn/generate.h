// Text generation with a GPT: picking the next token from a row of logits (greedy, or a
// draw at a temperature among the top-k), and the autoregressive loop around the model.
//
// Ranking: tokens are ranked by (logit, id), larger first, so equal logits go to the larger
// id; greedy takes the first of that ranking and top-k keeps its first k. A draw at
// temperature T > 0 picks token i with probability softmax(logits / T)_i over the kept
// tokens, using exactly one Generator::uniform_f64() per token (none when greedy), so the
// same seed and options give the same tokens, and `paratrain sample` prints what a program
// calling generate() with the same model, prompt and options gets.
//
// generate() runs the model without recording autograd (a NoGradGuard for the call) and in
// eval mode (no dropout); the model's previous train/eval mode is restored when it returns,
// also when it throws. It reads logits on the host (CPU models). No KV cache: each new token
// runs the model over the last block_size tokens (the context window slides once the
// sequence is longer than the model's block_size).
//
// Thread-safety: the functions keep no state; a call uses the model (which is not
// thread-safe, nn/module.h) and a Generator (not thread-safe, tensor/random.h), so two calls
// at once need distinct models and generators. Nothing of the arguments is kept after a call.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/random.h"

namespace paratrain::nn {

struct SamplingOptions {
  // 0 = greedy (the top-ranked token, no random draw); > 0 divides the logits before the
  // softmax (below 1 sharper, above 1 flatter). Negative or NaN is an InputError.
  double temperature = 1.0;
  // Draw among the k top-ranked tokens only; 0 (or k >= the row's length) = all of them.
  // Negative is an InputError. top_k 1 is greedy at any temperature.
  int64_t top_k = 0;
};

// The next token for one row of logits (length >= 1; an empty row is an InputError): an
// index into `logits`. Draws one number from `gen` when temperature > 0.
int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, Generator& gen);

struct GenerateOptions : SamplingOptions {
  // Tokens to append at most (>= 0).
  int64_t max_new_tokens = 100;
  // Generation ends (without appending it) when this token is picked.
  std::optional<int32_t> stop_token;
  // Pick only among ids [0, vocab_limit) -- e.g. a tokenizer smaller than the model's
  // vocabulary; 0 = the model's whole vocabulary. InputError when negative or larger
  // than the model's vocab_size.
  int64_t vocab_limit = 0;
  // Seed of the Generator the overload without one draws from.
  uint64_t seed = 0;
};

// Continues `prompt` (token ids, at least one, each in [0, vocab_size)) and returns the
// prompt followed by the new tokens (at most max_new_tokens; the stop token is not
// included). Each step runs the model on the last min(length, block_size) tokens and picks
// from the logits of the last position. InputError for bad options or prompt ids.
std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              Generator& gen);
// The same, drawing from Generator(options.seed).
std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& options);

}  // namespace paratrain::nn
