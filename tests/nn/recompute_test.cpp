// recompute_blocks in its three modes on a small GPT. Selective (only the core attention,
// CausalSelfAttention::core, recomputed in backward) and full give every parameter gradient,
// every loss and the dropout generator's state bit for bit as no recompute does, with dropout
// on and under bf16 autocast; selective recomputes the core and not the projections, also
// after the projections were replaced (as a tensor-parallel plan does); the bytes a forward
// leaves allocated order full < selective < none, selective dropping exactly the fused
// attention's log-sum-exp; the figures and the backward times are printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <ctime>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/allocator.h"

using namespace paratrain;
using nn::RecomputeMode;

namespace {

void make_tokens(int64_t B, int64_t T, int64_t V, Tensor& x, Tensor& y) {
  std::vector<int32_t> xs, ys;
  for (int64_t i = 0; i < B * T; ++i)
    xs.push_back(static_cast<int32_t>((i * 7 + 3) % V)), ys.push_back(static_cast<int32_t>((i * 5 + 1) % V));
  x = Tensor::from_vector_i32(xs, {B, T});
  y = Tensor::from_vector_i32(ys, {B, T});
}

// The bits of a float vector (so -0.0 and 0.0, or two NaNs, are told apart).
std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  if (!v.empty()) std::memcpy(b.data(), v.data(), v.size() * sizeof(float));
  return b;
}

using Outcome = std::map<std::string, std::vector<uint32_t>>;

// Two training steps' losses, the last step's gradients and the generator's state after.
Outcome train_steps(nn::GPT& m, const Tensor& x, const Tensor& y, bool bf16) {
  Outcome r;
  std::vector<float> losses;
  for (int step = 0; step < 2; ++step) {  // the generator's state carries over steps
    m.zero_grad();
    Tensor loss;
    {
      std::unique_ptr<autograd::AutocastGuard> cast;
      if (bf16) cast = std::make_unique<autograd::AutocastGuard>(DType::BF16);
      loss = m.loss(x, y);
    }
    losses.push_back(static_cast<float>(loss.item()));
    autograd::backward(loss);
  }
  for (const auto& [name, p] : m.named_parameters()) {
    EXPECT_TRUE(p.grad().defined()) << name;
    if (p.grad().defined()) r[name] = bits(p.grad().to_vector());
  }
  r["losses"] = bits(losses);
  r["rng"] = {static_cast<uint32_t>(m.generator().next_u64())};
  return r;
}

// The process's CPU time (all its threads; idle ones wait passively under ctest): the ops'
// time, not counting the time other processes on a shared machine take the cores.
double cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * static_cast<double>(ts.tv_sec) + 1e-6 * static_cast<double>(ts.tv_nsec);
}

nn::GPTConfig small_with_dropout() { return nn::GPTConfig{2, 4, 32, 16, 64, 0.1f}; }

TEST(Recompute, SelectiveAndFullAreBitIdenticalWithDropoutAndUnderBf16) {
  const nn::GPTConfig cfg = small_with_dropout();
  Tensor x, y;
  make_tokens(2, cfg.block_size, cfg.vocab_size, x, y);
  for (const bool bf16 : {false, true}) {
    auto run = [&](RecomputeMode mode) {
      nn::GPT m(cfg, 11);
      nn::recompute_blocks(m, mode);
      EXPECT_EQ(m.recompute_mode(), mode);
      return train_steps(m, x, y, bf16);
    };
    const Outcome plain = run(RecomputeMode::None);
    EXPECT_EQ(run(RecomputeMode::Selective), plain) << (bf16 ? "bf16" : "f32") << " selective";
    EXPECT_EQ(run(RecomputeMode::Full), plain) << (bf16 ? "bf16" : "f32") << " full";
  }
}

