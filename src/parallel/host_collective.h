// Private to the parallel layer: small collectives on host values (fingerprints, a bucket
// order, a norm's partial sums) through a group whose buffers may have to live on a GPU.
//
// `staging` is where the group's buffers live: the CPU (shm/tcp/mpi: the host buffers are
// handed over as they are, the same calls as before) or a GPU (nccl: the values are copied to
// a buffer on that GPU, the collective runs on it, the result is copied back; the copy back
// waits for the device). Blocking: each returns once the result is in the host buffer.
#pragma once

#include <cstddef>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel::detail {

inline void allgather_host(comm::ProcessGroup& pg, const void* in, void* out, size_t count, DType dtype,
                           DeviceSpec staging = {}) {
  if (staging.kind == Device::CPU) {
    pg.allgather(in, out, count, dtype)->wait();
    return;
  }
  const auto n = static_cast<int64_t>(count), all = n * pg.size();
  Tensor din = Tensor::empty({n}, dtype, staging), dout = Tensor::empty({all}, dtype, staging);
  din.copy_(Tensor::from_blob(const_cast<void*>(in), {n}, dtype));
  pg.allgather(din.data_ptr(), dout.data_ptr(), count, dtype)->wait();
  Tensor::from_blob(out, {all}, dtype).copy_(dout);
}

inline void broadcast_host(comm::ProcessGroup& pg, void* buf, size_t count, DType dtype, int root,
                           DeviceSpec staging = {}) {
  if (staging.kind == Device::CPU) {
    pg.broadcast(buf, count, dtype, root)->wait();
    return;
  }
  const auto n = static_cast<int64_t>(count);
  Tensor host = Tensor::from_blob(buf, {n}, dtype);
  Tensor d = Tensor::empty({n}, dtype, staging);
  d.copy_(host);
  pg.broadcast(d.data_ptr(), count, dtype, root)->wait();
  host.copy_(d);
}

}  // namespace paratrain::parallel::detail
