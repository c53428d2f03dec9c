// A rank program for the multi-process comm tests. Started N times with RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT (or by mpirun). Usage: process_group_helper MODE
//   ops       every op, dtype and count (0, 1, N-1, a prime, ~4 MiB); rank-ordered check
//   kill      the last rank SIGKILLs itself after a few collectives; the others must get a
//             CommError naming it within the peer timeout
//   mismatch  rank 0 calls allreduce, the others broadcast (run with PARATRAIN_DEBUG=detail)
//   deadline  rank 1 joins its allreduce only after rank 0 timed out; rank 0 must name rank 1
//   p2p_swap  2 ranks: each sends 64 MiB to the other first, then receives (both must
//             complete, data exact)
//   p2p_ring  every rank sends to its next and previous rank at once, messages around the
//             eager limit, the slot and the staging size on one tag each, and only then
//             posts the recvs (in reverse order); data exact
//   p2p_kill  2 ranks: rank 1 SIGKILLs itself while rank 0 waits for its send; rank 0 must
//             get a CommError naming rank 1 well before its deadline
//   p2p_bw    2 ranks: prints the bandwidth of 64 MiB messages, one way (rank 0 -> 1) and
//             both ways at once (a figure for docs/comm.md, never asserted)
// Exit code 0 when the rank saw what it should; the failure is printed otherwise.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace paratrain::comm::testing;

static int ops() {
  auto pg = create_process_group_from_env();
  const int n = pg->size();
  Report rep;
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64})
    for (size_t count : {size_t(0), size_t(1), size_t(n > 1 ? n - 1 : 2), size_t(101)}) run_all_ops(*pg, dt, count, rep);
  run_all_ops(*pg, DType::F32, (1u << 20) + 3, rep);
  if (rep.wrong) {
    std::fprintf(stderr, "rank %d: %zu wrong elements; first: %s\n", pg->rank(), rep.wrong, rep.first.c_str());
    return 1;
  }
  std::printf("rank %d ok (%s)\n", pg->rank(), pg->backend_name().c_str());
  return 0;
}

static int deterministic() {
  ProcessGroupOptions o;
  o.deterministic = true;
  auto pg = create_process_group_from_env(o);
  const int n = pg->size();
  for (size_t count : {size_t(1), size_t(12345), size_t(1000003)}) {
    auto want = in_order_sum(n, count);
    auto x = random_floats(pg->rank(), count);
    pg->allreduce(x.data(), count, DType::F32)->wait();
    if (std::memcmp(x.data(), want.data(), count * 4) != 0) {
      std::fprintf(stderr, "rank %d: rank-ordered allreduce of %zu floats differs from the in-order sum\n", pg->rank(),
                   count);
      return 1;
    }
  }
  std::printf("rank %d deterministic ok\n", pg->rank());
  return 0;
}

static int kill_mode() {
  auto pg = create_process_group_from_env();
  const int n = pg->size(), victim = n - 1;
  std::vector<float> x(1 << 16, 1.f);
  if (pg->rank() == victim) {
    // The victim takes part in three all-reduces and dies. It may finish the third before
    // the others have, so the survivors count their first three calls inside the try below.
    for (int i = 0; i < 3; ++i) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  auto t0 = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100003; ++i) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    std::fprintf(stderr, "rank %d: no failure after the peer was killed\n", pg->rank());
    return 1;
  } catch (const CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d noticed in %.2f s: %s\n", pg->rank(), s, e.what());
    std::string want = "rank " + std::to_string(victim);
    if (std::string(e.what()).find(want) == std::string::npos) return 1;
    // Later calls fail at once.
    try {
      pg->barrier()->wait();
      return 1;
    } catch (const CommError&) {
    }
    return s < 10.0 ? 0 : 1;
  }
}

static int mismatch() {
  auto pg = create_process_group_from_env();
  std::vector<float> x(64, 1.f);
  try {
    if (pg->rank() == 0) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    else pg->broadcast(x.data(), 32, DType::F32, 0)->wait();
  } catch (const CommError& e) {
    std::printf("rank %d: %s\n", pg->rank(), e.what());
    std::string m = e.what();
    return m.find("mismatch") != std::string::npos && m.find("allreduce") != std::string::npos &&
                   m.find("broadcast") != std::string::npos
               ? 0
               : 1;
  }
  std::fprintf(stderr, "rank %d: mismatch not detected\n", pg->rank());
  return 1;
}

