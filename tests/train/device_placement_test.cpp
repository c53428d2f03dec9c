// The train layer's device decisions (src/train/device_placement.h): what runs on a GPU, the
// backend `auto` means there, and a rank's GPU. Runs everywhere: the GPU is only named, never
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

void expect_refused(const TrainConfig& c, const parallel::MeshShape& shape, const std::string& needle) {
  const std::string why = refusal([&] { check_layout_on_device(c, shape, kGpu); });
  EXPECT_NE(why.find(needle), std::string::npos) << "expected '" << needle << "' in: '" << why << "'";
  EXPECT_NE(why.find("--device cuda"), std::string::npos) << why;
  // The same configuration on the CPU is not this check's business.
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, shape, kCpu); }), "");
}

}  // namespace

TEST(DevicePlacement, LayoutsThatDoNotRunOnAGpuAreRefusedByNameAndTheOthersRun) {
  TrainConfig c = gpu_config();
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {1, 1, 1}, kGpu); }), "");
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {4, 1, 1}, kGpu); }), "");  // DDP
  c.zero = 2;
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "");  // ZeRO 2
  // Tensor parallelism, with and without the sequence split, alone and with DDP / ZeRO.
  EXPECT_EQ(refusal([&] { check_layout_on_device(gpu_config(), {1, 2, 1}, kGpu); }), "");
  c = gpu_config(), c.sequence_parallel = true;
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {1, 2, 1}, kGpu); }), "");
  c = gpu_config(), c.zero = 1;
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 2, 1}, kGpu); }), "");
  // Pipeline parallelism, alone and with tensor and data parallelism, with every schedule
  // (their messages go in rounds that pair up under nccl's posting-order matching).
  for (const char* schedule : {"gpipe", "1f1b", "zb1p", "interleaved"}) {
    c = gpu_config(), c.pp_schedule = schedule;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {1, 1, 2}, kGpu); }), "") << schedule;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 2, 2}, kGpu); }), "") << schedule;
  }
  c = gpu_config(), c.zero = 3;
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "");  // ZeRO 3
  for (const char* half : {"bf16", "fp16"}) {  // ZeRO 3 casts its own collectives
    c.compress = half;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << half;
  }
  // DDP's buckets cast, and PowerSGD factors them, with the device's kernels.
  for (const char* kind : {"bf16", "fp16", "powersgd"}) {
    c = gpu_config(), c.compress = kind;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << kind;
    c.zero = 2;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << kind;
  }
  // --balance auto measures each rank's compute up to the step's read-back of its GPU.
  c = gpu_config(), c.balance = "auto";
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "");
  c = gpu_config(), c.deterministic = true;
  expect_refused(c, {2, 1, 1}, "--deterministic");
  EXPECT_EQ(refusal([&] { check_layout_on_device(c, {1, 1, 1}, kGpu); }), "");  // one rank: nothing to order
}

// Every built-in model has its kernels on a GPU: the CNN (conv2d, max-pool) and the MLP run
// there alone and with DDP/ZeRO like the GPT models.
TEST(DevicePlacement, EveryBuiltinModelRunsOnAGpu) {
  for (const char* model : {"gpt-nano", "gpt-mini", "mlp", "cnn"}) {
    TrainConfig c = gpu_config();
    c.model = model;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {1, 1, 1}, kGpu); }), "") << model;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << model;  // DDP
    c.zero = 2;
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << model;
    c.zero = 0, c.balance = "auto";  // and uneven micro-batches balanced by measured compute
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << model;
    c.balance = "none", c.compress = "powersgd";
    EXPECT_EQ(refusal([&] { check_layout_on_device(c, {2, 1, 1}, kGpu); }), "") << model;
  }
}

TEST(DevicePlacement, AutoMeansNcclOnAGpuAndHostBackendsAreRefusedThere) {
  TrainConfig c = gpu_config();
  EXPECT_EQ(backend_on(c, kGpu), "nccl");
  c.backend = "nccl";
  EXPECT_EQ(backend_on(c, kGpu), "nccl");
  for (const char* host : {"shm", "tcp", "mpi"}) {
    c.backend = host;
    const std::string why = refusal([&] { backend_on(c, kGpu); });
    EXPECT_NE(why.find(std::string("--backend ") + host + " moves host memory"), std::string::npos) << why;
    EXPECT_NE(why.find("--backend nccl (or auto)"), std::string::npos) << why;
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
