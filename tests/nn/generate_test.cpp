// nn::sample_token and nn::generate: greedy is the argmax; top_k 1 is greedy at any
// temperature; top-k never picks outside the k most likely; draws at temperature T follow
// softmax(logits / T) (chi-square against the exact probabilities); seeds reproduce; the stop
// token ends generation; the context window slides past block_size (each token is the argmax
// of the model over the last block_size tokens, recomputed here); the model's train mode and
// grad mode are restored; bad options are InputErrors. (Against PyTorch:
// tests/parity/torch_generate_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/generate.h"

using namespace paratrain;

namespace {

std::vector<float> random_row(int n, uint64_t seed, float scale = 3.0f) {
  Generator g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(g.normal()) * scale;
  return v;
}

int32_t argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// A small GPT whose logits are well separated (weights N(0, 0.5)), so greedy picks are clear.
nn::GPTConfig small_cfg(int64_t block = 8, float dropout = 0.0f) { return nn::GPTConfig{2, 2, 32, block, 48, dropout}; }

void spread_weights(nn::GPT& m, uint64_t seed) {
  Generator g(seed);
  for (auto& [name, p] : m.named_parameters()) {
    if (name.find("ln") != std::string::npos) continue;
    Tensor d = p.detach();
    fill_normal(d, g, 0.0f, 0.5f);
  }
}

// The model's logits at the last position of `window`, recomputed outside generate().
std::vector<float> last_logits(nn::GPT& m, const std::vector<int32_t>& window) {
  autograd::NoGradGuard ng;
  const int64_t T = static_cast<int64_t>(window.size());
  Tensor l = m.forward(Tensor::from_vector_i32(window, {1, T}));
  return l.select(0, 0).select(0, T - 1).to_vector();
}

}  // namespace

TEST(SampleToken, TemperatureZeroIsArgmax) {
  Generator gen(1);
  for (uint64_t s = 0; s < 50; ++s) {
    auto row = random_row(37, s);
    const auto before = gen.state();
    EXPECT_EQ(nn::sample_token(row, {0.0, 0}, gen), argmax(row));
    EXPECT_EQ(nn::sample_token(row, {0.0, 5}, gen), argmax(row));
    EXPECT_EQ(gen.state(), before) << "greedy draws no random number";
  }
  // Equal logits go to the larger id (the documented ranking by (logit, id)).
  std::vector<float> tie = {1.0f, 3.0f, 2.0f, 3.0f, 0.0f};
  EXPECT_EQ(nn::sample_token(tie, {0.0, 0}, gen), 3);
}

TEST(SampleToken, TopKOneIsGreedyAtAnyTemperature) {
  Generator gen(2);
  for (double t : {1e-3, 0.5, 1.0, 7.0, 1e6})
    for (uint64_t s = 0; s < 20; ++s) {
      auto row = random_row(64, 100 + s);
      EXPECT_EQ(nn::sample_token(row, {t, 1}, gen), argmax(row)) << "temperature " << t;
    }
}

TEST(SampleToken, TopKDrawsOnlyTheKMostLikely) {
  auto row = random_row(30, 7, 1.0f);
  std::vector<int32_t> order(row.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
  Generator gen(3);
  for (int64_t k : {2, 3, 5}) {
    std::set<int32_t> allowed(order.begin(), order.begin() + k), seen;
    // A high temperature makes the distribution nearly flat, so an outsider would show up.
    for (int i = 0; i < 4000; ++i) {
      int32_t t = nn::sample_token(row, {50.0, k}, gen);
      ASSERT_TRUE(allowed.count(t)) << "token " << t << " is not among the top " << k;
      seen.insert(t);
    }
    EXPECT_EQ(seen, allowed) << "every one of the top " << k << " should appear in 4000 draws";
  }
}

// Pearson's chi-square of N draws against softmax(logits / T) (restricted to the top k and
// renormalised when k > 0). With 7 degrees of freedom the statistic's 99.9999th percentile is
// about 41; a wrong temperature (T vs T/2 or 2T) gives statistics in the thousands here.
TEST(SampleToken, DrawsFollowSoftmaxAtTheTemperature) {
  const std::vector<float> row = {1.0f, -0.5f, 2.0f, 0.3f, -1.2f, 1.7f, 0.0f, 0.9f};
  const int n = static_cast<int>(row.size());
  const int N = 40000;
  Generator gen(11);
  for (double T : {0.5, 1.0, 2.0})
    for (int64_t k : {0, 4}) {
      std::vector<int32_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      std::vector<double> p(n, 0.0);
      double z = 0;
      for (int j = 0; j < (k ? k : n); ++j) z += std::exp(row[order[j]] / T);
      for (int j = 0; j < (k ? k : n); ++j) p[order[j]] = std::exp(row[order[j]] / T) / z;
      std::vector<int> count(n, 0);
      for (int i = 0; i < N; ++i) count[nn::sample_token(row, {T, k}, gen)]++;
      double chi2 = 0;
      for (int v = 0; v < n; ++v) {
        if (p[v] == 0) {
          EXPECT_EQ(count[v], 0) << "token " << v << " is outside the top " << k;
          continue;
        }
        const double e = N * p[v];
        chi2 += (count[v] - e) * (count[v] - e) / e;
      }
      std::printf("  T %.1f top_k %lld: chi-square %.2f (bound 41)\n", T, static_cast<long long>(k), chi2);
      EXPECT_LT(chi2, 41.0) << "T " << T << " top_k " << k;
    }
}

TEST(SampleToken, BadOptionsAreInputErrors) {
  Generator gen(1);
  std::vector<float> row = {0.0f, 1.0f};
  EXPECT_THROW(nn::sample_token(row, {-1.0, 0}, gen), InputError);
  EXPECT_THROW(nn::sample_token(row, {std::nan(""), 0}, gen), InputError);
  EXPECT_THROW(nn::sample_token(row, {1.0, -2}, gen), InputError);
  EXPECT_THROW(nn::sample_token(std::span<const float>(), {1.0, 0}, gen), InputError);
}

TEST(Generate, SeedsReproduceAndDiffer) {
  nn::GPT m(small_cfg(), 5);
  nn::GenerateOptions o;
  o.temperature = 1.0;
  o.max_new_tokens = 30;
  o.seed = 42;
  auto a = nn::generate(m, {1, 2, 3}, o);
  auto b = nn::generate(m, {1, 2, 3}, o);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 33u);
  EXPECT_EQ(std::vector<int32_t>(a.begin(), a.begin() + 3), (std::vector<int32_t>{1, 2, 3})) << "the prompt comes first";
  Generator g(42);
  EXPECT_EQ(nn::generate(m, {1, 2, 3}, o, g), a) << "options.seed is Generator(seed)";
  o.seed = 43;
  // 30 draws from a near-flat distribution over 48 tokens: equal sequences are (48^-30)-unlikely.
  EXPECT_NE(nn::generate(m, {1, 2, 3}, o), a);
}