// Rank 1 joins only once rank 0 has timed out (an event: rank 0 writes a file, named by
// MASTER_PORT, that rank 1 removed before the rendezvous), never after a fixed sleep.
// The flight recorder under mpirun (PARATRAIN_FR_DUMP_DIR set by the test): three
// allreduces, then each rank sends itself SIGUSR1 and waits (10 s at most) for its dump.
static int fr_usr1() {
  auto pg = create_process_group_from_env();
  std::vector<float> x(256, 1.f);
  for (int i = 0; i < 3; ++i) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  const char* dir = std::getenv("PARATRAIN_FR_DUMP_DIR");
  if (!dir) return 3;
  const std::string dump = std::string(dir) + "/rank_" + std::to_string(pg->rank()) + ".fr.json";
  ::raise(SIGUSR1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::access(dump.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (::access(dump.c_str(), F_OK) != 0) {
    std::fprintf(stderr, "rank %d: no dump at %s after SIGUSR1\n", pg->rank(), dump.c_str());
    return 1;
  }
  pg->barrier()->wait();
  std::printf("rank %d: dumped (%s)\n", pg->rank(), pg->backend_name().c_str());
  return 0;
}

static int deadline() {
  const char* port = std::getenv("MASTER_PORT");
  const std::string gone = std::string("/tmp/paratrain_pg_deadline_") + (port ? port : "0") + ".done";
  if (std::getenv("RANK") && std::string(std::getenv("RANK")) == "1") ::unlink(gone.c_str());
  auto pg = create_process_group_from_env();
  std::vector<float> x(1000, 1.f);
  if (pg->rank() == 1) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // a hang bound
    while (::access(gone.c_str(), F_OK) != 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ::unlink(gone.c_str());
    try {
      pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    } catch (const Error&) {
    }
    return 0;
  }
  auto done = [&] {
    if (FILE* f = std::fopen(gone.c_str(), "w")) std::fclose(f);
  };
  try {
    pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  } catch (const TimeoutError& e) {
    done();
    std::printf("rank %d: %s\n", pg->rank(), e.what());
    return std::string(e.what()).find("not heard from: 1") != std::string::npos ? 0 : 1;
  }
  done();
  std::fprintf(stderr, "rank %d: no TimeoutError: the allreduce waited until rank 1 joined\n", pg->rank());
  return 1;
}

// Element i of the message number k from rank src to rank dst.
static int32_t p2p_value(int src, int dst, int k, size_t i) {
  return int32_t(uint32_t(i) * 2654435761u ^ uint32_t(src * 1000003 + dst * 7919 + k * 131));
}

static size_t p2p_wrong(const std::vector<int32_t>& got, int src, int dst, int k) {
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != p2p_value(src, dst, k, i);
  return wrong;
}

static int p2p_swap() {
  auto pg = create_process_group_from_env();
  if (pg->size() != 2) return 2;
  const int r = pg->rank(), peer = 1 - r;
  const size_t count = size_t(16) << 20;  // 64 MiB of i32
  std::vector<int32_t> out(count), in(count, 0);
  for (size_t i = 0; i < count; ++i) out[i] = p2p_value(r, peer, 0, i);
  auto s = pg->send(out.data(), count, DType::I32, peer, 3);
  auto v = pg->recv(in.data(), count, DType::I32, peer, 3);
  s->wait();
  v->wait();
  if (size_t wrong = p2p_wrong(in, peer, r, 0)) {
    std::fprintf(stderr, "rank %d: %zu wrong elements of 64 MiB\n", r, wrong);
    return 1;
  }
  std::printf("rank %d p2p_swap ok (%s)\n", r, pg->backend_name().c_str());
  return 0;
}

static int p2p_ring() {
  auto pg = create_process_group_from_env();
  const int n = pg->size(), r = pg->rank();
  if (n < 2) return 2;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  // i32 elements: the eager limit (64 KiB), one slot less its frame header (512 KiB - 32
  // bytes), the staging ring (4 MiB), each just below, at and above.
  const std::vector<size_t> counts = {0,      1,      16383,  16384,  16385,   131063,
                                      131064, 131065, 1048575, 1048576, 1048577};
  const int K = int(counts.size());
  std::vector<std::vector<int32_t>> to_next(K), to_prev(K), from_next(K), from_prev(K);
  std::vector<WorkPtr> works;
  for (int k = 0; k < K; ++k) {
    to_next[k].resize(counts[k]);
    to_prev[k].resize(counts[k]);
    from_next[k].assign(counts[k], 0);
    from_prev[k].assign(counts[k], 0);
    for (size_t i = 0; i < counts[k]; ++i) {
      to_next[k][i] = p2p_value(r, next, k, i);
      to_prev[k][i] = p2p_value(r, prev, k, i);
    }
    // With 2 ranks next == prev: the tags keep the two directions' messages apart.
    works.push_back(pg->send(to_next[k].data(), counts[k], DType::I32, next, 100 + k));
    works.push_back(pg->send(to_prev[k].data(), counts[k], DType::I32, prev, 200 + k));
  }
  for (int k = K - 1; k >= 0; --k) {
    works.push_back(pg->recv(from_prev[k].data(), counts[k], DType::I32, prev, 100 + k));
    works.push_back(pg->recv(from_next[k].data(), counts[k], DType::I32, next, 200 + k));
  }
  for (auto& w : works) w->wait();
  size_t wrong = 0;
  for (int k = 0; k < K; ++k) wrong += p2p_wrong(from_prev[k], prev, r, k) + p2p_wrong(from_next[k], next, r, k);
  if (wrong) {
    std::fprintf(stderr, "rank %d: %zu wrong elements\n", r, wrong);
    return 1;
  }
  std::printf("rank %d p2p_ring ok (%s)\n", r, pg->backend_name().c_str());
  return 0;
}

static int p2p_kill() {
  auto pg = create_process_group_from_env();
  if (pg->size() != 2) return 2;
  pg->barrier()->wait();
  // Rank 1 dies only once rank 0 says it is past the barrier: on tcp a rank can leave the
  // barrier before its peer has (the peer still waits for the last message), and a death
  // then fails the barrier instead of the recv this test is about.
  int32_t past_barrier = 1;
  if (pg->rank() == 1) {
    pg->recv(&past_barrier, 1, DType::I32, 0, 7)->wait();
    ::kill(::getpid(), SIGKILL);
    ::pause();
  }
  pg->send(&past_barrier, 1, DType::I32, 1, 7)->wait();
  std::vector<int32_t> in(1u << 20);
  auto t0 = std::chrono::steady_clock::now();
  try {
    pg->recv(in.data(), in.size(), DType::I32, 1, 0)->wait();
  } catch (const TimeoutError& e) {
    std::fprintf(stderr, "rank 0: a timeout instead of the peer's death: %s\n", e.what());
    return 1;
  } catch (const CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0 noticed in %.2f s: %s\n", s, e.what());
    std::string m = e.what();
    return m.find("recv #2") != std::string::npos && m.find("rank 1") != std::string::npos && s < 10 ? 0 : 1;
  }
  std::fprintf(stderr, "rank 0: the recv completed although rank 1 died\n");
  return 1;
}

static double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

static int p2p_bw() {
  auto pg = create_process_group_from_env();
  if (pg->size() != 2) return 2;
  const int r = pg->rank(), peer = 1 - r;
  const size_t count = size_t(16) << 20;  // 64 MiB of f32
  const double bytes = double(count) * 4;
  const int iters = 8;
  std::vector<float> out(count, float(r + 1)), in(count);
  double one_way = 0, both_ways = 0;
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    pg->barrier()->wait();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      if (r == 0) pg->send(out.data(), count, DType::F32, peer, 1)->wait();
      else pg->recv(in.data(), count, DType::F32, peer, 1)->wait();
    }
    pg->barrier()->wait();
    one_way = bytes * iters / seconds_since(t0) / 1e9;
  }
  if (std::getenv("PARATRAIN_BW_BOTH")) {  // needs non-blocking large sends
    for (int round = 0; round < 2; ++round) {
      pg->barrier()->wait();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        auto s = pg->send(out.data(), count, DType::F32, peer, 2);
        auto v = pg->recv(in.data(), count, DType::F32, peer, 2);
        s->wait();
        v->wait();
      }
      pg->barrier()->wait();
      both_ways = bytes * iters / seconds_since(t0) / 1e9;
    }
  }
  if (r == 0)
    std::printf("p2p %s: 64 MiB one way %.2f GB/s, both ways %.2f GB/s per direction\n", pg->backend_name().c_str(),
                one_way, both_ways);
  return 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "ops";
  try {
    if (mode == "ops") return ops();
    if (mode == "deterministic") return deterministic();
    if (mode == "kill") return kill_mode();
    if (mode == "mismatch") return mismatch();
    if (mode == "deadline") return deadline();
    if (mode == "fr_usr1") return fr_usr1();
    if (mode == "p2p_bw") return p2p_bw();
    if (mode == "p2p_swap") return p2p_swap();
    if (mode == "p2p_ring") return p2p_ring();
    if (mode == "p2p_kill") return p2p_kill();
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}
