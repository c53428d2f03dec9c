// The layout planner's formulas (parallel/planner.h, docs/plan.md) against hand-computed
// figures and the real model: parameter counts, the per-block activation bytes, DDP's buckets
// and ZeRO's shards, the pipeline schedules' held activations, and the enumeration's rules.
#include <gtest/gtest.h>

#include <set>

#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/planner.h"
#include "paratrain/tensor/allocator.h"

namespace {

using namespace paratrain;
using namespace paratrain::parallel::planner;
using paratrain::parallel::pipeline::ScheduleKind;

int64_t sc(int64_t b) { return static_cast<int64_t>(CachingAllocator::size_class(static_cast<size_t>(b))); }

TEST(Planner, ParameterCountsEqualTheRealModels) {
  for (const char* name : {"gpt-nano", "gpt-mini"}) {
    const nn::GPTConfig c = nn::GPTConfig::preset(name);
    nn::GPT model(c, 1);
    int64_t n = 0;
    for (const auto& [k, t] : model.named_parameters()) n += t.numel();
    EXPECT_EQ(parameter_count(c), n) << name;
    // Same tensors in the same (registration) order.
    const auto mine = gpt_parameters(c);
    const auto real = model.named_parameters();
    ASSERT_EQ(mine.size(), real.size()) << name;
    for (size_t i = 0; i < mine.size(); ++i) {
      EXPECT_EQ(mine[i].name, real[i].first) << name;
      EXPECT_EQ(mine[i].numel, real[i].second.numel()) << mine[i].name;
    }
  }
  // gpt2-124m by hand: V C = 50257 x 768 = 38,597,376; wpe 1024 x 768 = 786,432; a block
  // 12 C^2 + 13 C = 7,087,872, x 12 = 85,054,464; ln_f 1,536: 124,439,808 (HF's figure).
  EXPECT_EQ(parameter_count(nn::GPTConfig::preset("gpt2-124m")), 124439808);
  // 1.3B: 50257 x 2048 + 2048 x 2048 + 24 (12 x 2048^2 + 13 x 2048) + 2 x 2048.
  nn::GPTConfig big{24, 16, 2048, 2048, 50257, 0.0f};
  EXPECT_EQ(parameter_count(big), 102926336 + 4194304 + 24 * 50358272 + 4096);
}

TEST(Planner, TensorParallelShardsAndPipelineStages) {
  const nn::GPTConfig c = nn::GPTConfig::preset("gpt-mini");  // 6 layers, C 384, V 4096
  int64_t whole = 0, half = 0;
  for (const auto& p : rank_parameters(c, 1, 0, 6)) whole += p.numel;
  for (const auto& p : rank_parameters(c, 2, 0, 6)) half += p.numel;
  const int64_t C = 384;
  // tp 2 halves every matrix, c_attn's and c_fc's biases and wte; LayerNorms, wpe and the row-
  // parallel biases stay whole.
  const int64_t replicated = 256 * C + 6 * (4 * C + 2 * C) + 2 * C;
  EXPECT_EQ(half, (whole - replicated) / 2 + replicated);
  // pp: wte on the first and on the last stage (tied), wpe on the first, ln_f on the last.
  int64_t first = 0, last = 0;
  for (const auto& p : rank_parameters(c, 1, 0, 3)) first += p.numel;
  for (const auto& p : rank_parameters(c, 1, 3, 6)) last += p.numel;
  EXPECT_EQ(first + last, whole + 4096 * C);
}

TEST(Planner, BlockActivationBytesByHand) {
  // gpt-mini, micro-batch 2: B T = 512 rows, B T C = 196,608 elements (768 KiB as f32: a size
  // class of its own), B H T = 3,072.
  const nn::GPTConfig c = nn::GPTConfig::preset("gpt-mini");
  const int64_t BT = 512, BTC = 196608;
  // none, f32: 16 B T C f32 (ln_1 out, qkv 3, attention out, x1, ln_2 out, c_fc 4, gelu 4,
  // output) + 4 statistics of [B T] + the lse [B H T].
  const int64_t none = sc(4 * BTC) * 2 + sc(12 * BTC) + sc(4 * BTC) + sc(4 * 3072) + sc(4 * BTC) * 2 +
                       2 * sc(16 * BTC) + 4 * sc(4 * BT);
  EXPECT_EQ(block_activation_bytes(c, 2, 1, Recompute::None, false), none);
  EXPECT_EQ(block_activation_bytes(c, 2, 1, Recompute::Full, false), 4 * BTC);  // the block's output
  // selective: the fused attention's lse is recomputed; its output stays (c_proj's input).
  EXPECT_EQ(block_activation_bytes(c, 2, 1, Recompute::Selective, false), none - sc(4 * 3072));
  // bf16: the compute-type tensors halve, the f32 residual (x1, output) and statistics stay.
  EXPECT_EQ(block_activation_bytes(c, 2, 1, Recompute::None, true),
            2 * sc(2 * BTC) + sc(6 * BTC) + sc(2 * BTC) + sc(4 * 3072) + 2 * sc(4 * BTC) + 2 * sc(8 * BTC) +
                4 * sc(4 * BT));
  // tp 2: qkv, attention out, c_fc and gelu out halve (12 B T C of the 16), and the lse.
  EXPECT_EQ(block_activation_bytes(c, 2, 2, Recompute::None, false),
            2 * sc(4 * BTC) + sc(6 * BTC) + sc(2 * BTC) + sc(4 * 1536) + 2 * sc(4 * BTC) + 2 * sc(8 * BTC) +
                4 * sc(4 * BT));
  // About 64 bytes per element of [B T C] in f32 (size classes add at most 25%).
  EXPECT_GE(none, 64 * BTC);
  EXPECT_LE(none, 64 * BTC * 5 / 4);
}

TEST(Planner, ZeroShardsTheOptimizerStateAndDdpBucketsHoldTheGradients) {
  const nn::GPTConfig c = nn::GPTConfig::preset("gpt-mini");
  MemoryOptions o;
  Layout one;
  one.micro_batch = 2;
  const MemoryEstimate m1 = estimate_rank_memory(c, one, o, 0);
  int64_t w = 0;
  for (const auto& p : gpt_parameters(c)) w += sc(4 * p.numel);
  EXPECT_EQ(m1.weights, w);
  EXPECT_EQ(m1.gradients, w);      // one .grad per parameter
  EXPECT_EQ(m1.optimizer, 2 * w);  // AdamW m and v
  Layout dp2 = one;
  dp2.dp = 2;
  const MemoryEstimate m2 = estimate_rank_memory(c, dp2, o, 0);
  EXPECT_EQ(m2.weights, w);
  EXPECT_EQ(m2.optimizer, 2 * w);
  // Flat buckets: about the parameters' bytes (one rounding per bucket instead of per tensor).
  EXPECT_NEAR(static_cast<double>(m2.gradients), 4.0 * parameter_count(c), 0.26 * 4.0 * parameter_count(c));
  for (int zero : {1, 2}) {
    Layout z = dp2;
    z.zero = zero;
    const MemoryEstimate a = estimate_rank_memory(c, z, o, 0), b = estimate_rank_memory(c, z, o, 1);
    // Each rank's pieces: about half of the state (pieces rounded separately), the two halves
    // together at least the whole.
    EXPECT_LT(a.optimizer, m1.optimizer * 0.7);
    EXPECT_GE(a.optimizer + b.optimizer, 8 * parameter_count(c));
  }
  Layout z3 = dp2;
  z3.zero = 3;
  const MemoryEstimate a3 = estimate_rank_memory(c, z3, o, 0);
  EXPECT_LT(a3.weights, w * 0.6);  // the parameter shard
  EXPECT_LT(a3.gradients, w * 0.6);
  // zero 3 with pp is refused (as the trainer does).
  Layout bad = z3;
  bad.pp = 2;
  EXPECT_THROW(estimate_rank_memory(c, bad, o, 0), InputError);
}

TEST(Planner, PipelineActivationsFollowTheSchedule) {
  // gpt-mini over pp 2 with m = 8: 1F1B's first stage holds min(p, m) = 2 micro-batches,
  // GPipe's all 8; recompute full below none.
  const nn::GPTConfig c = nn::GPTConfig::preset("gpt-mini");
  MemoryOptions o;
  Layout L;
  L.pp = 2, L.micro_batch = 2, L.grad_accum = 8;
  L.schedule = ScheduleKind::OneFOneB;
  const MemoryEstimate f1b = estimate_rank_memory(c, L, o, 0);
  L.schedule = ScheduleKind::GPipe;
  const MemoryEstimate gp = estimate_rank_memory(c, L, o, 0);
  EXPECT_EQ(gp.activations, 4 * f1b.activations);  // 8 held against 2
  L.schedule = ScheduleKind::ZeroBubble;
  EXPECT_LE(estimate_rank_memory(c, L, o, 0).activations, f1b.activations);
  L.schedule = ScheduleKind::OneFOneB;
  L.recompute = Recompute::Full;
  EXPECT_LT(estimate_rank_memory(c, L, o, 0).activations, f1b.activations);
  // The last stage of 1F1B holds one micro-batch.
  L.recompute = Recompute::None;
  const MemoryEstimate last = estimate_rank_memory(c, L, o, 1);
  EXPECT_LT(last.activations, f1b.activations);
  std::printf("  gpt-mini pp 2, m 8, mb 2: stage 0 activations 1f1b %.1f MiB, gpipe %.1f MiB\n",
              f1b.activations / 1048576.0, gp.activations / 1048576.0);
  // pp above the number of blocks is an InputError.
  L.pp = 7;
  EXPECT_THROW(estimate_rank_memory(c, L, o, 0), InputError);
}

TEST(Planner, EnumeratesOnlyValidLayouts) {
  PlanInput in;
  in.model = nn::GPTConfig::preset("gpt-mini");  // 6 heads: tp 1, 2, 3 or 6
  in.global_batch = 16;
  in.devices = 4;
  in.device = device_preset("a100-40g");
  const Plan p = plan_layouts(in);
  ASSERT_FALSE(p.fits.empty());
  std::set<std::string> shapes;
  for (const auto& k : p.fits) {
    const Layout& L = k.layout;
    EXPECT_EQ(L.dp * L.tp * L.pp, 4);
    EXPECT_NE(L.tp, 4);  // 4 does not divide 6 heads
    EXPECT_EQ(L.micro_batch * L.grad_accum * L.dp, 16) << L.str();
    if (L.zero > 0) EXPECT_GT(L.dp, 1) << L.str();
    if (L.zero == 3) EXPECT_EQ(L.pp, 1) << L.str();
    if (L.schedule == ScheduleKind::Interleaved && L.pp > 1) EXPECT_EQ(L.grad_accum % L.pp, 0) << L.str();
    EXPECT_GT(k.time.step_s, 0);
    shapes.insert(std::to_string(L.dp) + "x" + std::to_string(L.tp) + "x" + std::to_string(L.pp));
  }
  EXPECT_TRUE(shapes.count("4x1x1") && shapes.count("2x2x1") && shapes.count("1x1x4") && shapes.count("2x1x2"));
  EXPECT_EQ(p.dropped.begin()->first.find("tp does not divide"), 0u);
  for (size_t i = 1; i < p.fits.size(); ++i) EXPECT_LE(p.fits[i - 1].time.step_s, p.fits[i].time.step_s * 1.006);
  // The time model: tp adds all-reduces, recompute full a third more compute, the bubble
  // (p - 1) / (m + p - 1) for 1f1b.
  Layout L;
  L.pp = 2, L.dp = 2, L.micro_batch = 2, L.grad_accum = 4;
  const TimeEstimate t = estimate_time(in, L);
  EXPECT_NEAR(t.bubble_fraction, 1.0 / 5.0, 1e-9);
  Layout r = L;
  r.recompute = Recompute::Full;
  EXPECT_NEAR(estimate_time(in, r).recompute_s, t.compute_s / 3.0, 1e-12);
  // Bad input: no shape possible, zero devices, unknown device.
  in.devices = 0;
  EXPECT_THROW(plan_layouts(in), InputError);
  EXPECT_THROW(device_preset("tpu-v5"), InputError);
}

TEST(Planner, CpuDeviceReadsTheMachine) {
  const DeviceModel d = cpu_device(2);
  EXPECT_GT(d.memory_bytes, int64_t(1) << 28);
  EXPECT_GT(d.peak_flops_fp32, 1e9);
  EXPECT_NE(d.note.find("MemTotal"), std::string::npos);
  EXPECT_NEAR(static_cast<double>(cpu_device(1).memory_bytes), 2.0 * d.memory_bytes, 2.0);
}

}  // namespace
