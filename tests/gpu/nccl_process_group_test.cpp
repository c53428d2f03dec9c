// The nccl backend (src/comm/backends/nccl) on device buffers: a world of one rank on cuda:0
// (every collective, send/recv to itself, new_group, stream_wait, the flight records), and
// with two GPUs a world of two ranks in two threads, one per device, checked against values
// computed on the host.
#include <cuda_runtime.h>

#include <mutex>
#include <numeric>
#include <thread>

#include "comm/backends/nccl/nccl_process_group.h"
#include "gpu/gpu_test_util.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm {
namespace {

// A device buffer of `n` elements of `dtype` on the current device. f32/bf16: filled with
// `fill` (a float per element, stored as the dtype; -777 past its end) and read back as
// floats; other dtypes start as zeros.
class DeviceBuffer {
 public:
  DeviceBuffer(size_t n, DType dtype, const std::vector<float>& fill = {}) : n_(n), dtype_(dtype) {
    PT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(1, n * dtype_size(dtype))));
    if (dtype != DType::F32 && dtype != DType::BF16) {  // filled by the test itself
      PT_CUDA_CHECK(cudaMemset(p_, 0, n * dtype_size(dtype)));
      PT_CUDA_CHECK(cudaDeviceSynchronize());
      return;
    }
    std::vector<float> v = fill;
    v.resize(n, -777.0f);  // a value no test expects
    upload(v);
  }
  ~DeviceBuffer() { cudaFree(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  void upload(const std::vector<float>& v) {
    if (dtype_ == DType::F32) {
      PT_CUDA_CHECK(cudaMemcpy(p_, v.data(), n_ * 4, cudaMemcpyHostToDevice));
    } else {
      std::vector<uint16_t> h(n_);
      for (size_t i = 0; i < n_; ++i) h[i] = f32_to_bf16(v[i]);
      PT_CUDA_CHECK(cudaMemcpy(p_, h.data(), n_ * 2, cudaMemcpyHostToDevice));
    }
    PT_CUDA_CHECK(cudaDeviceSynchronize());  // visible to the (non-blocking) comm stream
  }
  std::vector<float> download() const {
    std::vector<float> v(n_);
    if (dtype_ == DType::F32) {
      PT_CUDA_CHECK(cudaMemcpy(v.data(), p_, n_ * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<uint16_t> h(n_);
      PT_CUDA_CHECK(cudaMemcpy(h.data(), p_, n_ * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n_; ++i) v[i] = bf16_to_f32(h[i]);
    }
    return v;
  }

 private:
  void* p_ = nullptr;
  size_t n_;
  DType dtype_;
};

// Small integers: exact in bf16 and f32, so every expectation below is exact.
std::vector<float> ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 17);
  return v;
}

std::shared_ptr<ProcessGroup> nccl_group(std::shared_ptr<Store> store, int rank, int size) {
  ProcessGroupOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  return create_process_group(std::move(store), rank, size, o);
}

class NcclOneRank : public ::testing::TestWithParam<DType> {};

TEST_P(NcclOneRank, CollectivesMoveTheData) {
  PT_REQUIRE_GPU();
  const DType dt = GetParam();
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  ASSERT_EQ(pg->backend_name(), "nccl");
  ASSERT_EQ(pg->size(), 1);
  const size_t n = 1000;
  const auto x = ramp(n, 1.0f);

  DeviceBuffer a(n, dt, x);
  pg->allreduce(a.get(), n, dt, ReduceOp::kSum)->wait();
  EXPECT_EQ(a.download(), x);
  pg->allreduce(a.get(), n, dt, ReduceOp::kAvg)->wait();
  EXPECT_EQ(a.download(), x);

  DeviceBuffer in(n, dt, x), out(n, dt);
  pg->allgather(in.get(), out.get(), n, dt)->wait();
  EXPECT_EQ(out.download(), x);

  DeviceBuffer rs(n, dt);
  pg->reduce_scatter(in.get(), rs.get(), n, dt, ReduceOp::kMax)->wait();
  EXPECT_EQ(rs.download(), x);

  DeviceBuffer b(n, dt, x);
  pg->broadcast(b.get(), n, dt, 0)->wait();
  EXPECT_EQ(b.download(), x);
  pg->reduce(b.get(), n, dt, ReduceOp::kMin, 0)->wait();
  EXPECT_EQ(b.download(), x);

  DeviceBuffer a2a(n, dt);
  pg->all_to_all(in.get(), a2a.get(), n, dt)->wait();
  EXPECT_EQ(a2a.download(), x);

  // Send to itself: both in one batch (one NCCL group), enqueued by the wait.
  DeviceBuffer got(n, dt);
  auto s = pg->send(in.get(), n, dt, 0, 3);
  auto r = pg->recv(got.get(), n, dt, 0, 3);
  EXPECT_FALSE(std::static_pointer_cast<nccl::NcclWork>(r)->enqueued());
  r->wait();
  s->wait();
  EXPECT_EQ(got.download(), x);

  pg->barrier()->wait();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, NcclOneRank, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(NcclProcessGroup, StreamWaitOrdersTheComputeStreamWithoutAHostWait) {
  PT_REQUIRE_GPU();
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  const size_t n = 1 << 20;
  const auto x = ramp(n, 2.0f);
  DeviceBuffer in(n, DType::F32, x), out(n, DType::F32);
  auto w = std::dynamic_pointer_cast<nccl::NcclWork>(pg->allgather(in.get(), out.get(), n, DType::F32));
  ASSERT_TRUE(w);
  EXPECT_EQ(w->device(), 0);
  w->stream_wait();
  auto compute = static_cast<cudaStream_t>(cuda::compute_stream(0));
  std::vector<float> host(n);
  PT_CUDA_CHECK(cudaMemcpyAsync(host.data(), out.get(), n * 4, cudaMemcpyDeviceToHost, compute));
  PT_CUDA_CHECK(cudaStreamSynchronize(compute));
  EXPECT_EQ(host, x);
  w->wait();
}

// Host buffers (a training loop's once-per-step figures) are staged through the GPU: the
// call returns with the result in host memory; a send of a host buffer is refused.
TEST(NcclProcessGroup, HostBuffersAreStagedThroughTheDevice) {
  PT_REQUIRE_GPU();
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  float flag = 3.0f;
  auto w = pg->allreduce(&flag, 1, DType::F32, ReduceOp::kMax);
  EXPECT_TRUE(w->is_completed());
  w->wait();
  EXPECT_EQ(flag, 3.0f);
  const int64_t mine[3] = {7, 8, 9};
  int64_t all[3] = {0, 0, 0};
  pg->allgather(mine, all, 3, DType::I64)->wait();
  EXPECT_EQ(all[0], 7);
  EXPECT_EQ(all[2], 9);
  // A device input with a host output.
  const auto x = ramp(100, 1.0f);
  DeviceBuffer in(100, DType::F32, x);
  std::vector<float> out(100, -1.0f);
  pg->allgather(in.get(), out.data(), 100, DType::F32)->wait();
  EXPECT_EQ(out, x);
  EXPECT_THROW(pg->send(out.data(), 100, DType::F32, 0, 0), InputError);
}

TEST(NcclProcessGroup, NewGroupOfOneRank) {
  PT_REQUIRE_GPU();
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  auto sub = pg->new_group({0});
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->backend_name(), "nccl");
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->size(), 1);
  const auto x = ramp(64, 5.0f);
  DeviceBuffer in(64, DType::F32, x), out(64, DType::F32);
  sub->allgather(in.get(), out.get(), 64, DType::F32)->wait();
  EXPECT_EQ(out.download(), x);
  EXPECT_THROW(pg->new_group({1}), InputError);
}

TEST(NcclProcessGroup, RecordsEveryCallInTheFlightRecorder) {
  PT_REQUIRE_GPU();
  if (!FlightRecorder::instance().enabled()) GTEST_SKIP() << "PARATRAIN_FR_BUFFER=0";
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  const FlightGroup* g = FlightRecorder::instance().group(pg->record_group());
  ASSERT_TRUE(g);
  EXPECT_EQ(g->backend, "nccl");
  DeviceBuffer a(16, DType::F32, ramp(16, 0)), b(16, DType::F32);
  std::vector<WorkPtr> works;
  works.push_back(pg->allreduce(a.get(), 16, DType::F32, ReduceOp::kSum));
  works.push_back(pg->allgather(a.get(), b.get(), 16, DType::F32));
  works.push_back(pg->reduce_scatter(a.get(), b.get(), 16, DType::F32, ReduceOp::kSum));
  works.push_back(pg->broadcast(a.get(), 16, DType::F32, 0));
  works.push_back(pg->reduce(a.get(), 16, DType::F32, ReduceOp::kSum, 0));
  works.push_back(pg->all_to_all(a.get(), b.get(), 16, DType::F32));
  works.push_back(pg->send(a.get(), 16, DType::F32, 0, 7));
  works.push_back(pg->recv(b.get(), 16, DType::F32, 0, 7));
  works.push_back(pg->barrier());
  for (auto& w : works) w->wait();
  const std::vector<OpType> want = {OpType::kAllreduce, OpType::kAllgather, OpType::kReduceScatter,
                                    OpType::kBroadcast, OpType::kReduce,    OpType::kAllToAll,
                                    OpType::kSend,      OpType::kRecv,      OpType::kBarrier};
  std::vector<FlightRecord> mine;
  for (const FlightRecord& r : FlightRecorder::instance().snapshot())
    if (r.group == pg->record_group()) mine.push_back(r);
  ASSERT_EQ(mine.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(mine[i].op, want[i]) << i;
    EXPECT_EQ(mine[i].seq, i);
    EXPECT_EQ(mine[i].state, RecordState::kCompleted) << i;
    EXPECT_GT(mine[i].started_ns, 0) << i;
    EXPECT_GE(mine[i].finished_ns, mine[i].started_ns) << i;
  }
  EXPECT_EQ(mine[6].peer, 0);
  EXPECT_EQ(mine[6].tag, 7);
}

TEST(NcclProcessGroup, RejectsWhatNcclCannotDo) {
  PT_REQUIRE_GPU();
  auto pg = nccl_group(std::make_shared<HashStore>(), 0, 1);
  DeviceBuffer a(4, DType::F32);
  EXPECT_THROW(pg->allreduce(a.get(), 4, DType::U8, ReduceOp::kSum), InputError);
  EXPECT_THROW(pg->broadcast(a.get(), 4, DType::F32, 1), InputError);
}

// Two ranks on one GPU: NCCL refuses them ("Duplicate GPU detected", invalid usage), and the
// CommError says that backend shm takes ranks sharing a GPU.
TEST(NcclProcessGroup, TwoRanksOnOneGpuAreRefusedNamingShm) {
  PT_REQUIRE_GPU();
  auto store = std::make_shared<HashStore>();
  std::mutex mu;
  std::vector<std::string> messages;
  auto rank_main = [&](int rank) {
    std::string m = "no error";
    try {
      cuda::set_device(0);
      ProcessGroupOptions o;
      o.backend = "nccl";
      o.timeout_s = 30;
      create_process_group(store, rank, 2, o);
    } catch (const CommError& e) {
      m = e.what();
    } catch (const std::exception& e) {
      m = std::string("not a CommError: ") + e.what();
    }
    std::lock_guard<std::mutex> l(mu);
    messages.push_back(m);
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (const auto& m : messages) {
    EXPECT_NE(m.find("NCCL communicator init (2 ranks, cuda:0) failed"), std::string::npos) << m;
    EXPECT_NE(m.find("backend shm stages GPU buffers through host memory"), std::string::npos) << m;
  }
}

// Two ranks, one thread and one GPU each, against values computed here.
TEST(NcclProcessGroup, TwoRanksOnTwoDevices) {
  PT_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this process sees " << cuda::device_count();
  auto store = std::make_shared<HashStore>();
  const size_t n = 4099;  // not a multiple of anything NCCL likes
  std::mutex mu;
  std::vector<std::string> errors;
  auto rank_main = [&](int rank) {
    try {
      cuda::set_device(rank);
      auto pg = nccl_group(store, rank, 2);
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> l(mu);
        errors.push_back(detail::concat("rank ", rank, ": ", what));
      };
      auto expect = [&](const std::vector<float>& got, const std::vector<float>& want, const char* what) {
        if (got.size() != want.size()) return fail(detail::concat(what, ": ", got.size(), " elements"));
        for (size_t i = 0; i < got.size(); ++i)
          if (got[i] != want[i])
            return fail(detail::concat(what, ": element ", i, " is ", got[i], ", expected ", want[i]));
      };
      for (DType dt : {DType::F32, DType::BF16}) {
        const auto mine = ramp(n, 1.0f + rank), other = ramp(n, 2.0f - rank);
        std::vector<float> sum(n), mx(n);
        for (size_t i = 0; i < n; ++i) {
          sum[i] = mine[i] + other[i];
          mx[i] = std::max(mine[i], other[i]);
        }
        DeviceBuffer a(n, dt, mine);
        pg->allreduce(a.get(), n, dt, ReduceOp::kSum)->wait();
        expect(a.download(), sum, "allreduce sum");
        a.upload(mine);
        pg->allreduce(a.get(), n, dt, ReduceOp::kMax)->wait();
        expect(a.download(), mx, "allreduce max");

        // allgather: block r is rank r's input.
        DeviceBuffer in(n, dt, mine), all(2 * n, dt);
        pg->allgather(in.get(), all.get(), n, dt)->wait();
        std::vector<float> want_all = rank == 0 ? mine : other;
        const auto& second = rank == 0 ? other : mine;
        want_all.insert(want_all.end(), second.begin(), second.end());
        expect(all.download(), want_all, "allgather");

        // reduce_scatter of the gathered blocks (the same on both ranks): block r summed twice.
        DeviceBuffer rs(n, dt);
        pg->reduce_scatter(all.get(), rs.get(), n, dt, ReduceOp::kSum)->wait();
        std::vector<float> want_rs(want_all.begin() + rank * n, want_all.begin() + (rank + 1) * n);
        for (float& v : want_rs) v *= 2;
        expect(rs.download(), want_rs, "reduce_scatter");

        // broadcast from rank 1; reduce to rank 0 leaves rank 1's buffer as it was.
        DeviceBuffer b(n, dt, mine);
        pg->broadcast(b.get(), n, dt, 1)->wait();
        expect(b.download(), rank == 1 ? mine : other, "broadcast");
        b.upload(mine);
        pg->reduce(b.get(), n, dt, ReduceOp::kSum, 0)->wait();
        expect(b.download(), rank == 0 ? sum : mine, "reduce");

        // all_to_all: out block p came from rank p's block `rank`.
        std::vector<float> a2a_in = ramp(2 * n, 10.0f * (rank + 1));
        DeviceBuffer ai(2 * n, dt, a2a_in), ao(2 * n, dt);
        pg->all_to_all(ai.get(), ao.get(), n, dt)->wait();
        std::vector<float> want_a2a(2 * n);
        for (int p = 0; p < 2; ++p) {
          const auto src = ramp(2 * n, 10.0f * (p + 1));
          std::copy(src.begin() + rank * n, src.begin() + (rank + 1) * n, want_a2a.begin() + p * n);
        }
        expect(ao.download(), want_a2a, "all_to_all");

        // Both ranks send first, then receive (one batch each).
        DeviceBuffer got(n, dt);
        auto s = pg->send(in.get(), n, dt, 1 - rank, 0);
        auto r = pg->recv(got.get(), n, dt, 1 - rank, 0);
        r->wait();
        s->wait();
        expect(got.download(), other, "send/recv");
      }
      pg->barrier()->wait();
      auto only1 = pg->new_group({1});
      if (rank == 0 && only1) fail("new_group({1}) returned a group on a rank not in it");
      if (rank == 1 && (!only1 || only1->size() != 1)) fail("new_group({1}) returned no group of 1");
      auto both = pg->new_group({0, 1});
      DeviceBuffer one(1, DType::I32);
      int32_t v = rank + 1;
      PT_CUDA_CHECK(cudaMemcpy(one.get(), &v, 4, cudaMemcpyHostToDevice));
      PT_CUDA_CHECK(cudaDeviceSynchronize());
      both->allreduce(one.get(), 1, DType::I32, ReduceOp::kSum)->wait();
      PT_CUDA_CHECK(cudaMemcpy(&v, one.get(), 4, cudaMemcpyDeviceToHost));
      if (v != 3) fail(detail::concat("sub-group allreduce gave ", v, ", expected 3"));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu);
      errors.push_back(detail::concat("rank ", rank, ": ", e.what()));
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace
}  // namespace paratrain::comm
