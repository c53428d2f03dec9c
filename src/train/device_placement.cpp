#include "device_placement.h"

#include "builtin_tasks.h"
#include "paratrain/base/error.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_allocator.h"

namespace paratrain::train {

DeviceSpec place_training(const TrainConfig& cfg, const comm::JobEnv& job) {
  DeviceSpec d = parse_device(cfg.device);
  if (d.kind == Device::CPU) return d;
  // validate_config said why there is no GPU at all; here: which one this rank takes.
  const int count = cuda::device_count();
  if (d.index < 0) {
    d.index = job.local_rank;
    if (d.index >= count)
      PT_THROW(InputError, "--device ", cfg.device, ": local rank ", job.local_rank, " trains on cuda:", job.local_rank,
               " but this node has ", count, count == 1 ? " GPU" : " GPUs",
               " (start one rank per GPU: paratrain launch --nproc-per-node auto; or share one GPU: "
               "--device cuda:0 --backend shm)");
  } else if (d.index >= count) {
    PT_THROW(InputError, "--device ", cfg.device, ": this node has ", count, count == 1 ? " GPU" : " GPUs",
             " (cuda:0 to cuda:", count - 1, ")");
  }
  cuda::set_device(d.index);
  return d;
}

std::string backend_on(const TrainConfig& c, const DeviceSpec& device) {
  return device.kind == Device::CUDA && c.backend == "auto" ? "nccl" : c.backend;
}

DeviceSpec model_device(const nn::Module& m) {
  for (const auto& [name, p] : m.named_parameters()) return p.device_spec();
  return {Device::CPU, -1};
}

Tensor upload(const Tensor& host, const DeviceSpec& device) {
  if (device.kind == Device::CPU || !host.defined()) return host;
  return host.pin_memory().to(device);
}

Allocator& memory_of(const DeviceSpec& device) {
  return device.kind == Device::CPU ? allocator_for(Device::CPU) : cuda::device_allocator(device.index);
}

}  // namespace paratrain::train
