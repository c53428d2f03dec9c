// The CUDA elementwise kernels, bias add/backward, dropout, strided_add, casts and the
// K == 0 GEMM scaling (kernels/cuda/basic.h), for f32, bf16 and f16.
//
// Each is one grid-stride loop (launch.h) reading T, computing in f32 with the CPU kernel's
// formula (elementwise.cpp: the AVX2 forms of gelu), storing T once. bias_backward sums each
// column over the rows in f32 in a fixed order (deterministic) and adds once, as the CPU.
#include <cmath>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/launch.h"
#include "paratrain/kernels/cpu/elementwise.h"

namespace paratrain::kernels::cuda {
namespace {

using detail::Elem;
using detail::launch_each;

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;
constexpr float kGeluCap = 80.0f;                 // exp(-2u) above e^80: gelu (and gelu') is 0

template <DType T>
using S = typename Elem<T>::S;

template <DType T>
S<T>* out_ptr(void* p) {
  return static_cast<S<T>*>(p);
}
template <DType T>
const S<T>* in_ptr(const void* p) {
  return static_cast<const S<T>*>(p);
}

// x / (1 + exp(-2u)), u = beta (x + kappa x^3): the CPU's AVX2 form of the tanh GELU, with
// its FMAs where it has them (exp differs: CUDA's expf vs the CPU's polynomial, 2 ulp each).
__device__ inline float gelu(float x) {
  const float x3 = (x * x) * x;
  const float z = (-2.0f * kGeluBeta) * fmaf(kGeluKappa, x3, x);
  if (z > kGeluCap) return 0.0f;
  return x / (1.0f + expf(fminf(z, kGeluCap)));
}
// gelu'(x) = s + 2 x s (1 - s) beta (1 + 3 kappa x^2), s = sigmoid(2u), 1 - s = exp(-2u) s
__device__ inline float gelu_grad(float x) {
  const float x2 = x * x;
  const float u = kGeluBeta * fmaf(kGeluKappa * x2, x, x);
  const float z = -2.0f * u;
  if (z > kGeluCap) return 0.0f;
  const float ex = expf(fminf(z, kGeluCap));
  const float s = 1.0f / (1.0f + ex);
  const float one_minus_s = ex * s;
  const float poly = kGeluBeta * fmaf(3.0f * kGeluKappa, x2, 1.0f);
  return s + (2.0f * x) * (s * one_minus_s) * poly;
}

// dbias[c] += sum_n dout[n,c]: block (32, kRows) owns 32 columns; thread (x, y) sums rows
// y, y + kRows, ... in order, then thread (x, 0) adds the kRows partials in order.
constexpr int kBiasCols = 32, kBiasRows = 16;
template <DType T>
__global__ void bias_backward_kernel(S<T>* dbias, const S<T>* dout, int64_t N, int64_t C) {
  __shared__ float part[kBiasRows][kBiasCols + 1];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBiasCols + threadIdx.x;
  float acc = 0.0f;
  if (c < C)
    for (int64_t r = threadIdx.y; r < N; r += kBiasRows) acc += Elem<T>::load(dout[r * C + c]);
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.0f;
    for (int y = 0; y < kBiasRows; ++y) s += part[y][threadIdx.x];
    dbias[c] = Elem<T>::store(Elem<T>::load(dbias[c]) + s);
  }
}

// ---- strided views (as elementwise.cpp's make_view: size-1 dims dropped, contiguous dims merged) ----
constexpr int kMaxDims = 6;
struct View {
  int nd = 0;  // dims in use, innermost last
  int64_t size[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};
  int64_t count = 1;
};

View make_view(int ndim, const int64_t* sizes, const int64_t* strides, const char* who) {
  if (ndim < 0 || ndim > kMaxDims) PT_THROW(InputError, who, ": ndim must be 0..6, got ", ndim);
  View v;
  for (int d = 0; d < ndim; ++d) {
    if (sizes[d] < 0) PT_THROW(InputError, who, ": negative size ", sizes[d], " in dim ", d);
    v.count *= sizes[d];
    if (sizes[d] == 1) continue;
    if (strides[d] == 0 && sizes[d] > 1) PT_THROW(InputError, who, ": a 0 stride maps several elements to one address");
    if (v.nd > 0 && v.stride[v.nd - 1] == strides[d] * sizes[d]) {  // merge with the previous dim
      v.size[v.nd - 1] *= sizes[d];
      v.stride[v.nd - 1] = strides[d];
    } else {
      v.size[v.nd] = sizes[d];
      v.stride[v.nd] = strides[d];
      ++v.nd;
    }
  }
  return v;
}

// The element offset of the i-th element (row-major order) of the view.
__device__ inline int64_t view_offset(const View& v, int64_t i) {
  int64_t off = 0;
  for (int d = v.nd - 1; d >= 0; --d) {
    off += (i % v.size[d]) * v.stride[d];
    i /= v.size[d];
  }
  return off;
}

}  // namespace

