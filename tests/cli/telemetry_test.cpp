// Live telemetry checked by value, not by key (issue 13): real 2-rank runs of the `paratrain`
// binary under `paratrain launch`, their metrics lines against formulas computed here from
// the model's shape, and the bus bandwidth against what `paratrain bench comm` measures for
// the same message on the same machine, in the same test.
//  - DDP: comm_bytes = 4 bytes x every parameter (f32 gradients, one all-reduce each), the
//    flight recorder's count for the dp group equals it; tokens_per_s = the global batch's
//    tokens / step time; busbw_gbps.dp lies in the range the comm benchmark measures.
//  - pipeline: the first stage's pp group moves each micro-batch's activation forward and its
//    gradient back: 2 x micro-batches x (B, T, C) f32.
//  - tensor parallelism: the tp group is reported.
//  - a rank slowed down by PARATRAIN_SIMULATE_SLOWDOWN is named in rank 0's progress line.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/run_binary.h"
#include "support/weights_compare.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class Telemetry : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string t = (fs::temp_directory_path() / "pt_telemetry_XXXXXX").string();
    ASSERT_NE(::mkdtemp(t.data()), nullptr);
    dir_ = t;
    paratrain::test::write_structured_token_file(dir_ + "/t.bin");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `paratrain launch --nproc-per-node 2 -- paratrain ARGS`; returns the output.
  std::string launch2(const std::string& args, const std::string& env = "", int timeout_s = 120) {
    auto r = paratrain::test::run_shell_line(env + " timeout " + std::to_string(timeout_s) + " " + PARATRAIN_BIN +
                                             " launch --nproc-per-node 2 -- " + PARATRAIN_BIN + " " + args + " 2>&1");
    EXPECT_EQ(r.rc, 0) << r.out;
    return r.out;
  }
  std::vector<json> steps(const std::string& metrics) {
    std::vector<json> out;
    std::ifstream f(metrics);
    std::string line;
    while (std::getline(f, line))
      if (auto j = json::parse(line); !j.value("eval", false)) out.push_back(j);
    return out;
  }
  std::string dir_;
};

// gpt-nano: L 2, C 64, T 64, V 256; the head is tied to wte.
constexpr int64_t kL = 2, kC = 64, kT = 64, kV = 256;
constexpr int64_t kGptNanoParams = kV * kC + kT * kC + kL * (12 * kC * kC + 13 * kC) + 2 * kC;
constexpr int64_t kGptNanoTensors = 2 + kL * 12 + 2;  // wte, wpe; 12 per block; ln_f

TEST_F(Telemetry, DataParallelBytesThroughputAndBusBandwidthMatchTheFormulasAndTheCommBenchmark) {
  ASSERT_EQ(kGptNanoParams, 120576);
  const std::string m = dir_ + "/m.jsonl";
  launch2("train --model gpt-nano --data " + dir_ + "/t.bin --steps 6 --micro-batch 4 --threads 1 --quiet --metrics " + m);
  const auto lines = steps(m);
  ASSERT_EQ(lines.size(), 6u);
  const int64_t grad_bytes = 4 * kGptNanoParams;
  std::vector<double> busbw;
  for (const json& l : lines) {
    SCOPED_TRACE(l.dump());
    EXPECT_EQ(l["comm_bytes"].get<int64_t>(), grad_bytes);
    // The flight recorder's count agrees with DDP's; in the second step (index 1) DDP also
    // agrees the bucket order it recorded (rank 0 broadcasts one int64 per parameter tensor:
    // 28 in gpt-nano).
    EXPECT_EQ(l["comm_bytes_per_group"]["dp"].get<int64_t>(), grad_bytes + (l["step"] == 1 ? 8 * kGptNanoTensors : 0));
    EXPECT_FALSE(l["comm_bytes_per_group"].contains("tp"));
    const double tokens_per_step = 2.0 * 4 * kT;  // 2 ranks x micro-batch 4 x block 64
    EXPECT_NEAR(l["tokens_per_s"].get<double>(), tokens_per_step / (l["step_ms"].get<double>() / 1e3),
                1e-6 * l["tokens_per_s"].get<double>());
    ASSERT_EQ(l["data_wait_ms_per_rank"].size(), 2u);
    EXPECT_GE(l["slowest_rank"].get<int>(), 0);
    EXPECT_LE(l["slowest_rank"].get<int>(), 1);
    busbw.push_back(l["busbw_gbps"]["dp"].get<double>());
  }
  // The same message size through `paratrain bench comm` on the same machine, now: the
  // training's achieved bus bandwidth must lie in its range. Each side's best is compared
  // (the training's best step, the best of three benchmark runs): a rank descheduled by
  // other work on this shared machine only ever lowers a figure, and what the check is for
  // (bytes or times miscounted) moves the best figures as much as any other.
  double bench_busbw = 0;
  for (int run = 0; run < 3; ++run) {
    const std::string bench_json = dir_ + "/bench" + std::to_string(run) + ".json";
    launch2("bench comm --op allreduce --min-bytes " + std::to_string(grad_bytes) + " --max-bytes " +
            std::to_string(grad_bytes) + " --iters 20 --json " + bench_json);
    std::ifstream bf(bench_json);
    std::string row;
    ASSERT_TRUE(std::getline(bf, row));
    bench_busbw = std::max(bench_busbw, json::parse(row)["busbw_gbps"].get<double>());
  }
  ASSERT_GT(bench_busbw, 0);
  const double best = *std::max_element(busbw.begin(), busbw.end());
  std::printf("  busbw of the dp all-reduce: training best step %.3f GB/s, bench comm best of 3 %.3f GB/s\n", best,
              bench_busbw);
  // Below: the six training steps can all fall while both cores of a loaded CI machine run
  // other tests, the benchmark later in a quiet moment: seen at 1/30 and at 1/105 (training
  // 0.158 GB/s against 16.5, with two copies of this test and a training run on the two
  // cores). 1/1000 is 10x past that and still catches the in-flight time taken in the wrong
  // unit (ms for us, s for ms); the bytes are checked exactly above.
  // Above: the benchmark is the best of three runs, which may all fall in busy moments too;
  // 100x still catches an in-flight time taken in the wrong unit.
  EXPECT_GT(best, bench_busbw / 1000);
  EXPECT_LT(best, bench_busbw * 100);
}

