// Trace files (monitor/trace_file.h): what the sink recorded becomes Chrome trace-event JSON
// that the report's reader takes back with the same spans, tracks, names, args and times;
// a TraceSession without a world writes both files; a directory that cannot be made is an
// InputError before anything is recorded.
#include "paratrain/monitor/trace_file.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>

#include "paratrain/base/error.h"
#include "paratrain/monitor/report.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

std::string temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("paratrain_trace_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d.string();
}

TEST(TraceFile, RoundTripsThroughTheReportReader) {
  trace::Recording rec;
  rec.tracks = {{1, "train"}, {2, "comm world"}};
  trace::Event step;
  step.name = "step 1";
  step.cat = "train";
  step.track = 1;
  step.start_ns = 1000;
  step.end_ns = 501000;
  trace::Event ar;
  ar.name = "allreduce";
  ar.cat = "comm";
  ar.track = 2;
  ar.start_ns = 2500;
  ar.end_ns = 4750;
  ar.nargs = 2;
  ar.args[0] = trace::Arg{"bytes", 4096, nullptr};
  ar.args[1] = trace::Arg{"dtype", 0, "f\"32"};  // escaped
  rec.events = {step, ar};
  const std::string body = monitor::trace_events_json(rec, 3, 1'700'000'000'000'000'000);
  const std::string dir = temp_dir("roundtrip");
  fs::create_directories(dir);
  const std::string path = dir + "/t.json";
  std::ofstream(path) << monitor::trace_document({body}, "{\"rank\":3}");

  std::ifstream in(path);
  nlohmann::json doc = nlohmann::json::parse(in);
  EXPECT_EQ(doc["otherData"]["rank"], 3);
  monitor::Trace t = monitor::read_trace_file(path);
  ASSERT_EQ(t.events.size(), 2u);
  EXPECT_EQ(t.process_names.at(3), "rank 3");
  EXPECT_EQ(t.thread_names.at({3, 1}), "train");
  EXPECT_EQ(t.thread_names.at({3, 2}), "comm world");
  const monitor::TraceEvent& s = t.events[0];
  EXPECT_EQ(s.name, "step 1");
  EXPECT_EQ(s.pid, 3);
  EXPECT_EQ(s.tid, 1);
  EXPECT_DOUBLE_EQ(s.dur_us, 500.0);
  EXPECT_NEAR(s.ts_us, 1.7e15 + 1.0, 1.0);  // unix microseconds
  const monitor::TraceEvent& a = t.events[1];
  EXPECT_EQ(a.name, "allreduce");
  EXPECT_EQ(a.cat, "comm");
  EXPECT_DOUBLE_EQ(a.dur_us, 2.25);
  EXPECT_EQ(a.args["bytes"], 4096);
  EXPECT_EQ(a.args["dtype"], "f\"32");
  fs::remove_all(dir);
}

TEST(TraceFile, ASessionWritesTheRankFileAndTheMergedOne) {
  const std::string dir = temp_dir("session") + "/nested";
  {
    monitor::TraceSession session(dir, 0, 3);
    EXPECT_TRUE(trace::enabled());
    for (int i = 0; i < 5; ++i) trace::Span s("work", "test");
    session.finish(nullptr);
    EXPECT_FALSE(trace::enabled());
  }
  for (const std::string& p : {monitor::rank_trace_path(dir, 0), monitor::merged_trace_path(dir)}) {
    std::ifstream in(p);
    ASSERT_TRUE(in) << p;
    nlohmann::json doc = nlohmann::json::parse(in);
    int spans = 0;
    for (const auto& e : doc["traceEvents"]) spans += e["ph"] == "X";
    EXPECT_EQ(spans, 3) << p;
  }
  std::ifstream in(monitor::merged_trace_path(dir));
  nlohmann::json merged = nlohmann::json::parse(in);
  EXPECT_EQ(merged["otherData"]["dropped_events_per_rank"], nlohmann::json::array({2}));
  EXPECT_EQ(monitor::read_trace(dir).events.size(), 3u);
  fs::remove_all(fs::path(dir).parent_path());
}

TEST(TraceFile, AnUnfinishedSessionStillWritesItsRankFile) {
  const std::string dir = temp_dir("failed");
  try {
    monitor::TraceSession session(dir, 1);
    trace::Span s("before the failure", "test");
    throw Error("the run failed");
  } catch (const Error&) {
  }
  EXPECT_TRUE(fs::exists(monitor::rank_trace_path(dir, 1)));
  EXPECT_FALSE(fs::exists(monitor::merged_trace_path(dir)));
  EXPECT_EQ(monitor::read_trace(dir).events.size(), 1u);
  fs::remove_all(dir);
}

TEST(TraceFile, ADirectoryThatCannotBeMadeIsAnInputError) {
  const std::string dir = temp_dir("blocked");
  fs::create_directories(fs::path(dir).parent_path());
  std::ofstream(dir) << "a file";
  try {
    monitor::TraceSession session(dir + "/sub", 0);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--trace " + dir + "/sub"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(trace::enabled());
  fs::remove(dir);
}

}  // namespace
