// FlightRecorder: the bounded ring, the states and fields of a record, the JSON dump and the
// progress file, the dump on a failure; the groups' calls land in the process-wide recorder;
// Work::wait(timeout) names a lazily described operation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "comm/comm_check.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/comm/work.h"

using namespace paratrain;
using namespace paratrain::comm;

namespace {

std::string temp_dir(const std::string& what) {
  auto d = std::filesystem::temp_directory_path() / ("paratrain_fr_" + what + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(FlightRecorder, RingIsBoundedAndKeepsTheNewestOldestFirst) {
  FlightRecorder fr(4);
  int g = fr.add_group("", "shm", 0, 2, {});
  for (int i = 0; i < 10; ++i) fr.record(g, static_cast<uint64_t>(i), OpType::kAllreduce, DType::F32, 8, ReduceOp::kSum, -1, 0);
  auto recs = fr.snapshot();
  ASSERT_EQ(recs.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(recs[i].id, 7 + i);
    EXPECT_EQ(recs[i].seq, 6 + i);
    EXPECT_EQ(recs[i].coll, static_cast<int64_t>(6 + i));
  }
}

TEST(FlightRecorder, RecordsStatesAndFields) {
  FlightRecorder fr(16);
  int g = fr.add_group("", "tcp", 1, 3, {});
  EXPECT_EQ(fr.group(g)->name, "world");
  EXPECT_EQ(fr.group(g)->ranks, (std::vector<int>{0, 1, 2}));
  uint64_t a = fr.record(g, 0, OpType::kAllreduce, DType::BF16, 100, ReduceOp::kMax, -1, 0);
  uint64_t s = fr.record(g, 1, OpType::kSend, DType::F32, 5, ReduceOp::kSum, 2, 7);
  uint64_t b = fr.record(g, 2, OpType::kBroadcast, DType::I64, 3, ReduceOp::kSum, 0, 0);
  fr.started(a);
  fr.finished(a);
  fr.started(s);
  fr.finished(b, std::make_exception_ptr(CommError("boom")));
  auto recs = fr.snapshot();
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].state, RecordState::kCompleted);
  EXPECT_EQ(recs[0].op, OpType::kAllreduce);
  EXPECT_EQ(recs[0].dtype, DType::BF16);
  EXPECT_EQ(recs[0].reduce_op, ReduceOp::kMax);
  EXPECT_EQ(recs[0].count, 100u);
  EXPECT_EQ(recs[0].bytes, 200u);
  EXPECT_EQ(recs[0].coll, 0);
  EXPECT_GT(recs[0].enqueued_ns, 0);
  EXPECT_GE(recs[0].started_ns, recs[0].enqueued_ns);
  EXPECT_GE(recs[0].finished_ns, recs[0].started_ns);
  EXPECT_EQ(recs[1].state, RecordState::kStarted);
  EXPECT_EQ(recs[1].coll, -1);  // send/recv are no collective
  EXPECT_EQ(recs[1].peer, 2);
  EXPECT_EQ(recs[1].tag, 7);
  EXPECT_EQ(recs[1].finished_ns, 0);
  EXPECT_EQ(recs[2].state, RecordState::kFailed);
  EXPECT_EQ(recs[2].coll, 1);
  EXPECT_EQ(recs[2].peer, 0);
}

TEST(FlightRecorder, BusBytesFollowNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kAllreduce, 4000, 4), 4000 * 2.0 * 3 / 4);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kAllgather, 1000, 4), 1000 * 3.0);  // total 4000 x (n-1)/n
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kReduceScatter, 1000, 4), 1000 * 3.0);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kAllToAll, 1000, 2), 1000.0);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kBroadcast, 1000, 8), 1000.0);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kSend, 1000, 2), 1000.0);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kAllreduce, 1000, 1), 0.0);
  EXPECT_DOUBLE_EQ(bus_bytes(OpType::kBarrier, 0, 4), 0.0);
}

