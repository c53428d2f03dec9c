#include "comm/backends/nccl/rank_ordered.h"

#include <cstdint>

#include "kernels/cuda/launch.h"
#include "paratrain/base/error.h"

namespace paratrain::comm::nccl {
namespace {

using kernels::cuda::detail::Elem;
using kernels::cuda::detail::grid_for;
using kernels::cuda::detail::kThreads;

// The element rules: the accumulator W, exact loads, stores rounded as on the CPU.
template <DType D>
struct Float {
  using T = typename Elem<D>::S;
  using W = float;
  __device__ static W load(T v) { return Elem<D>::load(v); }
  __device__ static T store(W f) { return Elem<D>::store(f); }
};
template <typename I>
struct Int {
  using T = I;
  using W = I;
  __device__ static W load(T v) { return v; }
  __device__ static T store(W v) { return v; }
};

// reduce_kernels.cpp's combine: max/min keep a NaN of the accumulator or take the new one's.
template <ReduceOp Op, typename W>
__device__ W combine(W a, W b) {
  if constexpr (Op == ReduceOp::kSum || Op == ReduceOp::kAvg) return a + b;
  else if constexpr (Op == ReduceOp::kMax) return a > b ? a : (a == a ? b : a);
  else return a < b ? a : (a == a ? b : a);
}

template <typename C, ReduceOp Op>
__global__ void rank_ordered_kernel(const typename C::T* own, int rank, const typename C::T* slots, int64_t stride,
                                    int n, typename C::T* out, int64_t len) {
  using W = typename C::W;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < len; i += step) {
    W acc = C::load(rank == 0 ? own[i] : slots[i]);
    for (int p = 1; p < n; ++p) acc = combine<Op>(acc, C::load(p == rank ? own[i] : slots[p * stride + i]));
    if constexpr (Op == ReduceOp::kAvg) acc = acc / static_cast<W>(n);
    out[i] = C::store(acc);
  }
}

template <typename C>
void launch(const void* own, int rank, const void* slots, size_t stride, int n, void* out, size_t len, ReduceOp op,
            cudaStream_t s) {
  using T = typename C::T;
  auto* o = static_cast<const T*>(own);
  auto* x = static_cast<const T*>(slots);
  auto* y = static_cast<T*>(out);
  const auto st = static_cast<int64_t>(stride), l = static_cast<int64_t>(len);
  const unsigned blocks = grid_for(l);
  switch (op) {
    case ReduceOp::kSum: rank_ordered_kernel<C, ReduceOp::kSum><<<blocks, kThreads, 0, s>>>(o, rank, x, st, n, y, l); break;
    case ReduceOp::kAvg: rank_ordered_kernel<C, ReduceOp::kAvg><<<blocks, kThreads, 0, s>>>(o, rank, x, st, n, y, l); break;
    case ReduceOp::kMax: rank_ordered_kernel<C, ReduceOp::kMax><<<blocks, kThreads, 0, s>>>(o, rank, x, st, n, y, l); break;
    case ReduceOp::kMin: rank_ordered_kernel<C, ReduceOp::kMin><<<blocks, kThreads, 0, s>>>(o, rank, x, st, n, y, l); break;
  }
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void reduce_in_rank_order(const void* own, int rank, const void* slots, size_t stride, int n, void* out, size_t len,
                          DType dtype, ReduceOp op, cudaStream_t stream) {
  if (len == 0) return;
  switch (dtype) {
    case DType::F32: return launch<Float<DType::F32>>(own, rank, slots, stride, n, out, len, op, stream);
    case DType::BF16: return launch<Float<DType::BF16>>(own, rank, slots, stride, n, out, len, op, stream);
    case DType::F16: return launch<Float<DType::F16>>(own, rank, slots, stride, n, out, len, op, stream);
    case DType::I32: return launch<Int<int32_t>>(own, rank, slots, stride, n, out, len, op, stream);
    case DType::I64: return launch<Int<int64_t>>(own, rank, slots, stride, n, out, len, op, stream);
    default: PT_THROW(InputError, "nccl backend: dtype ", dtype_name(dtype), " is not supported (f32, bf16, f16, i32, i64)");
  }
}

}  // namespace paratrain::comm::nccl
