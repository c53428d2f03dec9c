// `paratrain train --trace DIR` end to end under `paratrain launch` (2 ranks, gpt-nano, a few
// steps): both rank files and the merged trace.json parse; trace.json holds pids 0 and 1 with
// their process names; each rank has, per step, a "step N" span, forward and backward spans
// for the embedding, every block and the head, DDP's bucket all-reduces whose bytes sum to the
// metrics' comm_bytes of that step, an optimizer step and data waits; the report renders the
// directory. With --tp 2 the tensor-parallel collectives run inside the blocks' forward; with
// --pp 2 each stage sends and receives. A directory that cannot be made is exit 2, one line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "paratrain/data/token_file.h"
#include "support/run_binary.h"

using namespace paratrain;
namespace fs = std::filesystem;
using nlohmann::json;
using paratrain::test::CommandResult;

namespace {

class TraceCmd : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("paratrain_trace_cmd_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::vector<uint16_t> t(20000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 13) % 256);
    data::write_token_file(path("t.bin"), t);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // 2 ranks of gpt-nano for `steps` steps with `extra` flags, tracing into DIR `name`.
  CommandResult train(const std::string& name, int steps, const std::string& extra) {
    return paratrain::test::run_paratrain(
        "launch --nproc-per-node 2 -- " PARATRAIN_BIN " train --model gpt-nano --n-layer 2 --data " + path("t.bin") +
            " --steps " + std::to_string(steps) + " --micro-batch 2 --quiet --trace " + path(name) + " " + extra,
        90);
  }

  fs::path dir_;
};

json read_json(const std::string& p) {
  std::ifstream in(p);
  EXPECT_TRUE(in) << p;
  return json::parse(in);
}

struct Span {
  std::string name, cat;
  int pid = 0, tid = 0;
  double ts = 0, dur = 0;
  json args;
  bool inside(const Span& o) const { return pid == o.pid && ts >= o.ts && ts + dur <= o.ts + o.dur + 1.0; }
};

std::vector<Span> spans_of(const json& doc) {
  std::vector<Span> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] != "X") continue;
    out.push_back({e["name"], e["cat"], e["pid"], e["tid"], e["ts"], e["dur"], e.value("args", json::object())});
  }
  return out;
}

std::vector<Span> named(const std::vector<Span>& all, int pid, const std::string& prefix) {
  std::vector<Span> out;
  for (const auto& s : all)
    if (s.pid == pid && s.name.rfind(prefix, 0) == 0) out.push_back(s);
  return out;
}

