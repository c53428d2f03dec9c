// `paratrain plan` through the real binary: --print-schedule (a pipeline schedule printed and
// checked); the layout planner's table and recommendation (gpt2-124m on 8 x 16 GiB, a 1.3B
// GPT on 64 x 80 GiB); --check, the memory estimate against the measured per-rank peaks of
// real gpt-mini runs in several layouts (within 15%); bad input exits 2 with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <regex>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "paratrain/parallel/planner.h"
#include "parallel/train_multirank_util.h"
#include "support/run_binary.h"

namespace {

using paratrain::test::run_paratrain;
namespace planner = paratrain::parallel::planner;

TEST(PlanCommand, PrintsAndChecksAPipelineSchedule) {
  auto r = run_paratrain("plan --print-schedule --pp 2 --micro-batches 2 --pp-schedule 1f1b");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0: F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: RECV_F0<0 F0 B0 SEND_B0>0 RECV_F1<0 F1 B1 SEND_B1>0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.333 of the step (theory 0.333)"), std::string::npos) << r.out;  // (p-1)/(m+p-1)
  EXPECT_NE(r.out.find("per rank: 2 1\n"), std::string::npos) << r.out;
  r = run_paratrain("plan --print-schedule --pp 4 --micro-batches 8 --pp-schedule interleaved --pp-virtual 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("F0.c1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.158"), std::string::npos) << r.out;  // 3/19
  r = run_paratrain("plan --print-schedule --pp 4 --micro-batches 8 --pp-schedule zb1p");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(" I0 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.200"), std::string::npos) << r.out;
}

TEST(PlanCommand, BadInputExitsTwoWithOneLine) {
  for (const std::string& args :
       {std::string("plan --print-schedule --pp 4 --micro-batches 6 --pp-schedule interleaved --pp-virtual 2"),
        std::string("plan --print-schedule --pp-schedule pipedream"), std::string("plan --print-schedule --pp 0"),
        std::string("plan"), std::string("plan --model gpt2-124m --devices 8 --device tpu-v5 --global-batch 64"),
        std::string("plan --model gpt2-124m --devices 0 --device v100-16g --global-batch 64"),
        std::string("plan --model gpt2-124m --devices 8 --global-batch 64"),
        std::string("plan --model gpt5 --devices 8 --device v100-16g --global-batch 64"),
        std::string("plan --model gpt2-124m --devices 8 --device v100-16g --global-batch 64 --micro-batch 2,x"),
        std::string("plan --model gpt2-124m --devices 8 --device v100-16g --global-batch 64 --precision fp8"),
        // 7 devices, no layout: dp 7 does not divide the global batch 64, tp 7 not the 13
        // heads, pp 7 is above the 2 layers.
        std::string("plan --model gpt2-124m --n-head 13 --n-embd 832 --n-layer 2 --devices 7 --device v100-16g "
                    "--global-batch 64"),
        std::string("plan --check /nonexistent/metrics.jsonl --model gpt-mini --micro-batch 2")}) {
    auto r = run_paratrain(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": one line\n" << r.out;
  }
  EXPECT_NE(run_paratrain("plan").out.find("--global-batch"), std::string::npos);
  EXPECT_NE(run_paratrain("plan --print-schedule --pp 4 --micro-batches 6 --pp-schedule interleaved --pp-virtual 2")
                .out.find("multiple of --pp 4"),
            std::string::npos);
}

// The table's rows: "#  dp tp pp schedule zero recompute mb accum weights grads optim activ
// buffers total step_ms bubble dp_MB tp_MB pp_MB tokens/s".
struct Row {
  int dp, tp, pp, zero;
  std::string schedule, recompute;
  int64_t mb, accum;
  double total_gib, step_ms;
};
std::vector<Row> rows_of(const std::string& out) {
  std::vector<Row> rows;
  std::istringstream is(out);
  for (std::string line; std::getline(is, line);) {
    std::istringstream ls(line);
    int idx;
    if (!(ls >> idx)) continue;
    Row r;
    std::string sched;
    ls >> r.dp >> r.tp >> r.pp >> sched;
    if (sched != "-" && sched != "gpipe" && sched != "1f1b" && sched != "zb1p" && sched != "interleaved") continue;
    if (sched == "interleaved") {
      std::string v;
      ls >> v;
    }
    r.schedule = sched;
    double w, g, o, a, b, bubble;
    ls >> r.zero >> r.recompute >> r.mb >> r.accum >> w >> g >> o >> a >> b >> r.total_gib >> r.step_ms >> bubble;
    if (!ls) continue;
    EXPECT_NEAR(w + g + o + a + b, r.total_gib, 0.03) << line;
    rows.push_back(r);
  }
  return rows;
}

TEST(PlanCommand, Gpt2On8V100s) {
  auto r = run_paratrain("plan --model gpt2-124m --devices 8 --device v100-16g --global-batch 64 --top 0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("124.44M parameters"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("8 x v100-16g"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dropped:"), std::string::npos) << r.out;
  const auto rows = rows_of(r.out);
  ASSERT_GT(rows.size(), 10u) << r.out;
  bool plain_small = false;
  for (const auto& row : rows) {
    EXPECT_EQ(row.dp * row.tp * row.pp, 8);
    EXPECT_LE(row.total_gib, 16.0);
    EXPECT_EQ(row.mb * row.accum * row.dp, 64);
    EXPECT_NE(row.tp, 8);  // 8 does not divide 12 heads
    if (row.pp == 1 && row.tp == 1 && row.zero == 0 && row.recompute == "none" && row.mb <= 2) plain_small = true;
  }
  // Plain data parallelism fits 16 GiB at a small micro-batch: 124.4M x 16 bytes = 1.85 GiB
  // of model state plus about 64 bytes x B T C per block (B 2: 0.1 GiB x 12) and the logits.
  EXPECT_TRUE(plain_small) << r.out;
  for (size_t i = 1; i < rows.size(); ++i) EXPECT_LE(rows[i - 1].step_ms, rows[i].step_ms * 1.006);
  // The recommendation is the first row.
  const auto pos = r.out.find("recommended: ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  const auto& best = rows.front();
  std::ostringstream want;
  want << "recommended: dp " << best.dp << " tp " << best.tp << " pp " << best.pp;
  EXPECT_EQ(r.out.compare(pos, want.str().size(), want.str()), 0) << r.out;
  EXPECT_NE(r.out.find("the fastest layout that fits", pos), std::string::npos);
  EXPECT_NE(r.out.find("margin", pos), std::string::npos);
  // --json: the same plan.
  auto j = run_paratrain("plan --model gpt2-124m --devices 8 --device v100-16g --global-batch 64 --top 5 --json");
  ASSERT_EQ(j.rc, 0) << j.out;
  const auto doc = nlohmann::json::parse(j.out);
  ASSERT_EQ(doc["layouts"].size(), 5u);
  EXPECT_EQ(doc["layouts"][0]["dp"].get<int>(), best.dp);
  EXPECT_LE(doc["layouts"][0]["memory"]["total"].get<int64_t>(), doc["device"]["usable_bytes"].get<int64_t>());
}

TEST(PlanCommand, Gpt13BOn64H100s) {
  // 1.3B: n_layer 24, n_embd 2048, n_head 16, block 2048, vocab 50257: N = 1,315,723,264.
  // dp 64, zero 0, fp32, no recomputation, by hand (GiB = 2^30 bytes), per micro-batch B:
  //   model state 16 bytes x N (weights, gradients, AdamW m and v) = 21.05e9 = 19.6 GiB
  //     (19.9 with the size classes' rounding)
  //   activations: B x 2048 x 2048 elements of [B T C]; a block keeps 16 of them in f32 (64
  //     bytes each), x 24 blocks: B 8: 51.5e9 = 48.0 GiB; B 16: 96.0 GiB
  //   logits [B T V] f32 and their gradient: 2 x B x 2048 x 50257 x 4: B 8: 6.1 GiB
  // B 16: over 115 GiB, far over the 78.6 GiB usable of an 80 GiB H100 (79.6 GiB less 1 GiB
  // for CUDA): it does not fit. B 8: 19.9 + 48.3 + 8.3 (logits, their gradient, wte's two
  // weight gradients, 3 [B T C] in flight) = 76.5 GiB: it fits, narrowly, because paratrain's
  // attention is fused and keeps no [T x T] scores (an unfused one would keep another
  // 2 x 8 x 16 x 2048^2 x 4 bytes = 4 GiB per block). With recompute full B 16 fits: the
  // activations shrink to 24 x 16 x 2048 x 2048 x 4 bytes = 6 GiB.
  const std::string model = "--model gpt --n-layer 24 --n-embd 2048 --n-head 16 --block-size 2048 --vocab-size 50257";
  auto r = run_paratrain("plan " + model + " --devices 64 --device h100-80g --global-batch 1024 --top 0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("1315.72M parameters"), std::string::npos) << r.out;
  const auto rows = rows_of(r.out);
  ASSERT_FALSE(rows.empty()) << r.out;
  bool mb16_none = false, mb16_full = false, mb8_none = false;
  for (const auto& row : rows) {
    EXPECT_EQ(row.dp * row.tp * row.pp, 64);
    EXPECT_LE(row.total_gib, 78.65);
    const bool plain = row.dp == 64 && row.zero == 0;
    if (plain && row.mb == 16 && row.recompute == "none") mb16_none = true;
    if (plain && row.mb == 16 && row.recompute == "full") mb16_full = true;
    if (plain && row.mb == 8 && row.recompute == "none") mb8_none = true;
  }
  EXPECT_FALSE(mb16_none) << "dp 64 zero 0 fp32 micro-batch 16 should not fit\n" << r.out;
  EXPECT_TRUE(mb16_full) << r.out;
  EXPECT_TRUE(mb8_none) << r.out;
  EXPECT_NE(r.out.find("needs more memory than the device's 78.65 GiB usable"), std::string::npos) << r.out;
  // The library's figures for those layouts, against the hand count above.
  const paratrain::nn::GPTConfig cfg{24, 16, 2048, 2048, 50257, 0.0f};
  planner::Layout L;
  L.dp = 64, L.micro_batch = 8, L.grad_accum = 2;
  const double GiB = double(1 << 30);
  const auto m = planner::estimate_rank_memory(cfg, L, {}, 0);
  EXPECT_NEAR((m.weights + m.gradients + m.optimizer) / GiB, 19.9, 0.5);
  EXPECT_NEAR(m.activations / GiB, 48.3, 0.5);
  EXPECT_NEAR(m.total() / GiB, 76.5, 1.0);
  L.micro_batch = 16, L.grad_accum = 1;
  const auto m16 = planner::estimate_rank_memory(cfg, L, {}, 0);
  EXPECT_GT(m16.total(), planner::device_preset("h100-80g").usable_bytes());
  std::printf("  1.3B dp 64 zero 0 fp32: mb 8 %.2f GiB (weights %.2f grads %.2f optim %.2f activ %.2f buffers %.2f), "
              "mb 16 %.2f GiB\n",
              m.total() / GiB, m.weights / GiB, m.gradients / GiB, m.optimizer / GiB, m.activations / GiB,
              m.buffers / GiB, m16.total() / GiB);
}

// Real gpt-mini runs (block 128, micro-batch 2, 3 steps, 1 thread per rank) in several
// layouts; the estimate of every rank within 15% of its measured peak (mem_peak_bytes: the
// caching allocator's peak bytes in use).
class PlanCheck : public paratrain::test::TrainMultiRank {};

TEST_F(PlanCheck, MemoryEstimateWithin15PercentOfRealRuns) {
  struct Case {
    std::string name;
    int ranks;
    std::string flags;
  };
  const std::vector<Case> cases = {{"dp1", 1, ""},
                                   {"dp2", 2, ""},
                                   {"tp2", 2, "--tp 2"},
                                   {"dp2_zero1", 2, "--zero 1"},
                                   {"dp2_zero3", 2, "--zero 3"},
                                   {"recompute_full", 1, "--recompute full"},
                                   {"bf16", 1, "--precision bf16"},
                                   {"pp2_1f1b", 2, "--pp 2 --grad-accum 4"},
                                   {"pp2_gpipe", 2, "--pp 2 --pp-schedule gpipe --grad-accum 4"},
                                   {"dp2_pp2_zb1p", 4, "--pp 2 --dp 2 --zero 1 --pp-schedule zb1p --grad-accum 2"}};
  const std::string base = "train --model gpt-mini --block-size 128 --data t.bin --steps 3 --micro-batch 2 --threads 1 "
                           "--quiet --lr-schedule constant ";
  planner::CheckInput ci;
  ci.model = paratrain::nn::GPTConfig::preset("gpt-mini");
  ci.model.block_size = 128;
  int checked = 0;
  for (const auto& c : cases) {
    const std::string metrics = "m_" + c.name + ".jsonl";
    const std::string args = base + "--metrics " + metrics + " " + c.flags;
    const auto res = c.ranks == 1 ? single(args, 90) : launch(c.ranks, args, 90);
    ASSERT_TRUE(res.ok()) << c.name << "\n" << res.output;
    const auto r = planner::check_metrics(path(metrics), ci);
    ASSERT_EQ(static_cast<int>(r.ranks.size()), c.ranks) << c.name;
    for (const auto& rk : r.ranks) {
      std::printf("  %-15s rank %d: estimate %7.1f MiB, measured %7.1f MiB, error %+5.1f%%\n", c.name.c_str(), rk.rank,
                  rk.estimate / 1048576.0, rk.measured / 1048576.0, 100 * rk.rel_error);
      EXPECT_LE(std::fabs(rk.rel_error), 0.15) << c.name << " rank " << rk.rank << "\n" << planner::format_check(r);
    }
    ++checked;
  }
  EXPECT_GE(checked, 4);
  // The command prints the same comparison.
  auto out = run_paratrain("plan --check " + path("m_dp2.jsonl") + " --model gpt-mini --block-size 128 --micro-batch 2");
  ASSERT_EQ(out.rc, 0) << out.out;
  EXPECT_NE(out.out.find("rank 1: estimate"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("worst relative error"), std::string::npos) << out.out;
  // The metrics record the model and the micro-batch: no flags needed.
  out = run_paratrain("plan --check " + path("m_pp2_1f1b.jsonl"));
  ASSERT_EQ(out.rc, 0) << out.out;
  EXPECT_NE(out.out.find("pp 2 1f1b"), std::string::npos) << out.out;
  // An older file without the micro-batch: exit 2, one line naming it.
  {
    std::ifstream in(path("m_dp2.jsonl"));
    std::ofstream old(path("old.jsonl"));
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      j.erase("micro_batch");
      old << j.dump() << "\n";
    }
  }
  out = run_paratrain("plan --check " + path("old.jsonl") + " --model gpt-mini --block-size 128");
  EXPECT_EQ(out.rc, 2) << out.out;
  EXPECT_NE(out.out.find("--micro-batch"), std::string::npos) << out.out;
}

}  // namespace
