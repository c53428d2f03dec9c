// The CUDA reductions into device memory (kernels/cuda/reduce_into.h).
//
// The double sums run in two stages, deterministic for a given n: up to kBlocks blocks each
// sum a grid-stride share in double and combine it in shared memory (a fixed tree) into one
// partial; one block adds the partials the same way and hands the total to an epilogue that
// writes the result. The partials live in a per-device buffer: the compute stream orders the
// stages of successive calls, and a per-device mutex keeps two host threads from interleaving
// their two launches.
#include <cuda_runtime.h>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/reduce_into.h"
#include "paratrain/kernels/cpu/softmax.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::Elem;
using detail::launch_each;

constexpr int kSumThreads = 256;
constexpr int kBlocks = 1024;
constexpr int32_t kIgnore = cpu::kIgnoreIndex;

struct IntoState {
  std::mutex mu;
  double* partial = nullptr;  // kBlocks sums
  double* counts = nullptr;   // kBlocks counts (crossentropy_mean; exact below 2^53)
  IntoState() {
    PT_CUDA_CHECK(cudaMalloc(&partial, kBlocks * sizeof(double)));
    PT_CUDA_CHECK(cudaMalloc(&counts, kBlocks * sizeof(double)));
  }
};

// Sum of the block's threads' `v` (a fixed tree), returned to every thread.
__device__ inline double block_sum(double v) { return detail::block_sum_double<kSumThreads>(v); }

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kSumThreads - 1) / kSumThreads;
  return static_cast<unsigned>(b < kBlocks ? b : kBlocks);
}

// Stage 1: partial[block] = sum over the block's grid-stride share of term(i).
template <typename Term>
__global__ void partial_sums(Term term, int64_t n, double* partial) {
  double acc = 0.0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) acc += term(i);
  const double s = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Stage 2 (one block): epilogue(sum of the `count` partials), in thread 0.
template <typename Epilogue>
__global__ void final_sum(const double* partial, int count, Epilogue epilogue) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < count; i += kSumThreads) acc += partial[i];
  const double s = block_sum(acc);
  if (threadIdx.x == 0) epilogue(s);
}

// Enqueues epilogue(sum over [0, n) of term(i)); n == 0 gives epilogue(0.0).
template <typename Term, typename Epilogue>
void enqueue_sum(int64_t n, const char* who, Term term, Epilogue epilogue) {
  detail::check_count(n, who);
  IntoState& st = detail::per_device<IntoState>();
  std::lock_guard<std::mutex> lock(st.mu);
  cudaStream_t s = detail::stream();
  const unsigned blocks = n > 0 ? blocks_for(n) : 0;
  if (blocks) {
    partial_sums<<<blocks, kSumThreads, 0, s>>>(term, n, st.partial);
    PT_CUDA_CHECK_LAUNCH();
  }
  final_sum<<<1, kSumThreads, 0, s>>>(st.partial, static_cast<int>(blocks), epilogue);
  PT_CUDA_CHECK_LAUNCH();
}

// crossentropy_mean's stage 1: the losses' and the counted targets' partial sums.
__global__ void loss_count_partials(const float* losses, const int32_t* targets, int64_t n, double* partial,
                                    double* counts) {
  double acc = 0.0, cnt = 0.0;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    acc += static_cast<double>(losses[i]);
    cnt += targets[i] != kIgnore ? 1.0 : 0.0;
  }
  const double s = block_sum(acc);
  const double c = block_sum(cnt);
  if (threadIdx.x == 0) {
    partial[blockIdx.x] = s;
    counts[blockIdx.x] = c;
  }
}

// Stage 2: count = sum of the counts, out = float(total / count) (0 when count is 0).
__global__ void loss_mean_final(const double* partial, const double* counts, int nparts, float* out,
                                int64_t* count) {
  double acc = 0.0, cnt = 0.0;
  for (int i = threadIdx.x; i < nparts; i += kSumThreads) {
    acc += partial[i];
    cnt += counts[i];
  }
  const double s = block_sum(acc);
  const double c = block_sum(cnt);
  if (threadIdx.x == 0) {
    const int64_t k = static_cast<int64_t>(c);
    *count = k;
    *out = static_cast<float>(k ? s / static_cast<double>(k) : 0.0);
  }
}

}  // namespace

template <DType T>
void sum_squares_into(double* slot, const void* x, int64_t n) {
  const auto* p = static_cast<const typename Elem<T>::S*>(x);
  enqueue_sum(
      n, "sum_squares_into",
      [=] __device__(int64_t i) {
        const double v = static_cast<double>(Elem<T>::load(p[i]));
        return v * v;
      },
      [=] __device__(double total) { *slot = total; });
}

template <DType T>
void nonfinite_into(int32_t* flag, const void* x, int64_t n) {
  const auto* p = static_cast<const typename Elem<T>::S*>(x);
  launch_each(n, "nonfinite_into", [=] __device__(int64_t i) {
    if (!Elem<T>::finite(p[i])) *flag = 1;  // every writer writes the same value
  });
}

template <DType T>
void sum_scaled(void* out, const void* x, double factor, int64_t n) {
  const auto* p = static_cast<const typename Elem<T>::S*>(x);
  float* o = static_cast<float*>(out);
  enqueue_sum(
      n, "sum_scaled", [=] __device__(int64_t i) { return static_cast<double>(Elem<T>::load(p[i])); },
      [=] __device__(double total) { *o = static_cast<float>(total * factor); });
}

template <DType T>
void fill_scaled(void* out, const void* g, double factor, int64_t n) {
  auto* o = static_cast<typename Elem<T>::S*>(out);
  const float* gp = static_cast<const float*>(g);
  launch_each(n, "fill_scaled", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(static_cast<float>(static_cast<double>(*gp) * factor));
  });
}

void crossentropy_mean(void* out, int64_t* count, const void* losses, const int32_t* targets, int64_t N) {
  detail::check_count(N, "crossentropy_mean");
  IntoState& st = detail::per_device<IntoState>();
  std::lock_guard<std::mutex> lock(st.mu);
  cudaStream_t s = detail::stream();
  const unsigned blocks = N > 0 ? blocks_for(N) : 0;
  if (blocks) {
    loss_count_partials<<<blocks, kSumThreads, 0, s>>>(static_cast<const float*>(losses), targets, N, st.partial,
                                                        st.counts);
    PT_CUDA_CHECK_LAUNCH();
  }
  loss_mean_final<<<1, kSumThreads, 0, s>>>(st.partial, st.counts, static_cast<int>(blocks),
                                            static_cast<float*>(out), count);
  PT_CUDA_CHECK_LAUNCH();
}

void crossentropy_grad_scale(void* dlosses, const void* g, const int64_t* count, int64_t N) {
  float* dl = static_cast<float*>(dlosses);
  const float* gp = static_cast<const float*>(g);
  launch_each(N, "crossentropy_grad_scale", [=] __device__(int64_t i) {
    const int64_t c = *count;
    dl[i] = c ? static_cast<float>(static_cast<double>(*gp) / static_cast<double>(c)) : 0.0f;
  });
}

#define PT_INST(name, params)            \
  template void name<DType::F32> params; \
  template void name<DType::BF16> params; \
  template void name<DType::F16> params;
PT_INST(sum_squares_into, (double*, const void*, int64_t))
PT_INST(nonfinite_into, (int32_t*, const void*, int64_t))
PT_INST(sum_scaled, (void*, const void*, double, int64_t))
PT_INST(fill_scaled, (void*, const void*, double, int64_t))
#undef PT_INST

}  // namespace paratrain::kernels::cuda
