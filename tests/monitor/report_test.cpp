// The report's readers and data (monitor/report.h), without a browser: metrics lines and
// their errors, trace files (merged or per rank, X and B/E spans), the charts' data and the
// page's self-containment. tests/cli/report_cmd_test.cpp renders the pages in Chromium.
#include "paratrain/monitor/report.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::monitor;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

class ReportData : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_report_unit_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text) {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p, std::ios::binary) << text;
    return p;
  }
  std::string dir_;
};

const json& chart_of(const json& data, const std::string& id) {
  for (const json& c : data["charts"])
    if (c["id"] == id) return c;
  throw std::runtime_error("no chart " + id);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace

TEST_F(ReportData, MetricsSplitTrainingAndEvalLinesAndKeepUnknownKeys) {
  const std::string p = write("m.jsonl",
                              "{\"step\":0,\"loss\":2.5,\"new_key\":[1,2]}\n\n"
                              "{\"step\":1,\"loss\":2.0}\n"
                              "{\"step\":1,\"eval\":true,\"val_loss\":2.2}\n");
  const MetricsLog log = read_metrics_log(p);
  ASSERT_EQ(log.steps.size(), 2u);
  ASSERT_EQ(log.evals.size(), 1u);
  EXPECT_EQ(log.steps[0]["new_key"][1], 2);
  EXPECT_EQ(log.evals[0]["val_loss"], 2.2);
}

TEST_F(ReportData, MetricsErrorsNameFileAndLine) {
  const std::string bad = write("bad.jsonl", "{\"step\":0,\"loss\":1}\n{\"step\":1,\"loss\":\n");
  EXPECT_NE(error_of([&] { read_metrics_log(bad); }).find("bad.jsonl:2:"), std::string::npos);
  const std::string arr = write("arr.jsonl", "[1,2]\n");
  EXPECT_NE(error_of([&] { read_metrics_log(arr); }).find("arr.jsonl:1: expected a JSON object"), std::string::npos);
  const std::string nostep = write("nostep.jsonl", "{\"loss\":1}\n");
  EXPECT_NE(error_of([&] { read_metrics_log(nostep); }).find("nostep.jsonl:1: the line has no numeric \"step\""),
            std::string::npos);
  const std::string empty = write("empty.jsonl", "\n  \n");
  EXPECT_NE(error_of([&] { read_metrics_log(empty); }).find("empty.jsonl: the metrics file is empty"),
            std::string::npos);
  const std::string evals = write("evals.jsonl", "{\"step\":1,\"eval\":true,\"val_loss\":2}\n");
  EXPECT_NE(error_of([&] { read_metrics_log(evals); }).find("no training step"), std::string::npos);
  EXPECT_NE(error_of([&] { read_metrics_log(dir_ + "/none.jsonl"); }).find("none.jsonl: cannot open"),
            std::string::npos);
}

TEST_F(ReportData, TraceReadsCompleteAndBeginEndSpansAndNames) {
  fs::create_directories(dir_ + "/t");
  write("t/trace.json", R"({"traceEvents":[
    {"name":"process_name","ph":"M","pid":1,"args":{"name":"rank one"}},
    {"name":"thread_name","ph":"M","pid":1,"tid":"comm","args":{}},
    {"name":"fwd","ph":"X","ts":10,"dur":5,"pid":0,"tid":1},
    {"name":"outer","ph":"B","ts":1,"pid":1,"tid":3,"args":{"a":1}},
    {"name":"inner","ph":"B","ts":2,"pid":1,"tid":3},
    {"name":"inner","ph":"E","ts":4,"pid":1,"tid":3},
    {"name":"outer","ph":"E","ts":9,"pid":1,"tid":3,"args":{"b":2}},
    {"name":"stray","ph":"E","ts":11,"pid":1,"tid":3},
    {"name":"ar","ph":"X","ts":3,"dur":1,"pid":1,"tid":"comm"},
    {"name":"counter","ph":"C","ts":3,"pid":1,"args":{"x":1}}]})");
  const Trace t = read_trace(dir_ + "/t");
  ASSERT_EQ(t.events.size(), 4u);  // outer, inner, ar, fwd (sorted by ts)
  EXPECT_EQ(t.events[0].name, "outer");
  EXPECT_DOUBLE_EQ(t.events[0].dur_us, 8);
  EXPECT_EQ(t.events[0].args["b"], 2);
  EXPECT_EQ(t.events[1].name, "inner");
  EXPECT_DOUBLE_EQ(t.events[1].dur_us, 2);
  EXPECT_EQ(t.events[2].name, "ar");
  EXPECT_EQ(t.thread_names.at({1, t.events[2].tid}), "comm");
  EXPECT_EQ(t.process_names.at(1), "rank one");
  EXPECT_EQ(t.events[3].pid, 0);
}