TEST_F(Telemetry, PipelineAndTensorParallelGroupsReportTheirTraffic) {
  const std::string pp = dir_ + "/pp.jsonl", tp = dir_ + "/tp.jsonl";
  launch2("train --model gpt-nano --data " + dir_ + "/t.bin --pp 2 --pp-schedule 1f1b --grad-accum 4 --micro-batch 2 --steps 2 --threads 1 "
          "--quiet --metrics " + pp);
  for (const json& l : steps(pp)) {
    SCOPED_TRACE(l.dump());
    // Rank 0 holds stage 0: 4 activations (2, 64, 64) f32 sent, 4 gradients received.
    EXPECT_EQ(l["comm_bytes_per_group"]["pp"].get<int64_t>(), 2 * 4 * (2 * kT * kC) * 4);
    EXPECT_GT(l["busbw_gbps"]["pp"].get<double>(), 0);
  }
  launch2("train --model gpt-nano --data " + dir_ + "/t.bin --tp 2 --micro-batch 2 --steps 2 --threads 1 --quiet --metrics " + tp);
  for (const json& l : steps(tp)) {
    SCOPED_TRACE(l.dump());
    EXPECT_EQ(l["comm_bytes_per_group"]["tp"].get<int64_t>(), l["tp_comm_bytes"].get<int64_t>());
    EXPECT_GT(l["busbw_gbps"]["tp"].get<double>(), 0);
    EXPECT_FALSE(l["comm_bytes_per_group"].contains("dp"));
  }
}

TEST_F(Telemetry, ASlowRankIsNamedInTheProgressLineAndTheMetrics) {
  const std::string m = dir_ + "/m.jsonl";
  const std::string out = launch2("train --model gpt-nano --data " + dir_ + "/t.bin --steps 5 --micro-batch 2 --threads 1 --metrics " + m,
                                  "PARATRAIN_SIMULATE_SLOWDOWN=1:20");
  const auto lines = steps(m);
  ASSERT_EQ(lines.size(), 5u);
  for (size_t i = 2; i < lines.size(); ++i) {  // the first steps pay for first touch
    EXPECT_EQ(lines[i]["slowest_rank"].get<int>(), 1) << lines[i].dump();
    // 20x slower: lag near 19. A micro-step is a few ms here, so the factor is large enough
    // that rank 0 losing its core to other tests for several times its compute cannot close it.
    EXPECT_GT(lines[i]["slowest_rank_lag"].get<double>(), 1.0) << lines[i].dump();
  }
  EXPECT_NE(out.find("step 5/5"), std::string::npos) << out;
  EXPECT_NE(out.find("slowest rank 1 (+"), std::string::npos) << out;
}

}  // namespace
