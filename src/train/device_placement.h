// Where a run trains (TrainConfig::device) and what that decides: the GPU of each rank, the
// backend `auto` means, and the allocator whose figures the metrics report (every built-in
// model, layout, schedule and compression runs on a GPU). Internal to the train layer.
//
// --device cuda gives every rank the GPU of its local rank (cuda:LOCAL_RANK, as
// `paratrain launch --nproc-per-node auto` starts one rank per GPU); cuda:N puts every rank
// of the node on GPU N (one rank per node, or a user who knows better). The chosen GPU
// becomes the calling thread's current device, so everything the run allocates on "cuda"
// lands there and the nccl groups are built on it.
#pragma once

#include <string>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/module.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/device.h"
#include "paratrain/train/config.h"

namespace paratrain::train {

// The device this rank trains on (cpu, or its GPU made current). InputError when the GPU
// does not exist on this node, naming the local rank and how many GPUs there are.
DeviceSpec place_training(const TrainConfig& cfg, const comm::JobEnv& job);

// The process-group backend for `cfg.backend` on `device`: auto is nccl for GPU tensors
// (the default choice, shm/tcp, otherwise). shm, tcp and mpi take GPU tensors too, staged
// through host memory (comm/device_staging.h): slower, but several ranks may share one GPU,
// which NCCL refuses.
std::string backend_on(const TrainConfig& cfg, const DeviceSpec& device);

// The device of a module's parameters (its first one; cpu for a module without any): where
// its inputs go.
DeviceSpec model_device(const nn::Module& m);

// `host` (a batch's tensor) on `device`: itself on the CPU; on a GPU a page-locked copy goes
// up asynchronously (the pinned block is reused only once the copy has run).
Tensor upload(const Tensor& host, const DeviceSpec& device);

// The allocator of the device's memory: the figures (in use, peak) of the run's tensors.
Allocator& memory_of(const DeviceSpec& device);

}  // namespace paratrain::train