TEST_F(TraceCmd, TwoRankDataParallelTimeline) {
  const int steps = 3;
  CommandResult r = train("tr", steps, "--metrics " + path("m.jsonl"));
  ASSERT_EQ(r.rc, 0) << r.out;
  for (int rank : {0, 1}) {
    json doc = read_json(path("tr/rank" + std::to_string(rank) + ".trace.json"));
    EXPECT_EQ(doc["otherData"]["rank"], rank);
    EXPECT_EQ(doc["otherData"]["dropped_events"], 0);
    for (const auto& s : spans_of(doc)) EXPECT_EQ(s.pid, rank);
  }
  json merged = read_json(path("tr/trace.json"));
  std::set<int> pids;
  std::map<int, std::string> process_names;
  for (const auto& e : merged["traceEvents"]) {
    pids.insert(e["pid"].get<int>());
    if (e["ph"] == "M" && e["name"] == "process_name") process_names[e["pid"]] = e["args"]["name"];
  }
  EXPECT_EQ(pids, (std::set<int>{0, 1}));
  EXPECT_EQ(process_names[0], "rank 0");
  EXPECT_EQ(process_names[1], "rank 1");

  std::vector<json> metrics;
  {
    std::ifstream in(path("m.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (!line.empty()) metrics.push_back(json::parse(line));
  }
  ASSERT_EQ(static_cast<int>(metrics.size()), steps);
  const std::vector<Span> all = spans_of(merged);
  for (int rank : {0, 1}) {
    const auto step_spans = named(all, rank, "step ");
    ASSERT_EQ(static_cast<int>(step_spans.size()), steps) << "rank " << rank;
    for (int k = 0; k < steps; ++k) {
      const Span& st = step_spans[static_cast<size_t>(k)];
      EXPECT_EQ(st.name, "step " + std::to_string(k + 1));
      std::map<std::string, int> in_step;
      double bucket_bytes = 0;
      int buckets = 0;
      for (const auto& s : all) {
        if (!s.inside(st)) continue;
        in_step[s.name]++;
        if (s.cat == "comm" && s.name == "allreduce" && s.args.contains("bucket")) {
          bucket_bytes += s.args["bytes"].get<double>();
          ++buckets;
          EXPECT_GT(s.args["busbw_gbps"].get<double>(), 0) << s.args.dump();
          EXPECT_NEAR(s.args["busbw_gbps"].get<double>(), s.args["algbw_gbps"].get<double>(), 1e-9);  // 2(n-1)/n = 1
          EXPECT_EQ(s.args["dtype"], "f32");
        }
      }
      for (const std::string part : {"embedding", "block 0", "block 1", "head"}) {
        EXPECT_GE(in_step["forward " + part], 1) << "rank " << rank << " step " << k + 1 << " " << part;
        EXPECT_GE(in_step["backward " + part], 1) << "rank " << rank << " step " << k + 1 << " " << part;
      }
      EXPECT_EQ(in_step["optimizer step"], 1) << "rank " << rank << " step " << k + 1;
      EXPECT_GE(in_step["data wait"], 1) << "rank " << rank << " step " << k + 1;
      EXPECT_GE(buckets, 1);
      EXPECT_EQ(bucket_bytes, metrics[static_cast<size_t>(k)]["comm_bytes"].get<double>())
          << "rank " << rank << " step " << k + 1;
    }
  }
  CommandResult rep = paratrain::test::run_paratrain(
      "report " + path("m.jsonl") + " --trace " + path("tr") + " -o " + path("x.html"), 60);
  ASSERT_EQ(rep.rc, 0) << rep.out;
  EXPECT_NE(rep.out.find("trace spans"), std::string::npos) << rep.out;
  std::ifstream html(path("x.html"));
  const std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("backward block 1"), std::string::npos);  // the timeline excerpt's spans
}

TEST_F(TraceCmd, TensorParallelCollectivesRunInsideTheBlocks) {
  CommandResult r = train("tp", 1, "--tp 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<Span> all = spans_of(read_json(path("tp/trace.json")));
  for (int rank : {0, 1}) {
    int in_blocks = 0;
    for (const auto& block : named(all, rank, "forward block "))
      for (const auto& s : all)
        if (s.cat == "comm" && s.inside(block)) ++in_blocks;
    EXPECT_GE(in_blocks, 2) << "rank " << rank << ": no tensor-parallel collective inside a block's forward";
  }
}

TEST_F(TraceCmd, PipelineStagesSendAndReceive) {
  CommandResult r = train("pp", 1, "--pp 2 --grad-accum 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::vector<Span> all = spans_of(read_json(path("pp/trace.json")));
  for (int rank : {0, 1}) {
    int sends = 0, recvs = 0;
    for (const auto& s : all) {
      if (s.pid != rank || s.cat != "comm") continue;
      if (s.name != "send" && s.name != "recv") continue;
      ++(s.name == "send" ? sends : recvs);
      EXPECT_EQ(s.args["peer"], 1 - rank) << s.name;
    }
    EXPECT_GE(sends, 2) << "rank " << rank;  // activations forward, gradients back, per micro-batch
    EXPECT_GE(recvs, 2) << "rank " << rank;
  }
  EXPECT_EQ(named(all, 0, "forward block 0").size(), 2u);  // stage 0: block 0, two micro-batches
  EXPECT_TRUE(named(all, 0, "forward block 1").empty());
  EXPECT_EQ(named(all, 1, "forward block 1").size(), 2u);
}

TEST_F(TraceCmd, ADirectoryThatCannotBeMadeIsExitTwoWithOneLine) {
  std::ofstream(path("file")) << "x";
  CommandResult r = paratrain::test::run_paratrain("train --model gpt-nano --data " + path("t.bin") +
                                                   " --steps 1 --quiet --trace " + path("file") + "/sub");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--trace " + path("file") + "/sub"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

}  // namespace
