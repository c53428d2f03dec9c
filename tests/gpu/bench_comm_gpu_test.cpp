// `paratrain bench comm --device cuda` through the binary: the buffers on the rank's GPU and
// the nccl backend; every op's check (its first call on known inputs) must find no wrong
// element (exit 0, a "buffers on cuda:N" header) on one GPU, and over two GPUs with NCCL's
// own reductions and with the rank-ordered ones. Skips without a GPU.
#include <gtest/gtest.h>

#include <string>

#include "gpu_test_util.h"
#include "support/run_binary.h"

using namespace paratrain;

namespace {

const char* const kOps[] = {"allreduce", "reduce_scatter", "allgather", "broadcast", "all_to_all"};

TEST(BenchCommOnGpu, EveryOpChecksItsResultOnOneGpu) {
  PT_REQUIRE_GPU();
  for (const char* op : kOps) {
    const auto r = test::run_paratrain(std::string("bench comm --device cuda --op ") + op +
                                           " --min-bytes 4K --max-bytes 1M --iters 2 --warmup 1",
                                       120);
    EXPECT_EQ(r.rc, 0) << op << "\n" << r.out;
    EXPECT_NE(r.out.find("backend nccl, buffers on cuda:0"), std::string::npos) << r.out;
  }
}

TEST(BenchCommOnGpu, TwoGpusWithAndWithoutRankOrder) {
  PT_REQUIRE_GPU();
  if (cuda::device_count() < 2) GTEST_SKIP() << "needs 2 GPUs, this machine has " << cuda::device_count();
  for (const char* mode : {"", " --deterministic"})
    for (const char* op : {"allreduce", "reduce_scatter"}) {
      const auto r = test::run_paratrain(std::string("launch --nproc-per-node 2 -- ") + PARATRAIN_BIN +
                                             " bench comm --device cuda --op " + op +
                                             " --min-bytes 4K --max-bytes 4M --iters 2 --warmup 1" + mode,
                                         120);
      EXPECT_EQ(r.rc, 0) << op << mode << "\n" << r.out;
      EXPECT_NE(r.out.find("2 ranks, backend nccl"), std::string::npos) << r.out;
    }
}

}  // namespace