template <DType T>
void fill(void* out, float value, int64_t n) {
  auto* o = out_ptr<T>(out);
  launch_each(n, "fill", [=] __device__(int64_t i) { o[i] = Elem<T>::store(value); });
}
template <DType T>
void copy(void* out, const void* a, int64_t n) {
  detail::check_count(n, "copy");
  if (n == 0 || out == a) return;
  PT_CUDA_CHECK(cudaMemcpyAsync(out, a, static_cast<size_t>(n) * sizeof(S<T>), cudaMemcpyDeviceToDevice,
                                detail::stream()));
}
template <DType T>
void add(void* out, const void* a, const void* b, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto *x = in_ptr<T>(a), *y = in_ptr<T>(b);
  launch_each(n, "add", [=] __device__(int64_t i) { o[i] = Elem<T>::store(Elem<T>::load(x[i]) + Elem<T>::load(y[i])); });
}
template <DType T>
void sub(void* out, const void* a, const void* b, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto *x = in_ptr<T>(a), *y = in_ptr<T>(b);
  launch_each(n, "sub", [=] __device__(int64_t i) { o[i] = Elem<T>::store(Elem<T>::load(x[i]) - Elem<T>::load(y[i])); });
}
template <DType T>
void mul(void* out, const void* a, const void* b, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto *x = in_ptr<T>(a), *y = in_ptr<T>(b);
  launch_each(n, "mul", [=] __device__(int64_t i) { o[i] = Elem<T>::store(Elem<T>::load(x[i]) * Elem<T>::load(y[i])); });
}
template <DType T>
void scale(void* out, const void* a, float s, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(a);
  launch_each(n, "scale", [=] __device__(int64_t i) { o[i] = Elem<T>::store(s * Elem<T>::load(x[i])); });
}
template <DType T>
void axpy(void* y, const void* x, float alpha, int64_t n) {
  auto* o = out_ptr<T>(y);
  auto* a = in_ptr<T>(x);
  launch_each(n, "axpy", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(Elem<T>::load(o[i]) + alpha * Elem<T>::load(a[i]));
  });
}
template <DType T>
void mul_acc(void* out, const void* a, const void* b, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto *x = in_ptr<T>(a), *y = in_ptr<T>(b);
  launch_each(n, "mul_acc", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(Elem<T>::load(o[i]) + Elem<T>::load(x[i]) * Elem<T>::load(y[i]));
  });
}