TEST(FlightRecorder, TrafficSumsCompletedCallsPerGroup) {
  FlightRecorder fr(16);
  const int g = fr.add_group("dp", "shm", 0, 4, {});
  const int h = fr.add_group("tp", "shm", 0, 2, {});
  const GroupTraffic before = fr.traffic(g);
  EXPECT_EQ(before.calls, 0u);
  const uint64_t a = fr.record(g, 0, OpType::kAllreduce, DType::F32, 1000, ReduceOp::kSum, -1, 0);
  const uint64_t b = fr.record(g, 1, OpType::kAllgather, DType::BF16, 500, ReduceOp::kSum, -1, 0);
  const uint64_t c = fr.record(g, 2, OpType::kAllreduce, DType::F32, 7, ReduceOp::kSum, -1, 0);
  const uint64_t d = fr.record(h, 0, OpType::kSend, DType::F32, 10, ReduceOp::kSum, 1, 0);
  fr.started(a);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  fr.finished(a);
  fr.started(b);
  fr.finished(b);
  fr.finished(c, std::make_exception_ptr(CommError("boom")));  // a failure moves nothing
  const GroupTraffic t = fr.traffic(g);
  EXPECT_EQ(t.calls, 2u);
  EXPECT_EQ(t.bytes, 4000u + 1000u);
  EXPECT_DOUBLE_EQ(t.bus_bytes, 4000 * 1.5 + 1000 * 3.0);
  EXPECT_GE(t.busy_ns, 2000000);  // a's 2 ms at least
  EXPECT_NEAR(t.busbw_gbps_since(before), t.bus_bytes / static_cast<double>(t.busy_ns), 1e-12);
  EXPECT_EQ(fr.traffic(h).calls, 0u);  // d has not finished
  fr.finished(d);
  EXPECT_EQ(fr.traffic(h).bytes, 40u);
  EXPECT_EQ(t.busbw_gbps_since(t), 0.0);  // nothing between two equal snapshots
  EXPECT_EQ(fr.traffic(99).calls, 0u);
}

TEST(FlightRecorder, AnOverwrittenRecordIsNotTouchedAndZeroCapacityIsOff) {
  FlightRecorder fr(2);
  int g = fr.add_group("mine", "shm", 0, 1, {});
  uint64_t old = fr.record(g, 0, OpType::kBarrier, DType::U8, 0, ReduceOp::kSum, -1, 0);
  fr.record(g, 1, OpType::kBarrier, DType::U8, 0, ReduceOp::kSum, -1, 0);
  fr.record(g, 2, OpType::kBarrier, DType::U8, 0, ReduceOp::kSum, -1, 0);  // reuses old's slot
  fr.finished(old);
  for (const auto& r : fr.snapshot()) EXPECT_EQ(r.state, RecordState::kScheduled);

  FlightRecorder off(0);
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.add_group("", "shm", 0, 1, {}), -1);
  EXPECT_EQ(off.record(0, 0, OpType::kAllreduce, DType::F32, 1, ReduceOp::kSum, -1, 0), 0u);
  EXPECT_TRUE(off.snapshot().empty());
}