TEST(Recompute, SelectiveWrapsTheCoreOnlyAndAddsNoBlockWrapper) {
  nn::GPT m(small_with_dropout(), 11);
  nn::recompute_blocks(m, RecomputeMode::Selective);
  for (const auto& block : m.h) {
    EXPECT_TRUE(block->attn->recomputes_core());
    EXPECT_FALSE(block->has_forward_wrappers());  // fully sharded wrappers may still go around the blocks
  }
  EXPECT_THROW(nn::recompute_blocks(m, RecomputeMode::Selective), InputError);  // once per model
  EXPECT_THROW(nn::recompute_blocks(m, RecomputeMode::Full), InputError);
  nn::GPT f(small_with_dropout(), 11);
  nn::recompute_blocks(f);  // the one-argument form is full
  EXPECT_EQ(f.recompute_mode(), RecomputeMode::Full);
  for (const auto& block : f.h) EXPECT_FALSE(block->attn->recomputes_core());
  EXPECT_THROW(nn::recompute_blocks(f, RecomputeMode::Selective), InputError);
  nn::GPT n(small_with_dropout(), 11);
  nn::recompute_blocks(n, RecomputeMode::None);  // does nothing
  EXPECT_EQ(n.recompute_mode(), RecomputeMode::None);
  nn::recompute_blocks(n, RecomputeMode::Full);

  EXPECT_EQ(nn::recompute_mode_from_name("selective"), RecomputeMode::Selective);
  EXPECT_EQ(nn::recompute_mode_from_name("full"), RecomputeMode::Full);
  EXPECT_EQ(nn::recompute_mode_from_name("none"), RecomputeMode::None);
  EXPECT_STREQ(nn::recompute_mode_name(RecomputeMode::Selective), "selective");
  EXPECT_THROW(nn::recompute_mode_from_name("some"), InputError);
}

// A projection replaced the way a tensor-parallel plan replaces it (replace_module with a
// Linear subclass holding the same parameters), counting its forwards.
class CountingLinear : public nn::Linear {
 public:
  CountingLinear(const nn::Linear& l, int* calls) : calls_(calls) {
    weight = register_parameter("weight", l.weight);
    bias = register_parameter("bias", l.bias);
    layout = l.layout;
  }
  Tensor forward(const Tensor& x) const override {
    ++*calls_;
    return nn::Linear::forward(x);
  }

 private:
  int* calls_;
};

void replace_projections(nn::GPT& m, int* calls) {
  for (auto& block : m.h) {
    auto& a = *block->attn;
    auto c_attn = std::make_shared<CountingLinear>(*a.c_attn, calls);
    auto c_proj = std::make_shared<CountingLinear>(*a.c_proj, calls);
    a.c_attn = c_attn, a.replace_module("c_attn", c_attn);
    a.c_proj = c_proj, a.replace_module("c_proj", c_proj);
  }
}

TEST(Recompute, SelectiveKeepsWorkingWhenTheProjectionsAreReplacedAndDoesNotRerunThem) {
  const nn::GPTConfig cfg = small_with_dropout();
  Tensor x, y;
  make_tokens(2, cfg.block_size, cfg.vocab_size, x, y);
  nn::GPT plain_model(cfg, 11);
  const Outcome plain = train_steps(plain_model, x, y, false);
  const int per_run = 2 * 2 * static_cast<int>(cfg.n_layer);  // 2 steps x 2 projections x blocks
  for (const bool before : {true, false}) {  // selective set up before / after the replacement
    nn::GPT m(cfg, 11);
    int calls = 0;
    if (before) nn::recompute_blocks(m, RecomputeMode::Selective);
    replace_projections(m, &calls);
    if (!before) nn::recompute_blocks(m, RecomputeMode::Selective);
    EXPECT_EQ(train_steps(m, x, y, false), plain) << (before ? "before" : "after");
    EXPECT_EQ(calls, per_run) << "selective reran a projection";
  }
  nn::GPT full(cfg, 11);  // the counter does see a recompute: full reruns every projection
  int calls = 0;
  replace_projections(full, &calls);
  nn::recompute_blocks(full, RecomputeMode::Full);
  EXPECT_EQ(train_steps(full, x, y, false), plain);
  EXPECT_EQ(calls, 2 * per_run);
}

