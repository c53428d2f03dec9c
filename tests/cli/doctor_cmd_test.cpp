// `paratrain doctor`: the real binary (PARATRAIN_BIN), alone and under `paratrain launch`.
// Every command runs under `timeout`; the JSON document is parsed with nlohmann::json.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "support/cpu_flags.h"
#include "support/run_binary.h"
#include "support/free_port.h"

using paratrain::test::cpuinfo_has_flag;

namespace {

using nlohmann::json;
using paratrain::test::run_shell_line;

// `env... paratrain doctor args` with stdout only (stderr dropped): rc and stdout.
paratrain::test::CommandResult doctor(const std::string& env, const std::string& args, int timeout_s = 60) {
  return run_shell_line("env " + env + " timeout " + std::to_string(timeout_s) + " " + PARATRAIN_BIN + " doctor " + args +
                        " 2>/dev/null");
}

std::map<std::string, json> by_name(const json& doc) {
  std::map<std::string, json> m;
  for (const auto& c : doc.at("checks")) m[c.at("name").get<std::string>()] = c;
  return m;
}

TEST(DoctorCmd, JsonHoldsTheChecksWithMeasuredValues) {
  auto r = doctor("PARATRAIN_THREADS=1", "--json");
  json doc = json::parse(r.out);  // throws (fails the test) if not one JSON document
  EXPECT_EQ(doc.at("schema"), "paratrain.doctor/1");
  EXPECT_EQ(doc.at("world_size"), 1);
  auto m = by_name(doc);
  for (const char* n : {"cpu.model", "cpu.cores", "cpu.vector", "cpu.threads", "cpu.governor", "memory.available",
                        "memory.limit", "clock.source", "clock.steady", "clock.sync", "blas.library", "blas.gemm",
                        "kernels.dispatch", "kernels.cpu", "comm.backends", "comm.mpi", "comm.shm", "comm.ports",
                        "comm.host", "cuda.build", "cuda.driver", "cuda.gpus", "cuda.arch", "cuda.p2p", "cuda.nvlink",
                        "cuda.runtime", "cuda.nccl", "env.variables", "env.PARATRAIN_THREADS"})
    EXPECT_TRUE(m.count(n)) << "missing check " << n;
  const std::set<std::string> statuses = {"pass", "warn", "fail", "skip"};
  int fails = 0;
  std::map<std::string, int> counts;
  for (const auto& c : doc.at("checks")) {
    const std::string st = c.at("status");
    EXPECT_TRUE(statuses.count(st)) << c.dump();
    ++counts[st];
    if (st == "fail") ++fails;
    if (st == "warn" || st == "fail") EXPECT_FALSE(c.at("fix").get<std::string>().empty()) << c.dump();
  }
  for (const auto& s : statuses) EXPECT_EQ(doc.at("summary").at(s), counts[s]) << s;
  EXPECT_EQ(r.rc, fails > 0 ? 1 : 0);
  EXPECT_EQ(doc.at("ok"), fails == 0);

  EXPECT_EQ(m["cpu.cores"]["data"]["cores"].get<int>(), static_cast<int>(std::thread::hardware_concurrency()));
  EXPECT_EQ(m["cpu.vector"]["data"]["avx2"].get<bool>(), cpuinfo_has_flag("avx2"));
  EXPECT_EQ(m["cpu.vector"]["data"]["fma"].get<bool>(), cpuinfo_has_flag("fma"));
  EXPECT_EQ(m["cpu.threads"]["data"]["threads"], 1);
  EXPECT_EQ(m["blas.gemm"]["status"], "pass");
  EXPECT_LT(m["blas.gemm"]["data"]["max_rel_error"].get<double>(), 1e-4);
  EXPECT_GT(m["blas.gemm"]["data"]["gflops_256"].get<double>(), 0);
  EXPECT_EQ(m["clock.steady"]["status"], "pass");
  EXPECT_EQ(m["kernels.cpu"]["status"], "pass");
  EXPECT_EQ(m["env.PARATRAIN_THREADS"]["status"], "pass");
  // No driver on the machine: a skip with the reason, never a failure.
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (cuda == nullptr) {
    EXPECT_EQ(m["cuda.driver"]["status"], "skip");
    EXPECT_NE(m["cuda.driver"]["value"].get<std::string>().find("no NVIDIA driver"), std::string::npos);
  } else {
    dlclose(cuda);
    EXPECT_NE(m["cuda.driver"]["status"], "fail");
  }
  // /dev/shm: the figures are statvfs's.
  EXPECT_GT(m["comm.shm"]["data"]["total_bytes"].get<double>(), 0);
  EXPECT_GT(m["comm.shm"]["data"]["needed_bytes"].get<double>(), 0);
  // The variables in effect: every declared one, the set one with its value.
  bool threads_listed = false;
  for (const auto& v : doc.at("variables"))
    if (v.at("name") == "PARATRAIN_THREADS") threads_listed = v.at("value") == "1" && v.at("source") == "set";
  EXPECT_TRUE(threads_listed);
}

TEST(DoctorCmd, UnknownVariableIsAWarningNamingTheNearestOne) {
  auto r = doctor("PARATRAIN_THREADS=1 PARATRAIN_THRAEDS=2", "--json");
  json doc = json::parse(r.out);
  auto m = by_name(doc);
  ASSERT_TRUE(m.count("env.PARATRAIN_THRAEDS")) << r.out;
  EXPECT_EQ(m["env.PARATRAIN_THRAEDS"]["status"], "warn");
  EXPECT_EQ(m["env.PARATRAIN_THRAEDS"]["data"]["nearest"], "PARATRAIN_THREADS");
  EXPECT_NE(m["env.PARATRAIN_THRAEDS"]["fix"].get<std::string>().find("PARATRAIN_THREADS"), std::string::npos);
  EXPECT_EQ(doc.at("summary").at("fail"), 0) << r.out;
  EXPECT_EQ(r.rc, 0);
}

TEST(DoctorCmd, MalformedThreadsIsAFailureAndExitCodeOne) {
  auto r = doctor("PARATRAIN_THREADS=abc", "--json");
  EXPECT_EQ(r.rc, 1);
  auto m = by_name(json::parse(r.out));
  EXPECT_EQ(m["env.PARATRAIN_THREADS"]["status"], "fail");
  EXPECT_NE(m["env.PARATRAIN_THREADS"]["value"].get<std::string>().find("abc"), std::string::npos);
  // The table says the same on the check's line, with its fix.
  auto t = doctor("PARATRAIN_THREADS=abc", "");
  EXPECT_EQ(t.rc, 1);
  std::istringstream is(t.out);
  std::string line, failed_line;
  while (std::getline(is, line))
    if (line.rfind("FAIL", 0) == 0 && line.find("env.PARATRAIN_THREADS") != std::string::npos) failed_line = line;
  EXPECT_NE(failed_line.find("fix:"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("FAILED"), std::string::npos);
}

TEST(DoctorCmd, TableHasOneLinePerCheck) {
  auto j = doctor("PARATRAIN_THREADS=1", "--json");
  auto t = doctor("PARATRAIN_THREADS=1", "");
  json doc = json::parse(j.out);
  std::vector<std::string> names;
  std::istringstream is(t.out);
  std::string line;
  while (std::getline(is, line))
    for (const char* st : {"PASS ", "WARN ", "FAIL ", "SKIP "})
      if (line.rfind(st, 0) == 0) {
        std::istringstream ls(line);
        std::string status, name;
        ls >> status >> name;
        names.push_back(name);
      }
  std::vector<std::string> expected;
  for (const auto& c : doc.at("checks")) expected.push_back(c.at("name"));
  EXPECT_EQ(names, expected) << t.out;
  EXPECT_NE(t.out.find("PARATRAIN_* variables in effect"), std::string::npos);
  EXPECT_EQ(t.rc, j.rc);
}

TEST(DoctorCmd, BadUsageExitsTwo) {
  auto r = paratrain::test::run_paratrain("doctor --no-such-flag", 30);
  EXPECT_EQ(r.rc, 2) << r.out;
}

// Under the launcher: the ranks meet at the launcher's store, all-reduce on shm and tcp
// (checked element by element) and time 1 MiB; rank 0 prints the job's report.
TEST(DoctorCmd, UnderTheLauncherChecksTheJob) {
  const std::string out_file = ::testing::TempDir() + "doctor_launch.json";
  std::remove(out_file.c_str());
  auto r = run_shell_line(std::string("timeout 90 ") + PARATRAIN_BIN + " launch --nproc-per-node 2 -- " + PARATRAIN_BIN +
                          " doctor --json --allreduce-mib 1 --timeout 20 -o " + out_file + " 2>/dev/null");
  // The launcher prefixes each line with "[<rank>] "; only rank 0 prints.
  std::istringstream is(r.out);
  std::string line, text;
  while (std::getline(is, line)) {
    ASSERT_EQ(line.rfind("[0] ", 0), 0u) << "a line not from rank 0: " << line;
    text += line.substr(4) + "\n";
  }
  json doc = json::parse(text);
  EXPECT_EQ(doc.at("world_size"), 2);
  EXPECT_EQ(doc.at("rank"), 0);
  auto m = by_name(doc);
  EXPECT_EQ(m["job.store"]["status"], "pass") << m["job.store"].dump();
  EXPECT_EQ(m["job.ranks"]["data"]["world_size"], 2);
  for (const char* b : {"job.allreduce.shm", "job.allreduce.tcp"}) {
    ASSERT_TRUE(m.count(b)) << b;
    EXPECT_EQ(m[b]["status"], "pass") << m[b].dump();
    EXPECT_EQ(m[b]["data"]["ranks"], 2);
    EXPECT_EQ(m[b]["data"]["wrong"], 0);
    EXPECT_EQ(m[b]["data"]["bytes"].get<double>(), 1 << 20);
    const double algbw = m[b]["data"]["algbw_gbps"], busbw = m[b]["data"]["busbw_gbps"];
    EXPECT_GT(busbw, 0);
    EXPECT_DOUBLE_EQ(busbw, algbw * 2.0 * (2 - 1) / 2);  // nccl-tests: busbw = algbw x 2(n-1)/n
  }
  // One machine, one clock: what the check measures is how late the ranks woke after each
  // barrier (best of 5). That is a few microseconds, but on a loaded CI machine every round
  // can lose 10 ms to the scheduler, which the check rightly calls a warning. Beyond a second
  // the offsets would be computed wrongly.
  const std::string skew_status = m["job.clock_skew"]["status"];
  const double skew_us = m["job.clock_skew"]["data"]["skew_us"];
  EXPECT_TRUE(skew_status == "pass" || skew_status == "warn") << m["job.clock_skew"].dump();
  EXPECT_EQ(skew_status == "pass", skew_us <= 10000) << m["job.clock_skew"].dump();
  EXPECT_LT(skew_us, 1e6) << m["job.clock_skew"].dump();
  EXPECT_EQ(m["job.clock_skew"]["data"]["offsets_us"].size(), 2u);
  EXPECT_EQ(r.rc, doc.at("ok").get<bool>() ? 0 : 1);
  // -o wrote the same document.
  std::ifstream f(out_file);
  ASSERT_TRUE(f.good());
  json written = json::parse(f);
  EXPECT_EQ(written.at("checks").size(), doc.at("checks").size());
}

}  // namespace

namespace {

using paratrain::test::free_port;

// Two ranks started by hand (torchrun's variables; rank 0 hosts the store on MASTER_PORT),
// rank 1 alone with a malformed PARATRAIN_PROFILE: rank 0's report names rank 1's failure,
// and both ranks exit 1 (the job's verdict).
TEST(DoctorCmd, RankZeroReportsAnotherRanksFailure) {
  const std::string rc_file = ::testing::TempDir() + "doctor_rank1.rc";
  std::remove(rc_file.c_str());
  const std::string common = "env RANK=%R WORLD_SIZE=2 LOCAL_RANK=%R LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
                             std::to_string(free_port()) + " PARATRAIN_TOKEN=doctortest PARATRAIN_THREADS=1 ";
  auto with_rank = [&](const std::string& r) {
    std::string s = common;
    for (size_t p; (p = s.find("%R")) != std::string::npos;) s.replace(p, 2, r);
    return s;
  };
  const std::string bin = std::string(" timeout 60 ") + PARATRAIN_BIN + " doctor --json --allreduce-mib 0.25 --timeout 20";
  auto r = run_shell_line("(" + with_rank("1") + "PARATRAIN_PROFILE=maybe" + bin + " >/dev/null 2>&1; echo $? > " + rc_file +
                          ") & " + with_rank("0") + bin + " 2>/dev/null; rc=$?; wait; exit $rc");
  json doc = json::parse(r.out);
  EXPECT_EQ(r.rc, 1);
  bool named = false;
  for (const auto& c : doc.at("checks"))
    if (c.at("name") == "env.PARATRAIN_PROFILE") named = c.at("rank") == 1 && c.at("status") == "fail";
  EXPECT_TRUE(named) << doc.dump(2);
  auto m = by_name(doc);
  EXPECT_EQ(m["job.store"]["status"], "pass") << m["job.store"].dump();
  EXPECT_NE(m["job.store"]["value"].get<std::string>().find("MASTER_PORT"), std::string::npos);
  EXPECT_EQ(m["job.allreduce.tcp"]["status"], "pass");
  std::ifstream f(rc_file);
  int rank1_rc = -1;
  f >> rank1_rc;
  EXPECT_EQ(rank1_rc, 1);
}

}  // namespace