TEST(Generate, GreedyWindowSlidesPastBlockSize) {
  nn::GPT m(small_cfg(/*block=*/8), 6);
  spread_weights(m, 9);
  nn::GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 20;
  const std::vector<int32_t> prompt = {4, 17, 30};
  auto ids = nn::generate(m, prompt, o);
  ASSERT_EQ(ids.size(), 23u);
  std::set<int32_t> distinct(ids.begin() + 3, ids.end());
  EXPECT_GT(distinct.size(), 1u) << "a degenerate model would not test much";
  for (size_t i = prompt.size(); i < ids.size(); ++i) {
    const size_t start = i > 8 ? i - 8 : 0;
    std::vector<int32_t> window(ids.begin() + start, ids.begin() + i);
    EXPECT_EQ(ids[i], argmax(last_logits(m, window))) << "token " << i << " (window of " << window.size() << ")";
  }
}

TEST(Generate, StopTokenEndsGeneration) {
  nn::GPT m(small_cfg(), 6);
  spread_weights(m, 9);
  nn::GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 12;
  auto full = nn::generate(m, {5}, o);
  ASSERT_EQ(full.size(), 13u);
  const int32_t stop = full[4];
  const size_t first = std::find(full.begin() + 1, full.end(), stop) - full.begin();
  o.stop_token = stop;
  auto cut = nn::generate(m, {5}, o);
  EXPECT_EQ(cut, std::vector<int32_t>(full.begin(), full.begin() + first)) << "ends before the stop token";
}

TEST(Generate, VocabLimitAndZeroTokens) {
  nn::GPT m(small_cfg(), 7);
  nn::GenerateOptions o;
  o.temperature = 1.0;
  o.max_new_tokens = 40;
  o.vocab_limit = 5;
  for (int32_t t : nn::generate(m, {40}, o)) EXPECT_TRUE(t < 5 || t == 40) << t;
  o.max_new_tokens = 0;
  EXPECT_EQ(nn::generate(m, {40, 41}, o), (std::vector<int32_t>{40, 41}));
}

TEST(Generate, EvalModeAndNoGradForTheCallOnly) {
  // Dropout 0.5: in training mode logits are random, in eval mode greedy is deterministic.
  nn::GPT m(small_cfg(8, 0.5f), 8);
  spread_weights(m, 10);
  nn::GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 10;
  m.eval();
  auto ref = nn::generate(m, {3, 9}, o);
  EXPECT_FALSE(m.is_training());
  m.train();
  EXPECT_EQ(nn::generate(m, {3, 9}, o), ref) << "generate runs the model in eval mode";
  EXPECT_TRUE(m.is_training()) << "and gives its training mode back";
  EXPECT_TRUE(autograd::grad_enabled());
  for (const auto& [name, p] : m.named_parameters()) EXPECT_FALSE(p.grad().defined()) << name;
  // The mode comes back when the model throws in the middle of generate too.
  m.add_forward_wrapper([](const Tensor&, const nn::Module::ForwardBody&) -> Tensor { throw IoError("boom"); });
  EXPECT_THROW(nn::generate(m, {3}, o), IoError);
  EXPECT_TRUE(m.is_training());
  EXPECT_TRUE(autograd::grad_enabled());
}

TEST(Generate, BadInputIsInputError) {
  nn::GPT m(small_cfg(), 1);
  nn::GenerateOptions o;
  EXPECT_THROW(nn::generate(m, {}, o), InputError);
  EXPECT_THROW(nn::generate(m, {48}, o), InputError);
  EXPECT_THROW(nn::generate(m, {-1}, o), InputError);
  o.max_new_tokens = -1;
  EXPECT_THROW(nn::generate(m, {1}, o), InputError);
  o.max_new_tokens = 1;
  o.temperature = -0.1;
  EXPECT_THROW(nn::generate(m, {1}, o), InputError);
  o.temperature = 1;
  o.vocab_limit = -1;
  EXPECT_THROW(nn::generate(m, {1}, o), InputError);
  try {
    o.vocab_limit = 49;
    nn::generate(m, {1}, o);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_limit"), std::string::npos) << e.what();
  }
}
