// The bf16/f16 GEMMs (half::gemm, half::gemm_batched): A, B, C in T, f32 accumulation,
// C = round_T(alpha op(A) op(B) + beta C), beta == 0 ignores C (NaN included).
//
// Two paths, chosen at run time (gemm_path() names the one taken):
//  - "onednn-bf16-native" (bf16 only): where the CPU has AVX512-BF16 or AMX
//    (__builtin_cpu_supports) and oneDNN's effective ISA allows avx512_core_bf16, oneDNN's
//    matmul primitive on bf16 memory: f32 accumulation, alpha as output scale, beta as a sum
//    post-op, the result rounded to bf16 once. Primitives are cached per thread by shape.
//    If oneDNN cannot build one, the call and every later one take the widening path.
//  - "widen-f32": A, B (and C when beta != 0) are widened into the half kernels' reused
//    thread-local scratch with the run-time-chosen vector conversion (exact), dnnl_sgemm
//    runs (gemm / gemm_batched of gemm.cpp), C is rounded back. The result is
//    round_T(the f32 GEMM of the same values).
// f16 always widens (AVX512-FP16 is not used).
#include <oneapi/dnnl/dnnl.hpp>

#include <atomic>
#include <cstring>
#include <unordered_map>

#include "kernels/cpu/half_util.h"
#include "paratrain/kernels/cpu/gemm.h"
#include "paratrain/kernels/cpu/half.h"

namespace paratrain::kernels::cpu {
namespace {

using detail::HalfT;
using detail::half_scratch;

void check_args(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb,
                int64_t ldc, const char* who) {
  if (M < 0 || N < 0 || K < 0) PT_THROW(InputError, who, ": negative size M=", M, " N=", N, " K=", K);
  const int64_t min_lda = ta ? M : K, min_ldb = tb ? K : N;
  if (lda < std::max<int64_t>(1, min_lda) || ldb < std::max<int64_t>(1, min_ldb) ||
      ldc < std::max<int64_t>(1, N))
    PT_THROW(InputError, who, ": leading dimension too small (lda=", lda, " ldb=", ldb,
             " ldc=", ldc, " for M=", M, " N=", N, " K=", K, ")");
}

// ---- run-time choice of the bf16 path ----
bool detect_native_bf16() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") && !__builtin_cpu_supports("amx-bf16")) return false;
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto need = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & need) == need;  // cpu_isa values are nested bit sets
}
std::atomic<bool> g_native_broken{false};  // oneDNN refused a bf16 matmul: widen from then on

bool use_native_bf16() {
  return cpu_has_native_bf16() && !g_native_broken.load(std::memory_order_relaxed);
}

// ---- oneDNN matmul over plain strided row-major memory of data type dt ----
struct MatmulKey {
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc;
  uint32_t alpha, beta;
  int dt;
  bool operator==(const MatmulKey&) const = default;
};
struct MatmulKeyHash {
  size_t operator()(const MatmulKey& k) const {
    size_t h = static_cast<size_t>(k.dt) * 4 + k.ta * 2 + k.tb;
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t{k.alpha}, int64_t{k.beta}})
      h = h * 0x9e3779b97f4a7c15ull + static_cast<size_t>(v);
    return h;
  }
};
struct Matmul {
  dnnl::memory::desc a, b, c;
  dnnl::matmul prim;
};

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// C = alpha op(A) op(B) + beta C on dt memory; M, N, K > 0, arguments checked.
void onednn_matmul(dnnl::memory::data_type dt, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                   float alpha, const void* A, int64_t lda, const void* B, int64_t ldb, float beta,
                   void* C, int64_t ldc) {
  using dims = dnnl::memory::dims;
  thread_local std::unordered_map<MatmulKey, Matmul, MatmulKeyHash> cache;
  const MatmulKey key{ta, tb, M, N, K, lda, ldb, ldc, bits_of(alpha), bits_of(beta), static_cast<int>(dt)};
  auto it = cache.find(key);
  if (it == cache.end()) {
    if (cache.size() >= 512) cache.clear();  // bounded: shapes of one model are few
    dnnl::memory::desc a_md(dims{M, K}, dt, ta ? dims{1, lda} : dims{lda, 1});
    dnnl::memory::desc b_md(dims{K, N}, dt, tb ? dims{1, ldb} : dims{ldb, 1});
    dnnl::memory::desc c_md(dims{M, N}, dt, dims{ldc, 1});
    dnnl::primitive_attr attr;
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops po;
      po.append_sum(beta);  // dst = alpha acc + beta dst, in f32, rounded once
      attr.set_post_ops(po);
    }
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
    it = cache.emplace(key, Matmul{a_md, b_md, c_md, dnnl::matmul(pd)}).first;
  }
  thread_local dnnl::stream stream(cpu_engine());
  detail::sync_omp_threads();
  const Matmul& m = it->second;
  dnnl::memory am(m.a, cpu_engine(), const_cast<void*>(A));
  dnnl::memory bm(m.b, cpu_engine(), const_cast<void*>(B));
  dnnl::memory cm(m.c, cpu_engine(), C);
  m.prim.execute(stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  stream.wait();
}