TEST(FlightRecorder, DumpIsJsonWithGroupsLastCompletedAndPending) {
  const std::string dir = temp_dir("dump");
  {
    FlightRecorder fr(8, dir, 3);
    int w = fr.add_group("", "shm", 1, 4, {});
    int sub = fr.add_group("world/0", "shm", 0, 2, {1, 3});
    fr.finished(fr.record(w, 0, OpType::kAllreduce, DType::F32, 4, ReduceOp::kSum, -1, 0));
    uint64_t p = fr.record(w, 1, OpType::kAllgather, DType::F32, 6, ReduceOp::kSum, -1, 0);
    fr.started(p);
    fr.record(sub, 0, OpType::kRecv, DType::I32, 2, ReduceOp::kSum, 1, 9);
    std::string path = fr.dump("test");
    EXPECT_EQ(path, flight_dump_path(dir, 3));
    auto j = nlohmann::json::parse(slurp(path));
    EXPECT_EQ(j["format"], "paratrain-flight-recorder/1");
    EXPECT_EQ(j["rank"], 3);
    EXPECT_EQ(j["pid"], ::getpid());
    EXPECT_EQ(j["reason"], "test");
    EXPECT_FALSE(j["host"].get<std::string>().empty());
    ASSERT_EQ(j["groups"].size(), 2u);
    EXPECT_EQ(j["groups"][0]["name"], "world");
    EXPECT_EQ(j["groups"][0]["size"], 4);
    EXPECT_EQ(j["groups"][0]["last_completed"]["op"], "allreduce");
    EXPECT_EQ(j["groups"][0]["last_completed"]["state"], "completed");
    ASSERT_EQ(j["groups"][0]["pending"].size(), 1u);
    EXPECT_EQ(j["groups"][0]["pending"][0]["op"], "allgather");
    EXPECT_EQ(j["groups"][0]["pending"][0]["state"], "started");
    EXPECT_EQ(j["groups"][0]["pending"][0]["seq"], 1);
    EXPECT_GT(j["groups"][0]["pending"][0]["started_s"].get<double>(), 1.6e9);  // wall clock
    EXPECT_EQ(j["groups"][1]["ranks"], nlohmann::json::array({1, 3}));
    EXPECT_TRUE(j["groups"][1]["last_completed"].is_null());
    EXPECT_EQ(j["groups"][1]["pending"][0]["op"], "recv");
    EXPECT_EQ(j["groups"][1]["pending"][0]["peer"], 1);
    EXPECT_EQ(j["groups"][1]["pending"][0]["tag"], 9);
    ASSERT_EQ(j["records"].size(), 3u);
    EXPECT_EQ(j["records"][0]["bytes"], 16);
    EXPECT_EQ(j["records"][2]["dtype"], "i32");

    // The progress file: counters and the last issued and finished calls. It was made whole
    // under a temporary name and renamed (none is left behind).
    EXPECT_EQ(std::filesystem::file_size(flight_progress_path(dir, 3)), sizeof(FlightProgress));
    for (const auto& e : std::filesystem::directory_iterator(dir))
      EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();
    auto prog = read_flight_progress(flight_progress_path(dir, 3));
    ASSERT_TRUE(prog.has_value());
    EXPECT_EQ(prog->pid, ::getpid());
    EXPECT_EQ(prog->rank, 3);
    EXPECT_EQ(prog->issued, 3u);
    EXPECT_EQ(prog->finished, 1u);
    EXPECT_EQ(prog->dumps, 1u);
    EXPECT_EQ(prog->last_issued.op, static_cast<uint8_t>(OpType::kRecv));
    EXPECT_STREQ(prog->last_issued.group, "world/0");
    EXPECT_EQ(prog->last_finished.op, static_cast<uint8_t>(OpType::kAllreduce));
    EXPECT_STREQ(prog->last_finished.group, "world");
  }
  std::filesystem::remove_all(dir);
}

// A progress file shorter than its record (seen empty, between another process's create and
// its size) reads as nothing: mapping past a file's end would raise SIGBUS in the reader
// (FlightRecorderProcesses.Sigusr1WritesADumpAndTheRankContinues died so once under CI).
TEST(FlightRecorder, AShortProgressFileReadsAsNothing) {
  const std::string dir = temp_dir("short");
  std::filesystem::create_directories(dir);
  const std::string path = flight_progress_path(dir, 0);
  for (size_t bytes : {size_t{0}, size_t{8}, sizeof(FlightProgress) - 1}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << std::string(bytes, '\0');
    EXPECT_FALSE(read_flight_progress(path).has_value()) << bytes << " bytes";
  }
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, AFailedCallWritesADumpNamingTheTimeout) {
  const std::string dir = temp_dir("fail");
  {
    FlightRecorder fr(8, dir, 0);
    int g = fr.add_group("", "tcp", 0, 2, {});
    uint64_t id = fr.record(g, 4, OpType::kAllreduce, DType::F32, 1, ReduceOp::kSum, -1, 0);
    fr.finished(id, std::make_exception_ptr(TimeoutError("rank 0: allreduce #4 passed its deadline")));
    auto j = nlohmann::json::parse(slurp(flight_dump_path(dir, 0)));
    EXPECT_EQ(j["reason"], "timeout");
    EXPECT_EQ(j["failure"], "rank 0: allreduce #4 passed its deadline");
    EXPECT_EQ(j["records"][0]["state"], "failed");
  }
  std::filesystem::remove_all(dir);
}

