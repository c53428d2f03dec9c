// Copies and fills of tensors on GPUs (tensor_copy.h).
#include "tensor/cuda/tensor_copy.h"

#include <memory>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/cuda_device_errors.h"
#include "tensor/cuda/device_copy.h"
#include "paratrain/tensor/cuda_device_guard.h"

namespace paratrain::detail {

namespace {

using cuda::detail::StridedLayout;

cudaStream_t stream_of(const Tensor& t) { return static_cast<cudaStream_t>(cuda::compute_stream(t.device_index())); }

StridedLayout layout_of(const Tensor& dst, const Tensor& src) {
  if (dst.dim() > cuda::detail::kMaxCopyDims)
    PT_THROW(InputError, "a copy on a GPU supports up to ", cuda::detail::kMaxCopyDims, " dimensions, not ", dst.dim(),
             " (", dst.to_string(), ")");
  StridedLayout l;
  l.ndim = static_cast<int>(dst.dim());
  for (int d = 0; d < l.ndim; ++d) {
    l.shape[d] = dst.size(d);
    l.dst_strides[d] = dst.stride(d);
    l.src_strides[d] = src.defined() ? src.stride(d) : 0;
  }
  return l;
}

using cuda::DeviceGuard;

bool plain_bytes(const Tensor& dst, const Tensor& src) {
  return dst.dtype() == src.dtype() && dst.is_contiguous() && src.is_contiguous();
}

// Both on the same GPU.
void copy_on_device(Tensor& dst, const Tensor& src) {
  DeviceGuard g(dst.device_index());
  if (plain_bytes(dst, src)) {
    PT_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(), cudaMemcpyDeviceToDevice, stream_of(dst)));
    return;
  }
  cuda::detail::strided_convert(dst.data_ptr(), dst.dtype(), src.data_ptr(), src.dtype(), layout_of(dst, src),
                                dst.numel(), stream_of(dst));
}

// Releases a host storage after the copies queued on a stream before it have run.
void keep_until_done(const Tensor& host, cudaStream_t s) {
  auto* keep = new std::shared_ptr<Storage>(host.storage());
  PT_CUDA_CHECK(cudaLaunchHostFunc(s, [](void* p) { delete static_cast<std::shared_ptr<Storage>*>(p); }, keep));
}

void host_to_device(Tensor& dst, const Tensor& src) {
  // The bytes to send: src itself when it already has dst's dtype and is contiguous.
  Tensor host = src.dtype() == dst.dtype() ? src.contiguous() : src.to(dst.dtype()).contiguous();
  DeviceGuard g(dst.device_index());
  Tensor target = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), Device::CUDA, dst.device_index());
  PT_CUDA_CHECK(cudaMemcpyAsync(target.data_ptr(), host.data_ptr(), host.nbytes(), cudaMemcpyHostToDevice, stream_of(dst)));
  // From pageable memory the call returns once the data was staged; from pinned memory it
  // returns at once, so the block must outlive the copy.
  if (host.is_pinned()) keep_until_done(host, stream_of(dst));
  if (!dst.is_contiguous()) copy_on_device(dst, target);
}

void device_to_host(Tensor& dst, const Tensor& src) {
  DeviceGuard g(src.device_index());
  Tensor dev = src.is_contiguous() ? src : src.contiguous();
  const bool direct = dst.is_contiguous() && dst.dtype() == src.dtype();
  Tensor host = direct ? dst : Tensor::empty(src.shape(), src.dtype());
  PT_CUDA_CHECK(cudaMemcpyAsync(host.data_ptr(), dev.data_ptr(), dev.nbytes(), cudaMemcpyDeviceToHost, stream_of(src)));
  cuda::synchronize(stream_of(src));
  cuda::raise_device_errors(src.device_index());  // what its kernels found without a wait
  if (!direct) dst.copy_(host);
}

void device_to_device(Tensor& dst, const Tensor& src) {
  // The bytes to send, contiguous in src's dtype on src's GPU; converted on dst's GPU.
  Tensor from = src.is_contiguous() ? src : src.contiguous();
  DeviceGuard g(dst.device_index());
  const bool direct = plain_bytes(dst, from);
  Tensor landing = direct ? dst : Tensor::empty(src.shape(), src.dtype(), Device::CUDA, dst.device_index());
  cuda::stream_wait(cuda::compute_stream(dst.device_index()), cuda::compute_stream(src.device_index()));
  PT_CUDA_CHECK(cudaMemcpyPeerAsync(landing.data_ptr(), dst.device_index(), from.data_ptr(), src.device_index(),
                                    from.nbytes(), stream_of(dst)));
  // src's GPU may reuse `from` only after the copy: its stream waits for dst's.
  cuda::stream_wait(cuda::compute_stream(src.device_index()), cuda::compute_stream(dst.device_index()));
  if (!direct) copy_on_device(dst, landing);
}

}  // namespace

void cuda_copy(Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  if (dst.is_cuda() && src.is_cuda()) {
    if (dst.device_index() == src.device_index())
      copy_on_device(dst, src);
    else
      device_to_device(dst, src);
  } else if (dst.is_cuda()) {
    host_to_device(dst, src);
  } else {
    device_to_host(dst, src);
  }
}

void cuda_fill(Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  DeviceGuard g(dst.device_index());
  if (value == 0.0 && dst.is_contiguous()) {
    PT_CUDA_CHECK(cudaMemsetAsync(dst.data_ptr(), 0, dst.nbytes(), stream_of(dst)));
    return;
  }
  cuda::detail::strided_fill(dst.data_ptr(), dst.dtype(), layout_of(dst, Tensor()), dst.numel(), value, stream_of(dst));
}

}  // namespace paratrain::detail