// ---- the widening path ----
// count matrices of (rows, cols), matrix i at src + i * stride with row stride ld, into
// compact dst (matrix i at dst + i * rows * cols); threaded over all rows.
template <DType T>
void widen_batch(float* dst, const uint16_t* src, int64_t stride, int64_t ld, int64_t count,
                 int64_t rows, int64_t cols) {
  if (count <= 0 || rows <= 0 || cols <= 0) return;
  if (count == 1) return detail::widen_rows<T>(dst, cols, src, ld, rows, cols);
  detail::parallel_for(count * rows, std::max<int64_t>(1, detail::kHalfGrain / cols),
                       [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      const int64_t i = q / rows, r = q % rows;
      HalfT<T>::widen(dst + q * cols, src + i * stride + r * ld, cols);
    }
  }, 1);
}
template <DType T>
void narrow_batch(uint16_t* dst, int64_t stride, int64_t ld, const float* src, int64_t count,
                  int64_t rows, int64_t cols) {
  if (count <= 0 || rows <= 0 || cols <= 0) return;
  if (count == 1) return detail::narrow_rows<T>(dst, ld, src, cols, rows, cols);
  detail::parallel_for(count * rows, std::max<int64_t>(1, detail::kHalfGrain / cols),
                       [&](int64_t b, int64_t e) {
    for (int64_t q = b; q < e; ++q) {
      const int64_t i = q / rows, r = q % rows;
      HalfT<T>::narrow(dst + i * stride + r * ld, src + q * cols, cols);
    }
  }, 1);
}

// Arguments checked, batch >= 1, M, N >= 1. Strides of 0 share one operand (widened once).
template <DType T>
void gemm_widen_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                        const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                        uint16_t* C, int64_t ldc, int64_t batch, int64_t stride_a,
                        int64_t stride_b, int64_t stride_c) {
  const int64_t ra = ta ? K : M, ca = ta ? M : K, rb = tb ? N : K, cb = tb ? K : N;
  const int64_t na = stride_a == 0 ? 1 : batch, nb = stride_b == 0 ? 1 : batch;
  const int64_t sa = ra * ca, sb = rb * cb, sc = M * N;
  float* a = half_scratch(0, static_cast<size_t>(na * sa));
  float* b = half_scratch(1, static_cast<size_t>(nb * sb));
  float* c = half_scratch(2, static_cast<size_t>(batch * sc));
  widen_batch<T>(a, A, stride_a, lda, na, ra, ca);
  widen_batch<T>(b, B, stride_b, ldb, nb, rb, cb);
  if (beta != 0.0f) widen_batch<T>(c, C, stride_c, ldc, batch, M, N);
  const int64_t lda_f = std::max<int64_t>(1, ca), ldb_f = std::max<int64_t>(1, cb);
  if (batch == 1)
    cpu::gemm(ta, tb, M, N, K, alpha, a, lda_f, b, ldb_f, beta, c, N);
  else
    cpu::gemm_batched(ta, tb, M, N, K, alpha, a, lda_f, b, ldb_f, beta, c, N, batch,
                      stride_a == 0 ? 0 : sa, stride_b == 0 ? 0 : sb, sc);
  narrow_batch<T>(C, stride_c, ldc, c, batch, M, N);
}