TEST_F(ReportData, PerRankTraceFilesTakeTheirRankAsPid) {
  fs::create_directories(dir_ + "/t");
  write("t/rank0.trace.json", R"([{"name":"a","ph":"X","ts":0,"dur":1}])");
  write("t/rank3.trace.json", R"({"traceEvents":[{"name":"b","ph":"X","ts":0,"dur":1}]})");
  const Trace t = read_trace(dir_ + "/t");
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.events[0].pid, 0);
  EXPECT_EQ(t.events[1].pid, 3);
  EXPECT_EQ(t.files.size(), 2u);
}

TEST_F(ReportData, TraceErrorsNameTheFile) {
  fs::create_directories(dir_ + "/empty");
  EXPECT_NE(error_of([&] { read_trace(dir_ + "/empty"); }).find("neither trace.json nor rank<R>.trace.json"),
            std::string::npos);
  EXPECT_NE(error_of([&] { read_trace(dir_ + "/nodir"); }).find("not a trace directory"), std::string::npos);
  const std::string bad = write("bad.json", "{\"traceEvents\": 3}");
  EXPECT_NE(error_of([&] { read_trace_file(bad); }).find("bad.json: not Chrome trace-event JSON"), std::string::npos);
  const std::string nots = write("nots.json", R"([{"name":"x","ph":"X"}])");
  EXPECT_NE(error_of([&] { read_trace_file(nots); }).find("no numeric \"ts\""), std::string::npos);
}

TEST_F(ReportData, ChartsCarryTheRunsDataAndSayWhatIsAbsent) {
  const std::string p = write("m.jsonl",
                              "{\"step\":0,\"loss\":3,\"step_ms\":10,\"compute_ms\":8,\"exposed_comm_ms\":2,"
                              "\"samples_per_s\":100,\"mem_peak_bytes\":[1048576,2097152],\"step_ms_per_rank\":[9,11]}\n"
                              "{\"step\":1,\"loss\":2,\"step_ms\":12,\"compute_ms\":9,\"exposed_comm_ms\":3,"
                              "\"samples_per_s\":90,\"mem_peak_bytes\":[3145728,1048576],\"step_ms_per_rank\":[10,14]}\n"
                              "{\"step\":1,\"eval\":true,\"accuracy\":0.5}\n");
  const json d = build_report_data(read_metrics_log(p), nullptr);
  const json& loss = chart_of(d, "loss");
  ASSERT_EQ(loss["series"].size(), 2u);  // loss, accuracy %
  EXPECT_EQ(loss["series"][1]["points"][0][1], 50.0);
  const json& thr = chart_of(d, "throughput");
  EXPECT_EQ(thr["series"][0]["name"], "samples_per_s");
  EXPECT_EQ(thr["notes"][0], "MFU: not in this run");
  const json& split = chart_of(d, "split");
  EXPECT_EQ(split["series"][0]["values"], json({8.0, 9.0}));  // compute
  EXPECT_EQ(split["series"][1]["values"], json({2.0, 3.0}));  // exposed comm
  EXPECT_EQ(split["series"].back()["values"], json({0.0, 0.0}));  // other
  const json& mem = chart_of(d, "memory");
  EXPECT_EQ(mem["series"][0]["values"], json({3.0, 2.0}));  // MiB, the peak over the run per rank
  const json& st = chart_of(d, "step_time");
  EXPECT_EQ(st["series"][0]["values"], json({9.5, 12.5}));
  EXPECT_EQ(st["series"][1]["values"], json({10.0, 14.0}));
  EXPECT_NEAR(st["imbalance_pct"].get<double>(), (12.5 / 11.0 - 1) * 100, 1e-9);
  EXPECT_TRUE(chart_of(d, "busbw").contains("absent"));
  EXPECT_TRUE(chart_of(d, "timeline").contains("absent"));
  EXPECT_EQ(d["summary"]["ranks"], 2);
  EXPECT_EQ(d["summary"]["final_accuracy"], 0.5);
  EXPECT_EQ(d["summary"]["mean_samples_per_s"], 90.0);  // the first (warm-up) step left out
}

