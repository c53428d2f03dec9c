// Backend "nccl" where it cannot run (a build without CUDA, or no GPU): a clear InputError,
// never a crash or a silent fallback to another backend. Runs in every build; with a GPU
// tests/gpu/nccl_process_group_test.cpp covers the backend itself.
#include <gtest/gtest.h>

#include "comm/transport_process_group.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/tensor/cuda.h"

namespace paratrain::comm {
namespace {

TEST(NcclBackend, IsAKnownBackendName) {
  ProcessGroupOptions o;
  o.backend = "nccl";
  EXPECT_EQ(resolve_options(o).backend, "nccl");
  o.backend = "nccl2";
  try {
    resolve_options(o);
    FAIL() << "an unknown backend was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("auto, shm, tcp, mpi, nccl"), std::string::npos) << e.what();
  }
}

TEST(NcclBackend, WithoutCudaOrGpuIsAClearInputError) {
  if (cuda::device_count() > 0) GTEST_SKIP() << "a GPU is visible: tests/gpu covers the nccl backend";
  ProcessGroupOptions o;
  o.backend = "nccl";
  const std::string want = cuda::built() ? "backend nccl: no CUDA GPU: " : "backend nccl: paratrain was built without CUDA";
  try {
    create_process_group(std::make_shared<HashStore>(), 0, 1, o);
    FAIL() << "backend nccl made a group without a GPU";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace paratrain::comm
