// The pipeline executor with its stages on one GPU: p rank threads share cuda:0 and talk over
// the posting-order emulation of nccl's send/recv rules (tests/parallel/posting_order_group.h;
// two nccl ranks cannot share one GPU), whose matched messages are copied device to device.
// What runs on the GPU is the executor's device side: receive buffers, losses and the seed on
// the device, activations handed between a rank's chunks, the compute stream waiting for each
// receive, the losses read back once; every schedule (interleaved with its message rounds
// too) must give the one-CPU-rank losses and gradients within f32 summation-order error.
// Two ranks (two GPUs over nccl, or one shared over shm): TrainCommandOnGpu.PipelineOnTwoRanksFollowsTheCpu.
#include <cuda_runtime.h>

#include "gpu/gpu_test_util.h"
#include "parallel/pipeline_emulation.h"

namespace paratrain {
namespace {

using namespace parallel::pipeline;

const DeviceSpec kGpu{Device::CUDA, 0};

// A matched message: the sender's kernels that wrote it are queued on the compute stream the
// rank threads share, so the device is synchronised around a plain device-to-device copy.
void copy_on_device(void* dst, const void* src, size_t bytes) {
  PT_CUDA_CHECK(cudaSetDevice(0));
  PT_CUDA_CHECK(cudaDeviceSynchronize());
  PT_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
  PT_CUDA_CHECK(cudaDeviceSynchronize());
}

TEST(PipelineExecutorOnGpu, EveryScheduleMatchesOneCpuRank) {
  PT_REQUIRE_GPU();
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubble})
    for (int p : {2, 4}) testing::expect_matches_one_rank({kind, p, 5, 1}, kGpu, 1e-5, copy_on_device);
  for (int p : {2, 3})
    for (int v : {2, 3}) testing::expect_matches_one_rank({ScheduleKind::Interleaved, p, 2 * p, v}, kGpu, 1e-5, copy_on_device);
}

}  // namespace
}  // namespace paratrain
