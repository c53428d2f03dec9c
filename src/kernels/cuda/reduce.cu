// The CUDA full reductions (kernels/cuda/basic.h): sum and sum_squares in double, all_finite.
//
// Two stages, deterministic for a given n: up to kBlocks blocks each sum a grid-stride share
// of x in double and reduce it in shared memory (a fixed tree) to one partial; one block
// adds the partials the same way. The result is copied to the host and the compute stream
// waited for, so these calls synchronize. The partials live in a per-device buffer, so a
// per-device mutex covers enqueue to read-back (two host threads cannot interleave).
#include "kernels/cuda/basic.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_device_errors.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::Elem;

constexpr int kReduceThreads = 256;
constexpr int kBlocks = 1024;

struct ReduceState {
  std::mutex mu;
  double* partial = nullptr;  // kBlocks partials, then the result
  int* flag = nullptr;        // all_finite: 1 once a non-finite element is seen
  ReduceState() {
    PT_CUDA_CHECK(cudaMalloc(&partial, (kBlocks + 1) * sizeof(double)));
    PT_CUDA_CHECK(cudaMalloc(&flag, sizeof(int)));
  }
};

// Sum of the block's threads' `v` (a fixed tree).
__device__ inline double block_sum(double v) { return detail::block_sum_double<kReduceThreads>(v); }

template <DType T, bool Square>
__global__ void partial_sums(const typename Elem<T>::S* x, int64_t n, double* partial) {
  double acc = 0.0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const double v = static_cast<double>(Elem<T>::load(x[i]));
    acc += Square ? v * v : v;
  }
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void final_sum(double* partial, int count) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kReduceThreads) acc += partial[i];
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[kBlocks] = s;
}

template <DType T>
__global__ void find_nonfinite(const typename Elem<T>::S* x, int64_t n, int* flag) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step)
    if (!Elem<T>::finite(x[i])) *flag = 1;  // every writer writes the same value
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kReduceThreads - 1) / kReduceThreads;
  return static_cast<unsigned>(b < kBlocks ? b : kBlocks);
}

template <DType T, bool Square>
double reduce_sum(const void* x, int64_t n, const char* who) {
  detail::check_count(n, who);
  if (n == 0) return 0.0;
  ReduceState& st = detail::per_device<ReduceState>();
  std::lock_guard<std::mutex> lock(st.mu);
  cudaStream_t s = detail::stream();
  const unsigned blocks = blocks_for(n);
  partial_sums<T, Square><<<blocks, kReduceThreads, 0, s>>>(static_cast<const typename Elem<T>::S*>(x), n,
                                                            st.partial);
  PT_CUDA_CHECK_LAUNCH();
  final_sum<<<1, kReduceThreads, 0, s>>>(st.partial, static_cast<int>(blocks));
  PT_CUDA_CHECK_LAUNCH();
  double result = 0.0;
  PT_CUDA_CHECK(cudaMemcpyAsync(&result, st.partial + kBlocks, sizeof(double), cudaMemcpyDeviceToHost, s));
  ::paratrain::cuda::synchronize(s);
  ::paratrain::cuda::raise_device_errors();
  return result;
}

}  // namespace

template <DType T>
double sum(const void* x, int64_t n) {
  return reduce_sum<T, false>(x, n, "sum");
}
template <DType T>
double sum_squares(const void* x, int64_t n) {
  return reduce_sum<T, true>(x, n, "sum_squares");
}
template <DType T>
bool all_finite(const void* x, int64_t n) {
  detail::check_count(n, "all_finite");
  if (n == 0) return true;
  ReduceState& st = detail::per_device<ReduceState>();
  std::lock_guard<std::mutex> lock(st.mu);
  cudaStream_t s = detail::stream();
  PT_CUDA_CHECK(cudaMemsetAsync(st.flag, 0, sizeof(int), s));
  find_nonfinite<T><<<blocks_for(n), kReduceThreads, 0, s>>>(static_cast<const typename Elem<T>::S*>(x), n,
                                                             st.flag);
  PT_CUDA_CHECK_LAUNCH();
  int bad = 0;
  PT_CUDA_CHECK(cudaMemcpyAsync(&bad, st.flag, sizeof(int), cudaMemcpyDeviceToHost, s));
  ::paratrain::cuda::synchronize(s);
  ::paratrain::cuda::raise_device_errors();
  return bad == 0;
}

#define PT_INST(R, name)                                   \
  template R name<DType::F32>(const void*, int64_t);       \
  template R name<DType::BF16>(const void*, int64_t);      \
  template R name<DType::F16>(const void*, int64_t);
PT_INST(double, sum)
PT_INST(double, sum_squares)
PT_INST(bool, all_finite)
#undef PT_INST

}  // namespace paratrain::kernels::cuda
