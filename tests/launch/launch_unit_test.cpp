// Unit tests of the launch layer's pieces: flags, the child environment, line splitting,
// host discovery, the summary table, the rendezvous over an in-process store.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"
#include "paratrain/launch/child_env.h"
#include "paratrain/launch/host.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/launch/options.h"
#include "paratrain/launch/output.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {
namespace {

TEST(LaunchOptions, ParsesEveryFlag) {
  auto o = parse_launch_args({"--nproc-per-node", "4", "--nnodes=3", "--node-rank", "2", "--master-addr", "10.0.0.1",
                              "--master-port", "1234", "--max-restarts", "2", "--log-dir", "/tmp/x",
                              "--rdzv-timeout", "7.5", "--grace-period", "0.5", "--", "prog", "--flag", "v"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.max_restarts, 2);
  EXPECT_EQ(o.log_dir, "/tmp/x");
  EXPECT_DOUBLE_EQ(o.rdzv_timeout_s, 7.5);
  EXPECT_DOUBLE_EQ(o.grace_period_s, 0.5);
  EXPECT_EQ(o.program, (std::vector<std::string>{"prog", "--flag", "v"}));
}

TEST(LaunchOptions, DefaultsAndTorchrunSpelling) {
  auto o = parse_launch_args({"--nproc_per_node=auto", "prog", "--nnodes", "9"});
  EXPECT_TRUE(o.nproc_auto);
  EXPECT_EQ(o.nnodes, 1);  // after the program, flags belong to it
  EXPECT_EQ(o.master_port, -1);
  EXPECT_EQ(o.program, (std::vector<std::string>{"prog", "--nnodes", "9"}));
  auto m = parse_launch_args({"--nnodes", "2", "--", "prog"});
  EXPECT_EQ(m.master_port, kDefaultMasterPort);
}

TEST(LaunchOptions, BadUsageIsOneLineInputError) {
  auto msg = [](std::vector<std::string> a) {
    try {
      parse_launch_args(a);
    } catch (const InputError& e) {
      std::string s = e.what();
      EXPECT_EQ(s.find('\n'), std::string::npos) << s;
      return s;
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({"--bogus", "1", "--", "p"}).find("unknown option '--bogus'"), std::string::npos);
  EXPECT_NE(msg({"--nnodes", "2", "--node-rank", "2", "--", "p"}).find("--node-rank 2 is outside --nnodes 2"),
            std::string::npos);
  EXPECT_NE(msg({"--nproc-per-node", "x", "--", "p"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(msg({"--nproc-per-node", "0", "--", "p"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(msg({"--master-port", "70000", "--", "p"}).find("--master-port"), std::string::npos);
  EXPECT_NE(msg({"--nnodes"}).find("needs a value"), std::string::npos);
  EXPECT_NE(msg({"--"}).find("no program"), std::string::npos);
  EXPECT_NE(msg({"-x", "p"}).find("unknown option"), std::string::npos);
}

TEST(LaunchHost, ProgramResolution) {
  EXPECT_EQ(resolve_program("/bin/sh"), "/bin/sh");
  EXPECT_NE(resolve_program("sh").find("/sh"), std::string::npos);
  EXPECT_THROW(resolve_program("/nonexistent/prog"), InputError);
  EXPECT_THROW(resolve_program("no-such-program-xyz"), InputError);
  char plain[] = "/tmp/pt_launch_plainXXXXXX";  // a file without any x bit: not executable
  int fd = ::mkstemp(plain);
  ASSERT_GE(fd, 0);
  ::fchmod(fd, 0644);
  ::close(fd);
  EXPECT_THROW(resolve_program(plain), InputError);
  ::unlink(plain);
  EXPECT_THROW(resolve_program("/tmp"), InputError);           // a directory
}

TEST(LaunchHost, CoresThreadsTokens) {
  int cpus = usable_cpu_count();
  EXPECT_GE(cpus, 1);
  auto groups = core_groups();
  ASSERT_FALSE(groups.empty());
  size_t total = 0;
  for (auto& g : groups) total += g.size();
  EXPECT_GE(total, 1u);
  EXPECT_EQ(threads_per_rank(16, 4), 4);
  EXPECT_EQ(threads_per_rank(2, 4), 1);
  EXPECT_EQ(threads_per_rank(7, 2), 3);
  auto a = make_token(), b = make_token();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
  auto c = auto_nproc_per_node();
  EXPECT_GE(c.nproc, 1);
  EXPECT_FALSE(c.reason.empty());
  std::printf("auto nproc here: %d (%s); usable cpus %d\n", c.nproc, c.reason.c_str(), cpus);
}

TEST(LaunchChildEnv, SetsTorchrunVariablesAndDropsMpiOnes) {
  RankAssignment who{5, 1, 8, 4, 1, 2};
  JobEnv job;
  job.master_addr = "h0";
  job.master_port = 4242;
  job.token = "tok";
  job.restart_count = 2;
  job.max_restarts = 3;
  job.run_id = "h0:4242";
  job.omp_threads = 3;
  job.paratrain_threads = 3;
  auto env = build_child_env({"PATH=/bin", "RANK=99", "OMPI_COMM_WORLD_RANK=1", "SLURM_PROCID=4", "PMI_RANK=3",
                              "OMP_NUM_THREADS=7", "HOME=/root"},
                             who, job);
  std::map<std::string, std::string> m;
  for (auto& kv : env) m[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
  EXPECT_EQ(m["RANK"], "5");
  EXPECT_EQ(m["LOCAL_RANK"], "1");
  EXPECT_EQ(m["WORLD_SIZE"], "8");
  EXPECT_EQ(m["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(m["GROUP_RANK"], "1");
  EXPECT_EQ(m["GROUP_WORLD_SIZE"], "2");
  EXPECT_EQ(m["ROLE_RANK"], "5");
  EXPECT_EQ(m["MASTER_ADDR"], "h0");
  EXPECT_EQ(m["MASTER_PORT"], "4242");
  EXPECT_EQ(m["PARATRAIN_TOKEN"], "tok");
  EXPECT_EQ(m["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(m["TORCHELASTIC_MAX_RESTARTS"], "3");
  EXPECT_EQ(m["TORCHELASTIC_USE_AGENT_STORE"], "False");
  EXPECT_EQ(m["PARATRAIN_STORE_EXTERNAL"], "1");
  EXPECT_EQ(m["OMP_NUM_THREADS"], "7");  // the caller's choice is kept
  EXPECT_EQ(m["PARATRAIN_THREADS"], "3");
  EXPECT_EQ(m["PATH"], "/bin");
  EXPECT_EQ(m["HOME"], "/root");
  EXPECT_EQ(m.count("OMPI_COMM_WORLD_RANK"), 0u);
  EXPECT_EQ(m.count("SLURM_PROCID"), 0u);
  EXPECT_EQ(m.count("PMI_RANK"), 0u);
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ::lseek(fd, 0, SEEK_SET);
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) s.append(buf, static_cast<size_t>(n));
  return s;
}

TEST(LaunchOutput, PrefixesWholeLinesAndKeepsTail) {
  char out_path[] = "/tmp/pt_launch_outXXXXXX";
  char log_path[] = "/tmp/pt_launch_logXXXXXX";
  int out = ::mkstemp(out_path), log = ::mkstemp(log_path);
  ASSERT_GE(out, 0);
  ASSERT_GE(log, 0);
  {
    LineSink s("[3] ", out, log, 2);
    s.feed("hel", 3);
    s.feed("lo\nwor", 6);
    s.feed("ld\r\n\nlast", 9);
    EXPECT_EQ(s.lines(), 3u);
    s.finish();
    EXPECT_EQ(s.lines(), 4u);
    ASSERT_EQ(s.tail().size(), 2u);
    EXPECT_EQ(s.tail()[0], "");
    EXPECT_EQ(s.tail()[1], "last");
  }
  EXPECT_EQ(read_all(out), "[3] hello\n[3] world\n[3] \n[3] last\n");
  EXPECT_EQ(read_all(log), "hello\nworld\n\nlast\n");
  ::close(out);
  ::close(log);
  ::unlink(out_path);
  ::unlink(log_path);
}

TEST(LaunchOutput, CutsOverlongLines) {
  char out_path[] = "/tmp/pt_launch_outXXXXXX";
  int out = ::mkstemp(out_path);
  {
    LineSink s("[0] ", out, -1, 0);
    std::string big(kMaxLineBytes + 10, 'x');
    s.feed(big.data(), big.size());
    s.finish();
    EXPECT_EQ(s.lines(), 2u);
  }
  std::string all = read_all(out);
  EXPECT_EQ(all.size(), kMaxLineBytes + 10 + 2 * 5);
  ::close(out);
  ::unlink(out_path);
}

TEST(LaunchRendezvous, NodesMeetAndNameTheMissingOne) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::milliseconds(2000));
  RoundInfo r0, r1;
  std::thread t([&] {
    NodeRendezvous n1(store, 2, 1, "test");
    r1 = n1.join(0, 3, "b", 5, nullptr);
  });
  NodeRendezvous n0(store, 2, 0, "test");
  r0 = n0.join(0, 2, "a", 5, nullptr);
  t.join();
  EXPECT_EQ(r0.world_size, 5);
  EXPECT_EQ(r1.world_size, 5);
  EXPECT_EQ(r0.rank_base, 0);
  EXPECT_EQ(r1.rank_base, 2);
  EXPECT_EQ(r1.nodes[0].host, "a");
  // Round 1: node 1 never comes. It gives up at the deadline, not before (an exact bound).
  const auto t0 = std::chrono::steady_clock::now();
  try {
    n0.join(1, 2, "a", 0.3, nullptr);
    FAIL() << "expected a timeout";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("node 1 of 2 did not arrive within 0.3 s"), std::string::npos) << e.what();
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.3);
  // Failures: the first writer wins.
  FailureInfo f{3, 1, "b", 3, false, "exit code 3"};
  EXPECT_EQ(n0.publish_failure(0, f).rank, 3);
  FailureInfo g{0, 0, "a", 9, false, "exit code 9"};
  EXPECT_EQ(n0.publish_failure(0, g).rank, 3);
  EXPECT_EQ(n0.failure(0)->exit_code, 3);
  EXPECT_FALSE(n0.failure(1).has_value());
}

TEST(LaunchSummary, MarksTheFirstFailure) {
  LaunchReport r;
  r.exit_code = 3;
  r.first_failed_rank = 1;
  r.failure = "rank 1 (node 0, h) failed with exit code 3";
  RankReport a;
  a.rank = 0;
  a.pid = 10;
  a.host = "h";
  a.exited = true;
  a.term_signal = 15;
  a.stopped = true;
  RankReport b;
  b.rank = 1;
  b.pid = 11;
  b.host = "h";
  b.exited = true;
  b.exit_code = 3;
  b.stderr_tail = {"boom"};
  r.ranks = {a, b};
  std::string s = format_summary(r, 0);
  EXPECT_NE(s.find("* 1 "), std::string::npos) << s;
  EXPECT_NE(s.find("exit code 3"), std::string::npos) << s;
  EXPECT_NE(s.find("stopped by SIGTERM"), std::string::npos) << s;
  EXPECT_NE(s.find("[1] boom"), std::string::npos) << s;
  EXPECT_NE(s.find("restarts used: 0 of 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace paratrain::launch