void gemm_native_checked(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                         const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb,
                         float beta, uint16_t* C, int64_t ldc) {
  if (K == 0) {  // C = beta C: nothing for oneDNN to do
    gemm_widen_batched<DType::BF16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
    return;
  }
  onednn_matmul(dnnl::memory::data_type::bf16, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

bool cpu_has_native_bf16() {
  static const bool yes = detect_native_bf16();
  return yes;
}

const char* gemm_path(DType t) {
  switch (t) {
    case DType::F32: return "onednn-sgemm";
    case DType::BF16: return use_native_bf16() ? "onednn-bf16-native" : "widen-f32";
    case DType::F16: return "widen-f32";
    default: return "none";
  }
}

namespace detail {
// For the tests: the native path's oneDNN matmul call on f32 memory, which every CPU runs.
void onednn_matmul_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                       float* C, int64_t ldc) {
  check_args(ta, tb, M, N, K, lda, ldb, ldc, "onednn_matmul_f32");
  if (M == 0 || N == 0 || K == 0) PT_THROW(InputError, "onednn_matmul_f32: empty matrix");
  onednn_matmul(dnnl::memory::data_type::f32, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
}  // namespace detail

namespace half {

void gemm_bf16_widen(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                     const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                     uint16_t* C, int64_t ldc) {
  check_args(ta, tb, M, N, K, lda, ldb, ldc, "gemm");
  if (M == 0 || N == 0) return;
  gemm_widen_batched<DType::BF16>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
}

void gemm_bf16_native(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                      const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                      uint16_t* C, int64_t ldc) {
  check_args(ta, tb, M, N, K, lda, ldb, ldc, "gemm");
  if (!cpu_has_native_bf16())
    PT_THROW(InputError, "gemm_bf16_native: this CPU has no avx512bf16/amx-bf16 (or oneDNN's ISA limit excludes it)");
  if (M == 0 || N == 0) return;
  try {
    gemm_native_checked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  } catch (const dnnl::error& e) {
    PT_THROW(InternalError, "oneDNN bf16 matmul failed: ", e.what(), " (status ", static_cast<int>(e.status), ")");
  }
}

template <DType T>
void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
          int64_t lda, const uint16_t* B, int64_t ldb, float beta, uint16_t* C, int64_t ldc) {
  check_args(ta, tb, M, N, K, lda, ldb, ldc, "gemm");
  if (M == 0 || N == 0) return;
  if constexpr (T == DType::BF16) {
    if (use_native_bf16()) {
      try {
        gemm_native_checked(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
      } catch (const dnnl::error&) {
        g_native_broken.store(true, std::memory_order_relaxed);  // C untouched: widen instead
      }
    }
  }
  gemm_widen_batched<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
}

template <DType T>
void gemm_batched(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float beta,
                  uint16_t* C, int64_t ldc, int64_t batch, int64_t stride_a, int64_t stride_b,
                  int64_t stride_c) {
  check_args(ta, tb, M, N, K, lda, ldb, ldc, "gemm_batched");
  if (batch < 0) PT_THROW(InputError, "gemm_batched: negative batch ", batch);
  if (batch == 0 || M == 0 || N == 0) return;
  if constexpr (T == DType::BF16) {
    if (use_native_bf16()) {
      int64_t i = 0;
      try {
        for (; i < batch; ++i)
          gemm_native_checked(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b,
                              ldb, beta, C + i * stride_c, ldc);
        return;
      } catch (const dnnl::error&) {
        g_native_broken.store(true, std::memory_order_relaxed);
      }
      // matrices [0, i) are done (oneDNN fails at primitive creation, before writing)
      gemm_widen_batched<T>(ta, tb, M, N, K, alpha, A + i * stride_a, lda, B + i * stride_b, ldb,
                            beta, C + i * stride_c, ldc, batch - i, stride_a, stride_b, stride_c);
      return;
    }
  }
  gemm_widen_batched<T>(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a,
                        stride_b, stride_c);
}

template void gemm<DType::BF16>(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*,
                                int64_t, const uint16_t*, int64_t, float, uint16_t*, int64_t);
template void gemm<DType::F16>(bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*,
                               int64_t, const uint16_t*, int64_t, float, uint16_t*, int64_t);
template void gemm_batched<DType::BF16>(bool, bool, int64_t, int64_t, int64_t, float,
                                        const uint16_t*, int64_t, const uint16_t*, int64_t, float,
                                        uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t);
template void gemm_batched<DType::F16>(bool, bool, int64_t, int64_t, int64_t, float,
                                       const uint16_t*, int64_t, const uint16_t*, int64_t, float,
                                       uint16_t*, int64_t, int64_t, int64_t, int64_t, int64_t);

}  // namespace half
}  // namespace paratrain::kernels::cpu