template <DType T>
void relu_forward(void* out, const void* inp, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(n, "relu_forward", [=] __device__(int64_t i) {
    const float v = Elem<T>::load(x[i]);
    o[i] = Elem<T>::store(v > 0.0f ? v : 0.0f);
  });
}
template <DType T>
void relu_backward(void* dinp, const void* dout, const void* inp, int64_t n) {
  auto* d = out_ptr<T>(dinp);
  auto *g = in_ptr<T>(dout), *x = in_ptr<T>(inp);
  launch_each(n, "relu_backward", [=] __device__(int64_t i) {
    d[i] = Elem<T>::store(Elem<T>::load(d[i]) + (Elem<T>::load(x[i]) > 0.0f ? Elem<T>::load(g[i]) : 0.0f));
  });
}
template <DType T>
void gelu_forward(void* out, const void* inp, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(n, "gelu_forward", [=] __device__(int64_t i) { o[i] = Elem<T>::store(gelu(Elem<T>::load(x[i]))); });
}
template <DType T>
void gelu_backward(void* dinp, const void* dout, const void* inp, int64_t n) {
  auto* d = out_ptr<T>(dinp);
  auto *g = in_ptr<T>(dout), *x = in_ptr<T>(inp);
  launch_each(n, "gelu_backward", [=] __device__(int64_t i) {
    d[i] = Elem<T>::store(Elem<T>::load(d[i]) + Elem<T>::load(g[i]) * gelu_grad(Elem<T>::load(x[i])));
  });
}
template <DType T>
void tanh_forward(void* out, const void* inp, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(n, "tanh_forward", [=] __device__(int64_t i) { o[i] = Elem<T>::store(tanhf(Elem<T>::load(x[i]))); });
}
template <DType T>
void tanh_backward(void* dinp, const void* dout, const void* out, int64_t n) {
  auto* d = out_ptr<T>(dinp);
  auto *g = in_ptr<T>(dout), *y = in_ptr<T>(out);
  launch_each(n, "tanh_backward", [=] __device__(int64_t i) {
    const float t = Elem<T>::load(y[i]);
    d[i] = Elem<T>::store(Elem<T>::load(d[i]) + Elem<T>::load(g[i]) * (1.0f - t * t));
  });
}
template <DType T>
void sigmoid_forward(void* out, const void* inp, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(n, "sigmoid_forward", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(1.0f / (1.0f + expf(-Elem<T>::load(x[i]))));
  });
}
template <DType T>
void sigmoid_backward(void* dinp, const void* dout, const void* out, int64_t n) {
  auto* d = out_ptr<T>(dinp);
  auto *g = in_ptr<T>(dout), *y = in_ptr<T>(out);
  launch_each(n, "sigmoid_backward", [=] __device__(int64_t i) {
    const float s = Elem<T>::load(y[i]);
    d[i] = Elem<T>::store(Elem<T>::load(d[i]) + Elem<T>::load(g[i]) * s * (1.0f - s));
  });
}