// T large enough for attention to matter: block_size 256, n_embd 64, 4 heads.
TEST(Recompute, ForwardKeepsFullLessThanSelectiveLessThanNoneAndBackwardTimes) {
  const nn::GPTConfig cfg{2, 4, 64, 256, 64, 0.1f};
  const int64_t B = 4, T = cfg.block_size;
  Tensor x, y;
  make_tokens(B, T, cfg.vocab_size, x, y);
  Allocator& alloc = allocator_for(Device::CPU);
  struct Figures {
    int64_t kept = 0;
    double backward_ms = 0, forward_ms = 0;
    std::vector<double> fwd, bwd;
  };
  const RecomputeMode modes[3] = {RecomputeMode::None, RecomputeMode::Selective, RecomputeMode::Full};
  std::vector<std::unique_ptr<nn::GPT>> models;
  Figures fig[3];
  for (const RecomputeMode mode : modes) {
    models.push_back(std::make_unique<nn::GPT>(cfg, 5));
    nn::recompute_blocks(*models.back(), mode);
  }
  // The modes take turns, so a change in the machine's load touches all three alike.
  for (int rep = 0; rep < 11; ++rep) {
    for (int i = 0; i < 3; ++i) {
      nn::GPT& m = *models[static_cast<size_t>(i)];
      m.zero_grad();
      const int64_t before = alloc.stats().bytes_in_use;
      const double t0 = cpu_ms();
      Tensor loss = m.loss(x, y);
      const double t1 = cpu_ms();
      if (rep == 0) fig[i].kept = alloc.stats().bytes_in_use - before;
      autograd::backward(loss);
      const double t2 = cpu_ms();
      if (rep == 0) continue;  // warm-up
      fig[i].fwd.push_back(t1 - t0);
      fig[i].bwd.push_back(t2 - t1);
    }
  }
  for (Figures& f : fig) {
    f.forward_ms = *std::min_element(f.fwd.begin(), f.fwd.end());
    f.backward_ms = *std::min_element(f.bwd.begin(), f.bwd.end());
  }
  const Figures &none = fig[0], &sel = fig[1], &full = fig[2];
  auto mib = [](int64_t b) { return static_cast<double>(b) / (1 << 20); };
  std::printf("  GPT L=%lld C=%lld heads=%lld T=%lld B=%lld, forward keeps: none %lld bytes (%.3f MiB), selective %lld "
              "(%.3f MiB), full %lld (%.3f MiB)\n",
              static_cast<long long>(cfg.n_layer), static_cast<long long>(cfg.n_embd),
              static_cast<long long>(cfg.n_head), static_cast<long long>(T), static_cast<long long>(B),
              static_cast<long long>(none.kept), mib(none.kept), static_cast<long long>(sel.kept), mib(sel.kept),
              static_cast<long long>(full.kept), mib(full.kept));
  std::printf("  fastest of 10, process CPU ms, forward / backward: none %.2f / %.2f, selective %.2f / %.2f (backward %+.1f%%), full %.2f / "
              "%.2f (backward %+.1f%%)\n",
              none.forward_ms, none.backward_ms, sel.forward_ms, sel.backward_ms,
              100.0 * (sel.backward_ms / none.backward_ms - 1.0), full.forward_ms, full.backward_ms,
              100.0 * (full.backward_ms / none.backward_ms - 1.0));
  EXPECT_LT(full.kept, sel.kept);
  EXPECT_LT(sel.kept, none.kept);
  // The fused kernel keeps no T x T matrix; what selective drops is its row log-sum-exp,
  // (B, n_head, T) f32 per block -- qkv and the output are kept anyway (c_attn's output is
  // the checkpoint's input, the output is c_proj's input).
  const auto lse = static_cast<int64_t>(CachingAllocator::size_class(static_cast<size_t>(B * cfg.n_head * T * 4)));
  EXPECT_EQ(none.kept - sel.kept, cfg.n_layer * lse);
}

}  // namespace
