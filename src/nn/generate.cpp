#include "paratrain/nn/generate.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "paratrain/autograd/engine.h"

namespace paratrain::nn {

namespace {

void check_sampling(const SamplingOptions& o) {
  if (!(o.temperature >= 0))
    PT_THROW(InputError, "sampling temperature must be >= 0 (0 = greedy), got ", o.temperature);
  if (o.top_k < 0) PT_THROW(InputError, "sampling top_k must be >= 0 (0 = all tokens), got ", o.top_k);
}

int32_t pick(std::span<const float> logits, const SamplingOptions& o, Generator& gen) {
  std::vector<std::pair<float, int32_t>> cand;
  cand.reserve(logits.size());
  for (size_t v = 0; v < logits.size(); ++v) cand.push_back({logits[v], static_cast<int32_t>(v)});
  if (o.temperature == 0) return std::max_element(cand.begin(), cand.end())->second;
  if (o.top_k > 0 && o.top_k < static_cast<int64_t>(cand.size())) {
    std::partial_sort(cand.begin(), cand.begin() + o.top_k, cand.end(), std::greater<>());
    cand.resize(static_cast<size_t>(o.top_k));
  }
  // softmax(l / T) up to its normaliser, then one uniform draw walked through the masses.
  float mx = -INFINITY;
  for (const auto& c : cand) mx = std::max(mx, c.first);
  double total = 0;
  std::vector<double> p;
  p.reserve(cand.size());
  for (const auto& c : cand) p.push_back(std::exp((c.first - mx) / o.temperature)), total += p.back();
  double r = gen.uniform_f64() * total;
  size_t j = 0;
  while (j + 1 < p.size() && r >= p[j]) r -= p[j++];
  return cand[j].second;
}

// model.eval() for a scope; the previous mode comes back when the scope ends.
class EvalScope {
 public:
  explicit EvalScope(GPT& m) : m_(m), was_training_(m.is_training()) { m_.eval(); }
  ~EvalScope() { m_.train(was_training_); }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  GPT& m_;
  bool was_training_;
};

}  // namespace

int32_t sample_token(std::span<const float> logits, const SamplingOptions& options, Generator& gen) {
  check_sampling(options);
  if (logits.empty()) PT_THROW(InputError, "sample_token: the logits row is empty");
  return pick(logits, options, gen);
}

std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& options,
                              Generator& gen) {
  const GPTConfig& cfg = model.config();
  check_sampling(options);
  if (options.max_new_tokens < 0)
    PT_THROW(InputError, "GenerateOptions::max_new_tokens must be >= 0, got ", options.max_new_tokens);
  if (options.vocab_limit < 0 || options.vocab_limit > cfg.vocab_size)
    PT_THROW(InputError, "GenerateOptions::vocab_limit must be in [0, ", cfg.vocab_size,
             "] (0 = the model's vocabulary), got ", options.vocab_limit);
  if (prompt.empty()) PT_THROW(InputError, "generate: the prompt is empty (it needs at least one token, e.g. a BOS id)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= cfg.vocab_size)
      PT_THROW(InputError, "generate: prompt token ", i, " is ", prompt[i], ", outside the model's vocabulary [0, ",
               cfg.vocab_size, ")");
  const int64_t V = cfg.vocab_size;
  const size_t limit = static_cast<size_t>(options.vocab_limit > 0 ? options.vocab_limit : V);

  autograd::NoGradGuard no_grad;
  EvalScope eval(model);
  std::vector<int32_t> ids = prompt;
  std::vector<float> row_copy;
  // The window goes to the model's device; a GPU's last row of logits comes back to the host
  // (to_vector waits for it): one small copy each way per token.
  const DeviceSpec device = model.wte->weight.device_spec();
  for (int64_t i = 0; i < options.max_new_tokens; ++i) {
    const int64_t T = std::min<int64_t>(static_cast<int64_t>(ids.size()), cfg.block_size);
    std::vector<int32_t> window(ids.end() - T, ids.end());
    Tensor logits = model.forward(Tensor::from_vector_i32(window, {1, T}).to(device));
    PT_CHECK(logits.dim() == 3 && logits.size(0) == 1 && logits.size(1) == T && logits.size(2) == V,
             "GPT logits have shape ", logits.to_string());
    Tensor row = logits.select(0, 0).select(0, T - 1);
    std::span<const float> last;
    if (!row.is_cuda() && row.dtype() == DType::F32 && row.is_contiguous()) {
      last = std::span<const float>(row.data<float>(), static_cast<size_t>(V));
    } else {
      row_copy = row.to_vector();
      last = row_copy;
    }
    const int32_t next = pick(last.first(limit), options, gen);
    if (options.stop_token && next == *options.stop_token) break;
    ids.push_back(next);
  }
  return ids;
}

std::vector<int32_t> generate(GPT& model, const std::vector<int32_t>& prompt, const GenerateOptions& options) {
  Generator gen(options.seed);
  return generate(model, prompt, options, gen);
}

}  // namespace paratrain::nn