template <DType T>
void bias_add(void* out, const void* bias, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_add: negative size N=", N, " C=", C);
  auto* o = out_ptr<T>(out);
  auto* b = in_ptr<T>(bias);
  launch_each(N * C, "bias_add", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(Elem<T>::load(o[i]) + Elem<T>::load(b[i % C]));
  });
}
template <DType T>
void bias_backward(void* dbias, const void* dout, int64_t N, int64_t C) {
  if (N < 0 || C < 0) PT_THROW(InputError, "bias_backward: negative size N=", N, " C=", C);
  if (C == 0) return;
  const int64_t blocks = (C + kBiasCols - 1) / kBiasCols;
  if (blocks > 0x7fffffff) PT_THROW(InputError, "bias_backward: C=", C, " is too large");
  bias_backward_kernel<T><<<static_cast<unsigned>(blocks), dim3(kBiasCols, kBiasRows), 0, detail::stream()>>>(
      out_ptr<T>(dbias), in_ptr<T>(dout), N, C);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType T>
void dropout_forward(void* out, const void* inp, const uint8_t* mask, float s, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(n, "dropout_forward", [=] __device__(int64_t i) {
    o[i] = Elem<T>::store(Elem<T>::load(x[i]) * static_cast<float>(mask[i]) * s);
  });
}
template <DType T>
void dropout_backward(void* dinp, const void* dout, const uint8_t* mask, float s, int64_t n) {
  auto* d = out_ptr<T>(dinp);
  auto* g = in_ptr<T>(dout);
  launch_each(n, "dropout_backward", [=] __device__(int64_t i) {
    d[i] = Elem<T>::store(Elem<T>::load(d[i]) + Elem<T>::load(g[i]) * static_cast<float>(mask[i]) * s);
  });
}

void dropout_mask(uint8_t* mask, uint64_t key, float p, int64_t n) {
  launch_each(n, "dropout_mask", [=] __device__(int64_t i) { mask[i] = cpu::dropout_keep(key, i, p); });
}

// The view has no two elements at one address (checked: no 0 stride), so no races.
template <DType T>
void strided_add(void* out, const void* inp, int ndim, const int64_t* sizes, const int64_t* strides) {
  const View v = make_view(ndim, sizes, strides, "strided_add");
  auto* o = out_ptr<T>(out);
  auto* x = in_ptr<T>(inp);
  launch_each(v.count, "strided_add", [=] __device__(int64_t i) {
    const int64_t off = view_offset(v, i);
    o[off] = Elem<T>::store(Elem<T>::load(o[off]) + Elem<T>::load(x[i]));
  });
}

template <DType T>
void cast_from_f32(void* out, const void* in, int64_t n) {
  auto* o = out_ptr<T>(out);
  auto* x = static_cast<const float*>(in);
  launch_each(n, "cast_from_f32", [=] __device__(int64_t i) { o[i] = Elem<T>::store(x[i]); });
}
template <DType T>
void cast_to_f32(void* out, const void* in, int64_t n) {
  auto* o = static_cast<float*>(out);
  auto* x = in_ptr<T>(in);
  launch_each(n, "cast_to_f32", [=] __device__(int64_t i) { o[i] = Elem<T>::load(x[i]); });
}

template <DType T>
void scale_matrices(void* C, int64_t M, int64_t N, int64_t ldc, float beta, int64_t batch, int64_t stride_c) {
  auto* c = out_ptr<T>(C);
  const int64_t per = M * N;
  launch_each(batch * per, "gemm", [=] __device__(int64_t i) {
    const int64_t b = i / per, r = (i % per) / N, col = i % N;
    S<T>& e = c[b * stride_c + r * ldc + col];
    e = beta == 0.0f ? Elem<T>::store(0.0f) : Elem<T>::store(beta * Elem<T>::load(e));
  });
}

// ---- instantiations ----
#define PT_INST(R, name, params)           \
  template R name<DType::F32> params;      \
  template R name<DType::BF16> params;     \
  template R name<DType::F16> params;
PT_INST(void, fill, (void*, float, int64_t))
PT_INST(void, copy, (void*, const void*, int64_t))
PT_INST(void, add, (void*, const void*, const void*, int64_t))
PT_INST(void, sub, (void*, const void*, const void*, int64_t))
PT_INST(void, mul, (void*, const void*, const void*, int64_t))
PT_INST(void, scale, (void*, const void*, float, int64_t))
PT_INST(void, axpy, (void*, const void*, float, int64_t))
PT_INST(void, mul_acc, (void*, const void*, const void*, int64_t))
PT_INST(void, relu_forward, (void*, const void*, int64_t))
PT_INST(void, relu_backward, (void*, const void*, const void*, int64_t))
PT_INST(void, gelu_forward, (void*, const void*, int64_t))
PT_INST(void, gelu_backward, (void*, const void*, const void*, int64_t))
PT_INST(void, tanh_forward, (void*, const void*, int64_t))
PT_INST(void, tanh_backward, (void*, const void*, const void*, int64_t))
PT_INST(void, sigmoid_forward, (void*, const void*, int64_t))
PT_INST(void, sigmoid_backward, (void*, const void*, const void*, int64_t))
PT_INST(void, bias_add, (void*, const void*, int64_t, int64_t))
PT_INST(void, bias_backward, (void*, const void*, int64_t, int64_t))
PT_INST(void, dropout_forward, (void*, const void*, const uint8_t*, float, int64_t))
PT_INST(void, dropout_backward, (void*, const void*, const uint8_t*, float, int64_t))
PT_INST(void, strided_add, (void*, const void*, int, const int64_t*, const int64_t*))
PT_INST(void, scale_matrices, (void*, int64_t, int64_t, int64_t, float, int64_t, int64_t))
#undef PT_INST
template void cast_from_f32<DType::BF16>(void*, const void*, int64_t);
template void cast_from_f32<DType::F16>(void*, const void*, int64_t);
template void cast_to_f32<DType::BF16>(void*, const void*, int64_t);
template void cast_to_f32<DType::F16>(void*, const void*, int64_t);

}  // namespace paratrain::kernels::cuda
