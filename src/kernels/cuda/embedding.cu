// The CUDA embedding (whole and vocabulary-parallel) and GPT-encoder kernels, f32 (kernels/cuda/basic.h; legends in
// kernels/cpu/embedding.h).
//
// Token ids are checked on the device without a wait: a kernel finds the first position
// whose id is outside [0,V) and records it (with the id) in the GPU's asynchronous error record
// (tensor/cuda_device_errors.h), which the host raises as the CPU kernel's InputError at its
// next wait for the GPU's results (a training step: when it reads the loss). Until then a bad
// id's output row is NaN in the forward and it adds nothing in the backward: no kernel reads or
// writes outside the tables. The backward adds each row's positions in position order, the
// CPU's order, so it is the CPU's result bit for bit and the same every run: the positions
// are sorted by row (CUB's stable radix sort, scratch from the caching allocator), then one
// block per run of equal rows adds them in order (embedding_kernels.cuh, which
// tests/kernels/embedding_emulated_test.cpp runs on the CPU). The positional part of
// encoder_backward sums over b in order.
#include <climits>
#include <cmath>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_device_errors.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::launch_each;

struct TokenCheckState {
  std::mutex mu;  // the scratch slot is reused in compute-stream order; enqueue under the lock
  unsigned long long* first_bad = nullptr;  // smallest bad position of one call, ULLONG_MAX if none
  TokenCheckState() { PT_CUDA_CHECK(cudaMalloc(&first_bad, sizeof(unsigned long long))); }
};

__global__ void find_bad_token(const int32_t* tokens, int64_t N, int64_t V, unsigned long long* first_bad) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += step)
    if (tokens[i] < 0 || tokens[i] >= V) atomicMin(first_bad, static_cast<unsigned long long>(i));
}

// One thread: the call's first bad position, if any, into the record unless it holds one.
__global__ void record_bad_token(const unsigned long long* first_bad, const int32_t* tokens, int64_t V,
                                 ::paratrain::cuda::DeviceErrorRecord* rec, const char* who, const char* what,
                                 const char* range) {
  const unsigned long long bad = *first_bad;
  if (bad == ULLONG_MAX || rec->code != 0) return;
  rec->position = static_cast<long long>(bad);
  rec->value = tokens[bad];
  rec->bound = V;
  rec->who = who, rec->what = what, rec->range = range;
  __threadfence_system();  // the fields before the code that says they are there
  rec->code = 1;
}

void check_sizes(int64_t N, int64_t V, int64_t C, const char* who) {
  if (N < 0 || V <= 0 || C < 0) PT_THROW(InputError, who, ": bad sizes N=", N, " V=", V, " C=", C);
}

// The vocabulary-shard lookups' sizes and rows [start, start + R).
void check_rows(int64_t N, int64_t V, int64_t start, int64_t R, int64_t C, const char* who) {
  check_sizes(N, V, C, who);
  if (start < 0 || R < 0) PT_THROW(InputError, who, ": bad rows start=", start, " R=", R);
}

// Records the first token id outside [0,V) for the host to raise later; never waits. `who`
// must be a string literal (it is read when the error is raised).
void check_tokens(const int32_t* tokens, int64_t N, int64_t V, const char* who) {
  if (N == 0) return;
  TokenCheckState& st = detail::per_device<TokenCheckState>();
  ::paratrain::cuda::DeviceErrorRecord* rec = ::paratrain::cuda::device_error_record();
  std::lock_guard<std::mutex> lock(st.mu);
  cudaStream_t s = detail::stream();
  PT_CUDA_CHECK(cudaMemsetAsync(st.first_bad, 0xff, sizeof(unsigned long long), s));  // ULLONG_MAX
  find_bad_token<<<detail::grid_for(N), detail::kThreads, 0, s>>>(tokens, N, V, st.first_bad);
  PT_CUDA_CHECK_LAUNCH();
  record_bad_token<<<1, 1, 0, s>>>(st.first_bad, tokens, V, rec, who, "token id", "the vocabulary");
  PT_CUDA_CHECK_LAUNCH();
}

