// The train layer's device decisions (src/train/device_placement.h): the backend `auto`
// means on a GPU, and a rank's GPU. Runs everywhere: the GPU is only named, never
// touched (a real GPU run: tests/gpu/train_command_gpu_test.cpp).
#include <gtest/gtest.h>

#include "paratrain/base/error.h"
#include "paratrain/nn/layers.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/random.h"
#include "train/device_placement.h"

using namespace paratrain;
using namespace paratrain::train;

namespace {

const DeviceSpec kCpu{Device::CPU, -1}, kGpu{Device::CUDA, 0};

TrainConfig gpu_config() {
  TrainConfig c;
  c.model = "gpt-nano";
  c.device = "cuda";
  return c;
}

// The InputError's message of `f`, "" when it throws none.
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// shm, tcp and mpi stage GPU buffers through host memory (comm/device_staging.h), so they
// are what they say on a GPU too: the way several ranks share one GPU.
TEST(DevicePlacement, AutoMeansNcclOnAGpuAndHostBackendsStayWhatTheySay) {
  TrainConfig c = gpu_config();
  EXPECT_EQ(backend_on(c, kGpu), "nccl");
  c.backend = "nccl";
  EXPECT_EQ(backend_on(c, kGpu), "nccl");
  for (const char* host : {"shm", "tcp", "mpi"}) {
    c.backend = host;
    EXPECT_EQ(backend_on(c, kGpu), host);
    EXPECT_EQ(backend_on(c, kCpu), host);
  }
  c.backend = "auto";
  EXPECT_EQ(backend_on(c, kCpu), "auto");  // the CPU's own choice (shm, tcp or mpi) is made later
}

TEST(DevicePlacement, ARankTakesTheGpuOfItsLocalRank) {
  TrainConfig c;
  comm::JobEnv job;
  job.local_rank = 3;
  EXPECT_EQ(place_training(c, job).kind, Device::CPU);
  c.device = "cuda";
  const int gpus = cuda::device_count();
  if (gpus > 3) {
    EXPECT_EQ(place_training(c, job).index, 3);
    EXPECT_EQ(cuda::current_device(), 3);
    cuda::set_device(0);
  } else {
    const std::string why = refusal([&] { place_training(c, job); });
    EXPECT_NE(why.find("local rank 3 trains on cuda:3 but this node has " + std::to_string(gpus)), std::string::npos)
        << why;
    EXPECT_NE(why.find("--nproc-per-node auto"), std::string::npos) << why;
    EXPECT_NE(why.find("--device cuda:0 --backend shm"), std::string::npos) << why;
  }
  c.device = "cuda:" + std::to_string(gpus);  // one past the last
  EXPECT_NE(refusal([&] { place_training(c, job); }).find("this node has " + std::to_string(gpus)), std::string::npos);
}

TEST(DevicePlacement, AModelIsWhereItsParametersAre) {
  Generator gen(1);
  nn::Linear lin(3, 2, true, nn::WeightLayout::OutIn, gen);
  EXPECT_EQ(model_device(lin).kind, Device::CPU);
  EXPECT_EQ(&memory_of(kCpu), &allocator_for(Device::CPU));
}
