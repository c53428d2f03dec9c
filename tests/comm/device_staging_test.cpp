// The host backends on GPU buffers (src/comm/device_staging.h), on every machine: "GPU memory"
// here is a stand-in, an arena of pages nothing may touch (PROT_NONE) except the stand-in's
// own copies, which open it for the copy alone. So a host backend handed a "GPU" pointer
// instead of a staged host copy crashes the test, as it would crash on a GPU machine; and
// every op must give the results host buffers give. The real copies (cuda::copy_to_host,
// copy_to_gpu) run in tests/gpu (StagedGroupOnGpu, two ranks sharing one GPU).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>

#include "comm/comm_check.h"
#include "comm/device_staging.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace paratrain::comm::testing;

namespace {

// One rank's "GPU": a bump allocator over PROT_NONE pages; reading or writing it from the
// test goes through put/get, which copy as the backend's staging does.
class FakeGpu {
 public:
  explicit FakeGpu(size_t bytes) : bytes_(round_up(bytes)) {
    base_ = static_cast<char*>(mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (base_ == MAP_FAILED) throw std::runtime_error("mmap failed");
  }
  ~FakeGpu() { munmap(base_, bytes_); }
  FakeGpu(const FakeGpu&) = delete;
  FakeGpu& operator=(const FakeGpu&) = delete;

  void* alloc(size_t n) {
    char* p = base_ + used_;
    used_ += (n + 255) / 256 * 256 + 256;
    if (used_ > bytes_) throw std::runtime_error("fake GPU full");
    return p;
  }
  bool holds(const void* p) const {
    auto c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + bytes_;
  }
  // memcpy with the arena open for the copy alone.
  void copy(void* dst, const void* src, size_t n) {
    std::lock_guard<std::mutex> l(mu_);
    mprotect(base_, bytes_, PROT_READ | PROT_WRITE);
    std::memcpy(dst, src, n);
    mprotect(base_, bytes_, PROT_NONE);
  }
  DeviceMemory memory() {
    DeviceMemory m;
    m.holds = [this](const void* p) { return holds(p); };
    m.to_host = [this](void* h, const void* g, size_t n) { copies_down += 1, copy(h, g, n); };
    m.to_device = [this](void* g, const void* h, size_t n) { copies_up += 1, copy(g, h, n); };
    m.host_buffer = [](size_t n) { return std::shared_ptr<void>(new char[n], [](void* p) { delete[] static_cast<char*>(p); }); };
    return m;
  }
  // A GPU buffer holding `host`'s bytes, and the bytes of a GPU buffer.
  void* upload(const std::vector<char>& host) {
    void* g = alloc(host.size());
    copy(g, host.data(), host.size());
    return g;
  }
  std::vector<char> download(const void* g, size_t n) {
    std::vector<char> h(n);
    copy(h.data(), g, n);
    return h;
  }

  std::atomic<int> copies_down{0}, copies_up{0};

 private:
  static size_t round_up(size_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (n + page - 1) / page * page;
  }
  size_t bytes_;
  char* base_;
  size_t used_ = 0;
  std::mutex mu_;
};

// Runs fn(pg, gpu) on n thread ranks over `backend`, each group staged over its own fake GPU.
template <typename Fn>
void on_staged_ranks(int n, const char* backend, Fn fn, double timeout_s = 30) {
  ProcessGroupOptions o;
  o.backend = backend;
  o.timeout_s = timeout_s;
  auto errors = run_thread_ranks(n, o, [&](int, std::shared_ptr<ProcessGroup>& host_pg) {
    FakeGpu gpu(64 << 20);
    auto pg = stage_device_buffers(host_pg, gpu.memory());
    fn(*pg, gpu);
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<char> values(int rank, size_t count, int salt) {
  std::vector<char> b(count * 4);
  for (size_t i = 0; i < count; ++i) put(b, DType::F32, i, value(rank, i, salt));
  return b;
}

// Every element of `got` (f32) against want(i); the first mismatch in `rep`.
template <typename Want>
void check(const std::vector<char>& got, size_t count, Want want, const std::string& what, Report& rep) {
  for (size_t i = 0; i < count; ++i)
    if (get(got, DType::F32, i) != want(i)) rep.mismatch(what, i, get(got, DType::F32, i), want(i));
}

}  // namespace

// Each collective and send/recv with every buffer on the "GPU": the values host buffers give,
// with large messages (past shm's 64 KiB eager size) and both ranks sending first.
TEST(StagedGroup, EveryOpOnGpuBuffersGivesTheHostResults) {
  for (int n : {2, 3}) {
    on_staged_ranks(n, "shm", [&](ProcessGroup& pg, FakeGpu& gpu) {
      const int r = pg.rank();
      Report rep;
      for (size_t count : {size_t(1), size_t(1000), size_t(70001)}) {
        const std::string at = " count " + std::to_string(count) + " ranks " + std::to_string(n);
        const size_t bytes = count * 4;
        void* buf = gpu.upload(values(r, count, 0));
        pg.allreduce(buf, count, DType::F32)->wait();
        check(gpu.download(buf, bytes), count, [&](size_t i) { return combine_all(ReduceOp::kSum, n, i, DType::F32); },
              "allreduce" + at, rep);

        void* in = gpu.upload(values(r, n * count, 1));
        void* out = gpu.alloc(bytes);
        pg.reduce_scatter(in, out, count, DType::F32)->wait();
        check(gpu.download(out, bytes), count,
              [&](size_t i) { return combine_all(ReduceOp::kSum, n, size_t(r) * count + i, DType::F32, 1); },
              "reduce_scatter" + at, rep);

        void* mine = gpu.upload(values(r, count, 2));
        void* all = gpu.alloc(n * bytes);
        pg.allgather(mine, all, count, DType::F32)->wait();
        check(gpu.download(all, n * bytes), n * count, [&](size_t i) { return value(int(i / count), i % count, 2); },
              "allgather" + at, rep);

        const int root = n - 1;
        void* b = gpu.upload(values(r, count, 3));
        pg.broadcast(b, count, DType::F32, root)->wait();
        check(gpu.download(b, bytes), count, [&](size_t i) { return value(root, i, 3); }, "broadcast" + at, rep);

        void* red = gpu.upload(values(r, count, 4));
        pg.reduce(red, count, DType::F32, ReduceOp::kMax, root)->wait();
        check(gpu.download(red, bytes), count,
              [&](size_t i) { return r == root ? combine_all(ReduceOp::kMax, n, i, DType::F32, 4) : value(r, i, 4); },
              "reduce" + at, rep);

        void* a2a_in = gpu.upload(values(r, n * count, 5));
        void* a2a_out = gpu.alloc(n * bytes);
        pg.all_to_all(a2a_in, a2a_out, count, DType::F32)->wait();
        check(gpu.download(a2a_out, n * bytes), n * count,
              [&](size_t i) { return value(int(i / count), size_t(r) * count + i % count, 5); }, "all_to_all" + at, rep);

        // Every rank sends to the next first, then receives from the previous: the staged
        // send must not wait for its receiver.
        void* s = gpu.upload(values(r, count, 6));
        void* got = gpu.alloc(bytes);
        auto sent = pg.send(s, count, DType::F32, (r + 1) % n, 9);
        auto received = pg.recv(got, count, DType::F32, (r + n - 1) % n, 9);
        received->wait();
        sent->wait();
        check(gpu.download(got, bytes), count, [&](size_t i) { return value((r + n - 1) % n, i, 6); }, "send/recv" + at,
              rep);
      }
      pg.barrier()->wait();
      EXPECT_EQ(rep.wrong, 0u) << "rank " << r << ": " << rep.first;
    });
  }
}

// Host buffers go straight to the host group (no copy), a mix of host and GPU buffers copies
// only the GPU ones, and an allgather whose input lies inside its output (ZeRO's layout) works.
TEST(StagedGroup, OnlyGpuBuffersAreCopied) {
  on_staged_ranks(2, "shm", [&](ProcessGroup& pg, FakeGpu& gpu) {
    const int r = pg.rank();
    const size_t count = 257, bytes = count * 4;
    std::vector<char> host = values(r, count, 0);
    pg.allreduce(host.data(), count, DType::F32)->wait();
    Report rep;
    check(host, count, [&](size_t i) { return combine_all(ReduceOp::kSum, 2, i, DType::F32); }, "host allreduce", rep);
    EXPECT_EQ(gpu.copies_down.load() + gpu.copies_up.load(), 0) << "host buffers were staged";

    std::vector<char> host_in = values(r, count, 1);
    void* gpu_out = gpu.alloc(2 * bytes);
    pg.allgather(host_in.data(), gpu_out, count, DType::F32)->wait();
    check(gpu.download(gpu_out, 2 * bytes), 2 * count, [&](size_t i) { return value(int(i / count), i % count, 1); },
          "allgather host in, GPU out", rep);
    EXPECT_EQ(gpu.copies_down.load(), 0);  // (the test's own upload and download are not counted)
    EXPECT_EQ(gpu.copies_up.load(), 1);

    std::vector<char> whole(2 * bytes);
    std::memcpy(whole.data() + r * bytes, values(r, count, 2).data(), bytes);
    void* all = gpu.upload(whole);
    pg.allgather(static_cast<char*>(all) + r * bytes, all, count, DType::F32)->wait();
    check(gpu.download(all, 2 * bytes), 2 * count, [&](size_t i) { return value(int(i / count), i % count, 2); },
          "allgather in place", rep);
    EXPECT_EQ(rep.wrong, 0u) << "rank " << r << ": " << rep.first;
  });
}

// A staged Work nobody waits for still completes (the group's background thread copies its
// result up), and is_completed() says so.
TEST(StagedGroup, WorksNobodyWaitsForComplete) {
  on_staged_ranks(2, "shm", [&](ProcessGroup& pg, FakeGpu& gpu) {
    const int r = pg.rank();
    const size_t count = 5000;
    void* buf = gpu.upload(values(r, count, 0));
    auto w = pg.allreduce(buf, count, DType::F32);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!w->is_completed() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_TRUE(w->is_completed()) << "rank " << r << ": " << w->description();
    Report rep;
    check(gpu.download(buf, count * 4), count, [&](size_t i) { return combine_all(ReduceOp::kSum, 2, i, DType::F32); },
          "allreduce", rep);
    EXPECT_EQ(rep.wrong, 0u) << rep.first;
    EXPECT_NE(w->description().find("staged through host memory"), std::string::npos) << w->description();
  });
}

// The host call's failure is the staged Work's: a recv whose sender leaves the group without
// sending fails with the host backend's error naming the call and the rank; the GPU buffer
// is untouched.
TEST(StagedGroup, AHostCallsFailureIsTheStagedWorks) {
  on_staged_ranks(
      2, "shm",
      [&](ProcessGroup& pg, FakeGpu& gpu) {
        if (pg.rank() == 0) {
          std::vector<char> zeros(64 * 4, 0);
          void* buf = gpu.upload(zeros);
          auto w = pg.recv(buf, 64, DType::F32, 1, 3);
          try {
            w->wait();
            ADD_FAILURE() << "the recv completed without a sender";
          } catch (const Error& e) {
            const std::string m = e.what();
            EXPECT_NE(m.find("recv"), std::string::npos) << m;
            EXPECT_NE(m.find("rank 0"), std::string::npos) << m;
          }
          EXPECT_TRUE(gpu.download(buf, zeros.size()) == zeros);
          EXPECT_EQ(gpu.copies_up.load(), 0);  // nothing came back
        }
      },
      /*timeout_s=*/1.5);
}

// wait(timeout) on a staged Work keeps its timeout (the host call's deadline is 30 s): a recv
// whose message has not come fails the wait with the TimeoutError of the wait itself, and the
// same Work, waited for again once the message is sent, brings the data.
TEST(StagedGroup, WaitWithATimeoutKeepsItsTimeout) {
  std::atomic<bool> timed_out{false};
  on_staged_ranks(2, "shm", [&](ProcessGroup& pg, FakeGpu& gpu) {
    const size_t count = 100;
    if (pg.rank() == 0) {
      void* buf = gpu.alloc(count * 4);
      auto w = pg.recv(buf, count, DType::F32, 1, 4);
      try {
        w->wait(std::chrono::milliseconds(200));
        ADD_FAILURE() << "the recv completed before anything was sent";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("did not complete within 200 ms"), std::string::npos) << e.what();
      }
      timed_out = true;
      w->wait();
      Report rep;
      check(gpu.download(buf, count * 4), count, [&](size_t i) { return value(1, i, 0); }, "recv", rep);
      EXPECT_EQ(rep.wrong, 0u) << rep.first;
    } else {
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!timed_out && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      void* buf = gpu.upload(values(1, count, 0));
      pg.send(buf, count, DType::F32, 0, 4)->wait();
    }
  });
}

// Calls made one after another without waiting see each other's results, as nccl's stream
// order gives: a send of what an allreduce just wrote sends the sum, and a second allreduce
// of the same buffer sums the first one's result.
TEST(StagedGroup, LaterCallsSeeWhatEarlierCollectivesWrote) {
  on_staged_ranks(2, "shm", [&](ProcessGroup& pg, FakeGpu& gpu) {
    const int r = pg.rank();
    const size_t count = 3000, bytes = count * 4;
    Report rep;
    void* x = gpu.upload(values(r, count, 0));
    void* got = gpu.alloc(bytes);
    auto summed = pg.allreduce(x, count, DType::F32);
    auto sent = pg.send(x, count, DType::F32, 1 - r, 2);
    auto received = pg.recv(got, count, DType::F32, 1 - r, 2);
    received->wait();
    sent->wait();
    summed->wait();
    const auto sum = [&](size_t i) { return combine_all(ReduceOp::kSum, 2, i, DType::F32); };
    check(gpu.download(got, bytes), count, sum, "send after allreduce", rep);

    void* y = gpu.upload(values(r, count, 0));
    auto first = pg.allreduce(y, count, DType::F32);
    auto second = pg.allreduce(y, count, DType::F32);
    second->wait();
    first->wait();
    check(gpu.download(y, bytes), count, [&](size_t i) { return 2 * sum(i); }, "allreduce twice", rep);
    EXPECT_EQ(rep.wrong, 0u) << "rank " << r << ": " << rep.first;
  });
}

// Destroying the staged group completes the Works nobody waited for (their results copied
// up); a sub-group is staged too.
TEST(StagedGroup, DestroyingTheGroupCompletesItsWorksAndSubGroupsAreStaged) {
  ProcessGroupOptions o;
  o.backend = "shm";
  o.timeout_s = 30;
  auto errors = run_thread_ranks(3, o, [&](int r, std::shared_ptr<ProcessGroup>& host_pg) {
    FakeGpu gpu(8 << 20);
    auto pg = stage_device_buffers(host_pg, gpu.memory());
    const size_t count = 4000;
    Report rep;
    void* x = gpu.upload(values(r, count, 0));
    auto w = pg->allreduce(x, count, DType::F32);
    auto sub = pg->new_group({0, 2});
    if (r == 1) {
      EXPECT_EQ(sub, nullptr);
    } else {
      void* z = gpu.upload(values(r, count, 1));
      sub->allreduce(z, count, DType::F32)->wait();
      check(gpu.download(z, count * 4), count, [&](size_t i) { return value(0, i, 1) + value(2, i, 1); },
            "sub-group allreduce", rep);
    }
    sub.reset();
    pg.reset();
    EXPECT_TRUE(w->is_completed()) << "rank " << r;
    check(gpu.download(x, count * 4), count, [&](size_t i) { return combine_all(ReduceOp::kSum, 3, i, DType::F32); },
          "allreduce completed by the destructor", rep);
    EXPECT_EQ(rep.wrong, 0u) << "rank " << r << ": " << rep.first;
  });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}
