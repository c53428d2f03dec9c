// The nccl backend's rank-ordered mode (ProcessGroupOptions::deterministic): its combine
// kernel (comm/backends/nccl/rank_ordered.h) on one GPU against shm/tcp's accumulator on the
// host (comm/algorithms/reduce_kernels.h), bit for bit, in every dtype and op; a one-rank
// deterministic group; and with two or more GPUs (up to four, one thread each) allreduce,
// reduce_scatter and reduce against the in-order sum computed here, bit for bit, for sizes
// that leave chunks uneven or empty.
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "comm/algorithms/reduce_kernels.h"
#include "comm/backends/nccl/rank_ordered.h"
#include "gpu/gpu_test_util.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm {
namespace {

// `count` elements of dtype as raw bytes: floats of mixed magnitude (so the order of the
// additions shows in the last bits), or integers of either sign.
std::vector<char> random_elements(size_t count, DType dtype, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-8, 8);
  std::vector<char> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    const float f = std::ldexp(mant(gen), expo(gen));
    char* at = out.data() + i * dtype_size(dtype);
    if (dtype == DType::F32) std::memcpy(at, &f, 4);
    else if (dtype == DType::BF16) {
      const uint16_t h = f32_to_bf16(f);
      std::memcpy(at, &h, 2);
    } else if (dtype == DType::F16) {
      const uint16_t h = f32_to_f16(f);
      std::memcpy(at, &h, 2);
    } else if (dtype == DType::I32) {
      const int32_t v = static_cast<int32_t>(f * 1000);
      std::memcpy(at, &v, 4);
    } else {
      const int64_t v = static_cast<int64_t>(f * 1e6) * 1000003;
      std::memcpy(at, &v, 8);
    }
  }
  return out;
}

// shm/tcp's rank-ordered rule on the host: x_0 op x_1 op ... in the accumulator, rounded once.
std::vector<char> in_rank_order(const std::vector<const char*>& x, size_t count, DType dtype, ReduceOp op) {
  const int n = static_cast<int>(x.size());
  std::vector<char> acc(std::max<size_t>(1, count * kernels::acc_size(dtype))), out(count * dtype_size(dtype));
  kernels::acc_load(acc.data(), x[0], count, dtype);
  for (int p = 1; p < n; ++p) kernels::acc_add(acc.data(), x[p], count, dtype, op);
  kernels::acc_store(out.data(), acc.data(), count, dtype, op, n);
  return out;
}

std::vector<char> download(const void* p, size_t bytes) {
  PT_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<char> h(bytes);
  if (bytes) PT_CUDA_CHECK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
  return h;
}

// The index of the first element whose bytes differ, or -1.
int64_t first_difference(const std::vector<char>& a, const std::vector<char>& b, DType dtype) {
  if (a.size() != b.size()) return 0;
  const size_t es = dtype_size(dtype);
  for (size_t i = 0; i < a.size() / es; ++i)
    if (std::memcmp(a.data() + i * es, b.data() + i * es, es) != 0) return static_cast<int64_t>(i);
  return -1;
}

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16, DType::I32, DType::I64};

TEST(NcclRankOrdered, TheCombineKernelGivesTheHostAccumulatorsBits) {
  PT_REQUIRE_GPU();
  for (DType dt : kDtypes)
    for (ReduceOp op : kOps)
      for (int n : {2, 3, 5})
        for (int rank : {0, 1, n - 1})
          for (size_t len : {size_t(1), size_t(1000), size_t(70001)}) {
            SCOPED_TRACE(detail::concat(dtype_name(dt), " ", reduce_op_name(op), ", n ", n, ", rank ", rank, ", ",
                                        len, " elements"));
            const size_t es = dtype_size(dt), stride = len + 3;  // slots need not be packed
            std::vector<std::vector<char>> x;
            for (int p = 0; p < n; ++p) x.push_back(random_elements(len, dt, 1000u * n + 17u * p + len));
            std::vector<char> slots(n * stride * es, 0x5a);  // the own rank's slot is never read
            for (int p = 0; p < n; ++p)
              if (p != rank) std::memcpy(slots.data() + p * stride * es, x[p].data(), len * es);
            std::vector<const char*> ptrs;
            for (const auto& v : x) ptrs.push_back(v.data());
            const auto want = in_rank_order(ptrs, len, dt, op);
            test::DevBuf own(x[rank]), dslots(slots), out(len * es);
            nccl::reduce_in_rank_order(own.p, rank, dslots.p, stride, n, out.p, len, dt, op, nullptr);
            EXPECT_EQ(first_difference(download(out.p, len * es), want, dt), -1);
            // In place (what allreduce and reduce do): `out` is `own`.
            nccl::reduce_in_rank_order(own.p, rank, dslots.p, stride, n, own.p, len, dt, op, nullptr);
            EXPECT_EQ(first_difference(download(own.p, len * es), want, dt), -1);
          }
}