TEST_F(ReportData, TimelineShowsTheMiddleStepOfTheLowestRank) {
  fs::create_directories(dir_ + "/t");
  std::string ev = "[";
  for (int s = 0; s < 5; ++s)
    for (int r = 0; r < 2; ++r) {
      const int t = s * 100;
      ev += (ev.size() > 1 ? "," : "") + std::string("{\"name\":\"step\",\"ph\":\"X\",\"ts\":") + std::to_string(t) +
            ",\"dur\":90,\"pid\":" + std::to_string(r) + ",\"tid\":0}," + "{\"name\":\"work\",\"ph\":\"X\",\"ts\":" +
            std::to_string(t + 10) + ",\"dur\":50,\"pid\":" + std::to_string(r) + ",\"tid\":0}";
    }
  write("t/trace.json", ev + "]");
  const Trace t = read_trace(dir_ + "/t");
  ReportOptions opt;
  const json tl = chart_of(build_report_data(read_metrics_log(write("m.jsonl", "{\"step\":0}\n")), &t, opt), "timeline");
  ASSERT_FALSE(tl.contains("absent"));
  EXPECT_EQ(tl["window"]["start_us"], 200.0);  // the third of five steps
  EXPECT_EQ(tl["spans"].size(), 4u);
  EXPECT_EQ(tl["lanes"].size(), 2u);
  opt.max_timeline_events = 3;
  const json cut = chart_of(build_report_data(read_metrics_log(dir_ + "/m.jsonl"), &t, opt), "timeline");
  EXPECT_EQ(cut["spans"].size(), 3u);
  EXPECT_EQ(cut["notes"][0], "1 more spans in the window not drawn (limit 3)");
}

TEST_F(ReportData, PageIsSelfContainedAndEscapesRunStrings) {
  const std::string p =
      write("m.jsonl", "{\"step\":0,\"loss\":1,\"model\":{\"name\":\"<\\/script>https://x\"}}\n");
  fs::create_directories(dir_ + "/t");
  write("t/trace.json", R"([{"name":"</script><b>http://evil","ph":"X","ts":0,"dur":1,"pid":0,"tid":0}])");
  const Trace t = read_trace(dir_ + "/t");
  const std::string out = dir_ + "/r.html";
  write_report(out, read_metrics_log(p), &t);
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(html.find("http://"), std::string::npos);
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("</script><b>"), std::string::npos);
  EXPECT_EQ(html.find("url("), std::string::npos);
  EXPECT_EQ(html.find("@import"), std::string::npos);
  // Exactly the two scripts of the page (data and drawing) open and close.
  size_t opens = 0, at = 0;
  while ((at = html.find("<script", at)) != std::string::npos) ++opens, ++at;
  size_t closes = 0;
  at = 0;
  while ((at = html.find("</script>", at)) != std::string::npos) ++closes, ++at;
  EXPECT_EQ(opens, 2u);
  EXPECT_EQ(closes, 2u);
  EXPECT_FALSE(fs::exists(out + ".tmp." + std::to_string(getpid())));
}