// rows[t - start] (R x C) += dout[n] for every position n whose token t is in [start, start + R),
// positions in order; others (a bad id included) add nothing.
void ordered_scatter_add(float* rows, const float* dout, const int32_t* tokens, int64_t N, int64_t start, int64_t R,
                         int64_t C, const char* who) {
  if (N == 0 || R == 0 || C == 0) return;
  if (N > INT_MAX || R >= INT_MAX) PT_THROW(InputError, who, " (cuda): N=", N, " or R=", R, " past 2^31 - 1");
  const DeviceSpec dev{Device::CUDA, ::paratrain::cuda::current_device()};
  Tensor keys_in = Tensor::empty({N}, DType::I32, dev), keys = Tensor::empty({N}, DType::I32, dev);
  Tensor pos_in = Tensor::empty({N}, DType::I32, dev), pos = Tensor::empty({N}, DType::I32, dev);
  auto* ki = static_cast<int32_t*>(keys_in.data_ptr());
  auto* pi = static_cast<int32_t*>(pos_in.data_ptr());
  detail::launch_over(N, who, emb::shard_keys, ki, pi, tokens, N, start, R);
  cudaStream_t s = detail::stream();
  const int end_bit = emb::sort_end_bit(R);
  auto* ko = static_cast<int32_t*>(keys.data_ptr());
  auto* po = static_cast<int32_t*>(pos.data_ptr());
  // CUB's two calls: the scratch size (temp null), then the sort.
  size_t temp_bytes = 0;
  auto sort = [&](void* temp) {
    PT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, ki, ko, pi, po, static_cast<int>(N), 0, end_bit, s));
  };
  sort(nullptr);
  Tensor temp = Tensor::empty({static_cast<int64_t>(temp_bytes) + 1}, DType::U8, dev);
  sort(temp.data_ptr());
  emb::add_runs_in_order<<<static_cast<unsigned>(N), emb::kRunThreads, 0, s>>>(rows, dout, ko, po, N, R, C);
  PT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void embedding_forward(void* out, const int32_t* tokens, const void* wte, int64_t N, int64_t V, int64_t C) {
  check_sizes(N, V, C, "embedding_forward");
  check_tokens(tokens, N, V, "embedding_forward");
  auto* o = static_cast<float*>(out);
  auto* w = static_cast<const float*>(wte);
  launch_each(N * C, "embedding_forward", [=] __device__(int64_t i) {
    const int64_t n = i / C, c = i % C;
    const int32_t t = tokens[n];
    o[i] = t >= 0 && t < V ? w[static_cast<int64_t>(t) * C + c] : NAN;
  });
}

void embedding_backward(void* dwte, const void* dout, const int32_t* tokens, int64_t N, int64_t V, int64_t C) {
  check_sizes(N, V, C, "embedding_backward");
  check_tokens(tokens, N, V, "embedding_backward");
  ordered_scatter_add(static_cast<float*>(dwte), static_cast<const float*>(dout), tokens, N, 0, V, C,
                      "embedding_backward");
}

void vocab_embedding_forward(void* out, const int32_t* tokens, const void* wte, int64_t N, int64_t V, int64_t start,
                             int64_t R, int64_t C) {
  check_rows(N, V, start, R, C, "vocab_embedding_forward");
  check_tokens(tokens, N, V, "vocab_embedding_forward");
  auto* o = static_cast<float*>(out);
  auto* w = static_cast<const float*>(wte);
  launch_each(N * C, "vocab_embedding_forward", [=] __device__(int64_t i) {
    const int64_t n = i / C, c = i % C;
    const int64_t row = static_cast<int64_t>(tokens[n]) - start;
    o[i] = row >= 0 && row < R ? w[row * C + c] : 0.0f;
  });
}

void vocab_embedding_backward(void* dwte, const void* dout, const int32_t* tokens, int64_t N, int64_t V,
                              int64_t start, int64_t R, int64_t C) {
  check_rows(N, V, start, R, C, "vocab_embedding_backward");
  check_tokens(tokens, N, V, "vocab_embedding_backward");
  ordered_scatter_add(static_cast<float*>(dwte), static_cast<const float*>(dout), tokens, N, start, R, C,
                      "vocab_embedding_backward");
}

void encoder_forward(void* out, const int32_t* tokens, const void* wte, const void* wpe, int64_t B, int64_t T,
                     int64_t V, int64_t C) {
  if (B < 0 || T < 0) PT_THROW(InputError, "encoder_forward: negative size B=", B, " T=", T);
  check_sizes(B * T, V, C, "encoder_forward");
  check_tokens(tokens, B * T, V, "encoder_forward");
  auto* o = static_cast<float*>(out);
  auto* w = static_cast<const float*>(wte);
  auto* p = static_cast<const float*>(wpe);
  launch_each(B * T * C, "encoder_forward", [=] __device__(int64_t i) {
    const int64_t bt = i / C, c = i % C;
    const int32_t t = tokens[bt];
    o[i] = t >= 0 && t < V ? w[static_cast<int64_t>(t) * C + c] + p[(bt % T) * C + c] : NAN;
  });
}

void encoder_backward(void* dwte, void* dwpe, const void* dout, const int32_t* tokens, int64_t B, int64_t T,
                      int64_t V, int64_t C) {
  if (B < 0 || T < 0 || C < 0) PT_THROW(InputError, "encoder_backward: negative size B=", B, " T=", T, " C=", C);
  auto* g = static_cast<const float*>(dout);
  if (dwte) embedding_backward(dwte, dout, tokens, B * T, V, C);
  if (dwpe) {
    detail::launch_over(T * C, "encoder_backward", emb::add_positions_in_order, static_cast<float*>(dwpe), g, B, T,
                        C);
  }
}

}  // namespace paratrain::kernels::cuda