TEST(NcclRankOrdered, AGroupOfOneLeavesTheData) {
  PT_REQUIRE_GPU();
  ProcessGroupOptions o;
  o.backend = "nccl";
  o.timeout_s = 60;
  o.deterministic = true;
  auto pg = create_process_group(std::make_shared<HashStore>(), 0, 1, o);
  const auto x = random_elements(999, DType::F32, 5);
  test::DevBuf a(x), b(x.size());
  pg->allreduce(a.p, 999, DType::F32, ReduceOp::kSum)->wait();
  EXPECT_EQ(download(a.p, x.size()), x);
  pg->reduce_scatter(a.p, b.p, 999, DType::F32, ReduceOp::kSum)->wait();
  EXPECT_EQ(download(b.p, x.size()), x);
}

// n ranks (one thread and GPU each) against the in-order results computed on the host.
TEST(NcclRankOrdered, CollectivesOnSeveralGpusGiveTheInOrderBits) {
  PT_REQUIRE_GPU();
  const int n = std::min(cuda::device_count(), 4);
  if (n < 2) GTEST_SKIP() << "needs 2 GPUs, this process sees " << cuda::device_count();
  auto store = std::make_shared<HashStore>();
  std::mutex mu;
  std::vector<std::string> errors;
  auto rank_main = [&](int rank) {
    auto fail = [&](const std::string& what) {
      std::lock_guard<std::mutex> l(mu);
      errors.push_back(detail::concat("rank ", rank, ": ", what));
    };
    try {
      cuda::set_device(rank);
      ProcessGroupOptions o;
      o.backend = "nccl";
      o.timeout_s = 60;
      o.deterministic = true;
      auto pg = create_process_group(store, rank, n, o);
      for (DType dt : {DType::F32, DType::BF16, DType::F16})
        for (size_t count : {size_t(0), size_t(3), size_t(4099), size_t(300007)}) {
          const std::string what = detail::concat(dtype_name(dt), ", ", count, " elements");
          const size_t es = dtype_size(dt), bytes = count * es;
          std::vector<std::vector<char>> x;  // every rank's contribution (all ranks make all)
          for (int p = 0; p < n; ++p) x.push_back(random_elements(count * n, dt, 77u * p + count));
          std::vector<const char*> ptrs;
          for (const auto& v : x) ptrs.push_back(v.data());
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
            const auto want = in_rank_order(ptrs, count, dt, op);
            test::DevBuf a(std::vector<char>(x[rank].begin(), x[rank].begin() + bytes));
            pg->allreduce(a.p, count, dt, op)->wait();
            if (first_difference(download(a.p, bytes), want, dt) != -1)
              fail(detail::concat("allreduce ", reduce_op_name(op), ", ", what, ": element ",
                                  first_difference(download(a.p, bytes), want, dt), " differs"));
          }
          // reduce_scatter of n blocks: block `rank` of the in-order sum.
          const auto full = in_rank_order(ptrs, count * n, dt, ReduceOp::kSum);
          const std::vector<char> block(full.begin() + rank * bytes, full.begin() + (rank + 1) * bytes);
          test::DevBuf in(x[rank]), out(bytes);
          pg->reduce_scatter(in.p, out.p, count, dt, ReduceOp::kSum)->wait();
          if (first_difference(download(out.p, bytes), block, dt) != -1)
            fail(detail::concat("reduce_scatter, ", what, " differs"));
          // reduce to the last rank; the others keep their buffers.
          test::DevBuf r(std::vector<char>(x[rank].begin(), x[rank].begin() + bytes));
          pg->reduce(r.p, count, dt, ReduceOp::kSum, n - 1)->wait();
          const auto want_r = rank == n - 1 ? in_rank_order(ptrs, count, dt, ReduceOp::kSum)
                                            : std::vector<char>(x[rank].begin(), x[rank].begin() + bytes);
          if (first_difference(download(r.p, bytes), want_r, dt) != -1) fail(detail::concat("reduce, ", what, " differs"));
        }
      pg->barrier()->wait();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  };
  std::vector<std::thread> ranks;
  for (int r = 0; r < n; ++r) ranks.emplace_back(rank_main, r);
  for (auto& t : ranks) t.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}

}  // namespace
}  // namespace paratrain::comm