TEST(FlightRecorder, GroupsRecordTheirCallsInTheProcessRecorder) {
  FlightRecorder& fr = FlightRecorder::instance();
  ASSERT_TRUE(fr.enabled());
  const uint64_t before = fr.snapshot().empty() ? 0 : fr.snapshot().back().id;
  ProcessGroupOptions o;
  o.backend = "tcp";
  o.timeout_s = 30;
  auto errors = paratrain::comm::testing::run_thread_ranks(2, o, [&](int r, std::shared_ptr<ProcessGroup>& pg) {
    std::vector<float> x(10, 1.0f);
    pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    if (r == 0) pg->send(x.data(), 3, DType::F32, 1, 5)->wait();
    else pg->recv(x.data(), 3, DType::F32, 0, 5)->wait();
    pg->broadcast(x.data(), 2, DType::F32, 1)->wait();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  int allreduces = 0, sends = 0, recvs = 0, broadcasts = 0;
  for (const auto& r : fr.snapshot()) {
    if (r.id <= before) continue;
    EXPECT_EQ(r.state, RecordState::kCompleted);
    if (r.op == OpType::kAllreduce) {
      ++allreduces;
      EXPECT_EQ(r.bytes, 40u);
    }
    if (r.op == OpType::kSend) {
      ++sends;
      EXPECT_EQ(r.peer, 1);
      EXPECT_EQ(r.tag, 5);
    }
    if (r.op == OpType::kRecv) {
      ++recvs;
      EXPECT_EQ(r.peer, 0);
    }
    if (r.op == OpType::kBroadcast) {
      ++broadcasts;
      EXPECT_EQ(r.peer, 1);
      EXPECT_EQ(r.seq, 2u);
    }
  }
  EXPECT_EQ(allreduces, 2);
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(recvs, 1);
  EXPECT_EQ(broadcasts, 2);
}

TEST(Work, WaitWithATimeoutNamesALazilyDescribedOperation) {
  Work w(std::function<std::string()>([] { return std::string("allreduce #3 (f32 x 4, 16 bytes, sum)"); }));
  try {
    w.wait(std::chrono::milliseconds(20));
    FAIL() << "no timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("allreduce #3 (f32 x 4, 16 bytes, sum) did not complete within 20 ms"),
              std::string::npos)
        << e.what();
  }
  w.finish();
  w.wait(std::chrono::milliseconds(20));
}

// on_finished: a callback added before finish() runs once, on the finishing thread, after the
// Work is complete; one added after runs at once on the adding thread.
TEST(Work, OnFinishedRunsOnceWhenTheWorkFinishes) {
  Work w(std::string("recv #1"));
  int runs = 0;
  bool complete_when_run = false;
  std::thread::id ran_on;
  w.on_finished([&] { ++runs, complete_when_run = w.is_completed(), ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(runs, 0);
  std::thread finisher([&] { w.finish(); });
  const std::thread::id finisher_id = finisher.get_id();
  finisher.join();
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(complete_when_run);
  EXPECT_EQ(ran_on, finisher_id);
  int late = 0;
  w.on_finished([&] { ++late; });
  EXPECT_EQ(late, 1);
  EXPECT_EQ(runs, 1);
}

// wait_ignoring_failure: waits as wait() does (a timeout included) and throws nothing; the
// failure stays with the Work for its owner.
TEST(Work, WaitIgnoringFailureWaitsAndKeepsTheFailure) {
  Work failed(std::string("allreduce #3"));
  std::thread finisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    failed.finish(std::make_exception_ptr(CommError("rank 1 left")));
  });
  failed.wait_ignoring_failure();
  EXPECT_TRUE(failed.is_completed());  // it waited for the finish
  finisher.join();
  EXPECT_THROW(failed.wait(), CommError);
  EXPECT_EQ(failed.error_message(), "rank 1 left");
  Work running(std::string("recv #4"));
  running.wait_ignoring_failure(std::chrono::milliseconds(10));  // the TimeoutError stays inside
  EXPECT_FALSE(running.is_completed());
  running.finish();
}

}  // namespace
