// The CUDA GEMMs through cuBLASLt (kernels/cuda/basic.h; contract of kernels/cpu/gemm.h:
// row-major C = alpha op(A) op(B) + beta C, beta == 0 ignores C, NaN included).
//
// Row-major to cuBLASLt's column-major: a row-major (r,c) matrix with row stride ld is the
// column-major (c,r) matrix with leading dimension ld, its transpose. So C^T = op(B)^T
// op(A)^T is computed: cuBLASLt's A is our B (op = trans_b), its B is our A (op = trans_a),
// its m, n, k are N, M, K, and D = C in place.
//  - Types: f32 with CUBLAS_COMPUTE_32F (exact f32, no TF32); bf16 and f16 operands and C
//    with f32 accumulation and f32 alpha/beta, C rounded once.
//  - Per device: one cuBLASLt handle and a 32 MiB workspace (cudaMalloc once), and a cache
//    of plans (matmul descriptor, layouts, the heuristic's algorithm) keyed by shape, leading
//    dimensions, batch strides and pointer alignment (the heuristic is told the alignment
//    the pointers have), so steady-state calls do not query heuristics. A mutex guards the
//    cache; plans are never evicted (one per distinct GEMM of a model).
//  - K == 0: C = beta C by a kernel; M == 0, N == 0 or batch == 0: nothing.
//  - gemm_batched with a 0 stride for A or B (a matrix shared by the batch) runs one GEMM
//    per matrix; otherwise one strided-batched cuBLASLt call.
//  - gemm_batched_to_f32: bf16 or f16 A and B, f32 C (cuBLASLt's C/D type CUDA_R_32F; the
//    products of half values are exact in the f32 accumulator), otherwise as gemm_batched.
//  - gemm_bias: the plan carries CUBLASLT_EPILOGUE_BIAS (the bias in the output's type, added
//    to the f32 accumulator before the one rounding); the bias pointer is a descriptor
//    attribute, so it is set and the GEMM enqueued under the cache's mutex. A bias not 16-byte
//    aligned, or a shape the heuristic has no epilogue algorithm for, runs as gemm then the
//    bias_add kernel (the same sum, rounded twice in bf16/f16) -- the plan records which.
//  - gemm_bias_gelu: CUBLASLT_EPILOGUE_GELU_AUX_BIAS (cuBLASLt's GELU is the tanh form GPT-2
//    uses): D = gelu(acc + bias), the aux matrix (leading dimension N, in the output's type) =
//    acc + bias, both from the f32 accumulator. The aux ld must be a multiple of 8, so N % 8
//    != 0, a bias or aux not 16-byte aligned, or no epilogue algorithm runs as gemm_bias then
//    the gelu_forward kernel. The heuristic reads the aux pointer's alignment, so the plan is
//    made with it set and its key carries that alignment.
// Everything runs on the compute stream; the workspace is used by one GEMM at a time because
// every GEMM of the device is on that one stream.
#include <cublasLt.h>

#include <climits>
#include <unordered_map>

#include "kernels/cuda/basic.h"
#include "kernels/cuda/launch.h"

namespace paratrain::kernels::cuda {
namespace {

[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call) {
  int dev = -1;
  cudaGetDevice(&dev);
  throw ::paratrain::cuda::CudaError(paratrain::detail::concat("cuBLASLt error ", cublasLtGetStatusName(st), " (",
                                                               cublasLtGetStatusString(st), ") in ", call,
                                                               " on cuda:", dev));
}
#define PT_CUBLAS_CHECK(call)                                    \
  do {                                                           \
    cublasStatus_t pt_cublas_st_ = (call);                       \
    if (pt_cublas_st_ != CUBLAS_STATUS_SUCCESS) throw_cublas(pt_cublas_st_, #call); \
  } while (0)

constexpr size_t kWorkspaceBytes = size_t{32} << 20;

struct Key {
  DType dtype;
  bool ta, tb;
  int64_t M, N, K, lda, ldb, ldc, batch, stride_a, stride_b, stride_c;
  uint32_t align_a, align_b, align_c;
  bool bias = false;  // the bias epilogue (gemm_bias)
  bool gelu = false;  // with the GELU_AUX_BIAS epilogue (gemm_bias_gelu); bias is then true
  uint32_t align_aux = 0;  // the aux (pre-GELU) matrix's alignment, for gelu
  DType c_dtype = DType::F32;  // C's (and D's) type: dtype, or f32 for gemm_batched_to_f32
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = static_cast<size_t>(k.dtype) * 4 + static_cast<size_t>(k.ta) * 2 + static_cast<size_t>(k.tb);
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, k.batch, k.stride_a, k.stride_b, k.stride_c,
                      int64_t{k.align_a}, int64_t{k.align_b}, int64_t{k.align_c}, int64_t{k.bias},
                      int64_t{k.gelu}, int64_t{k.align_aux},
                      static_cast<int64_t>(k.c_dtype)})
      h = h * 0x9e3779b97f4a7c15ull + static_cast<size_t>(v);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // cuBLASLt's A (our B), B (our A), C = D
  cublasLtMatmulAlgo_t algo{};
  bool fused = true;  // an epilogue plan that has an algorithm (else the unfused kernels)
};

// Per device; lives as long as the process (launch.h per_device).
struct LtState {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  std::mutex mu;
  std::unordered_map<Key, Plan, KeyHash> plans;
  LtState() {
    PT_CUBLAS_CHECK(cublasLtCreate(&handle));
    PT_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  }
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: break;
  }
  PT_THROW(InternalError, "gemm: no cuBLASLt type for ", dtype_name(t));
}

// The largest power of two <= 256 that divides the address and the batch stride in bytes
// (so every matrix of a batch is at least that aligned).
uint32_t alignment(const void* p, int64_t stride_bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al >>= 1;
  return al;
}

template <typename V>
void set_layout(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t attr, V v) {
  PT_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, attr, &v, sizeof(v)));
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t l = nullptr;
  PT_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols), ld));
  if (batch > 1) {
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, static_cast<int32_t>(batch));
    set_layout(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride);
  }
  return l;
}

// `aux`: for a gelu plan, the pre-GELU matrix it will write first (its alignment matters to
// the heuristic).
Plan make_plan(cublasLtHandle_t handle, const Key& k, void* aux) {
  const cudaDataType_t type = cuda_type(k.dtype);
  Plan p;
  PT_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_a = k.tb ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = k.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  if (k.bias) {
    // Our C^T is cuBLASLt's D (N rows, M columns): its per-row bias is our per-column one.
    const cublasLtEpilogue_t epilogue = k.gelu ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_BIAS;
    PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof(type)));
  }
  if (k.gelu) {  // the aux matrix: like D, column-major (N, M) with leading dimension N
    const int64_t aux_ld = k.N;
    const int32_t aux_type = static_cast<int32_t>(type);
    PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
    PT_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_type, sizeof(aux_type)));
    PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  }
  // Our B, stored row-major (K,N) or (N,K) when trans_b: column-major (N,K) or (K,N).
  p.a = make_layout(type, k.tb ? k.K : k.N, k.tb ? k.N : k.K, k.ldb, k.batch, k.stride_b);
  // Our A, stored row-major (M,K) or (K,M) when trans_a: column-major (K,M) or (M,K).
  p.b = make_layout(type, k.ta ? k.M : k.K, k.ta ? k.K : k.M, k.lda, k.batch, k.stride_a);
  // C (M,N) row-major: column-major (N,M).
  p.c = make_layout(cuda_type(k.c_dtype), k.N, k.M, k.ldc, k.batch, k.stride_c);

  cublasLtMatmulPreference_t pref = nullptr;
  PT_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = kWorkspaceBytes;
  const uint32_t al_a = k.align_b, al_b = k.align_a, al_c = k.align_c;  // cuBLASLt's A is our B
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof(al_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof(al_b));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof(al_c));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof(al_c));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if ((k.bias || k.gelu) && (st == CUBLAS_STATUS_NOT_SUPPORTED || (st == CUBLAS_STATUS_SUCCESS && found == 0))) {
    p.fused = false;  // the unfused kernels
    return p;
  }
  if (st != CUBLAS_STATUS_SUCCESS) throw_cublas(st, "cublasLtMatmulAlgoGetHeuristic");
  if (found == 0)
    PT_THROW(::paratrain::cuda::CudaError, "gemm: cuBLASLt has no algorithm for ", dtype_name(k.dtype), " M=", k.M,
             " N=", k.N, " K=", k.K, " trans_a=", k.ta, " trans_b=", k.tb, " lda=", k.lda, " ldb=", k.ldb,
             " ldc=", k.ldc, " batch=", k.batch, " (pointer alignment ", k.align_a, "/", k.align_b, "/", k.align_c,
             " bytes)");
  p.algo = result.algo;
  return p;
}

void check_args(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc,
                const char* who) {
  if (M < 0 || N < 0 || K < 0) PT_THROW(InputError, who, ": negative size M=", M, " N=", N, " K=", K);
  const int64_t min_lda = ta ? M : K, min_ldb = tb ? K : N;
  if (lda < std::max<int64_t>(1, min_lda) || ldb < std::max<int64_t>(1, min_ldb) || ldc < std::max<int64_t>(1, N))
    PT_THROW(InputError, who, ": leading dimension too small (lda=", lda, " ldb=", ldb, " ldc=", ldc, " for M=", M,
             " N=", N, " K=", K, ")");
}

// The plan of a GEMM (made on first use); the caller holds st.mu.
const Plan& plan_for(LtState& st, const Key& key, void* aux = nullptr) {
  auto it = st.plans.find(key);
  if (it == st.plans.end()) it = st.plans.emplace(key, make_plan(st.handle, key, aux)).first;
  return it->second;
}

// One cuBLASLt call: `batch` matrices (1: a plain GEMM), M, N, K >= 1; A and B of type T,
// C of type CT (T, or f32).
template <DType T, DType CT = T>
void run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda, const void* B,
         int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch, int64_t sa, int64_t sb, int64_t sc) {
  LtState& st = detail::per_device<LtState>();
  if (batch == 1) sa = sb = sc = 0;
  const int64_t es = static_cast<int64_t>(dtype_size(T)), ces = static_cast<int64_t>(dtype_size(CT));
  Key key{T,  ta,  tb,  M,  N,  K,  lda, ldb, ldc, batch, sa, sb, sc, alignment(A, sa * es),
          alignment(B, sb * es), alignment(C, sc * ces)};
  key.c_dtype = CT;
  const Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    plan = &plan_for(st, key);
  }
  PT_CUBLAS_CHECK(cublasLtMatmul(st.handle, plan->op, &alpha, B, plan->a, A, plan->b, &beta, C, plan->c, C, plan->c,
                                 &plan->algo, st.workspace, kWorkspaceBytes, detail::stream()));
}

// out = A op(B) + bias through the bias epilogue, or with `pre` (gelu) out = gelu(pre), pre =
// A op(B) + bias through GELU_AUX_BIAS; false (nothing run) where the plan has no fused
// algorithm or a pointer the epilogue reads or writes is not 16-byte aligned (or N % 8 != 0).
template <DType T>
bool run_with_epilogue(bool tb, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
                       void* pre, void* out) {
  const bool gelu = pre != nullptr;
  if (reinterpret_cast<uintptr_t>(bias) % 16 != 0) return false;
  if (gelu && (N % 8 != 0 || reinterpret_cast<uintptr_t>(pre) % 16 != 0)) return false;
  LtState& st = detail::per_device<LtState>();
  const int64_t ldb = tb ? K : N;
  Key key{T, false, tb, M, N, K, K, ldb, N, 1, 0, 0, 0, alignment(A, 0), alignment(B, 0), alignment(out, 0)};
  key.bias = true;
  key.gelu = gelu;
  key.align_aux = gelu ? alignment(pre, 0) : 0;
  key.c_dtype = T;
  const float alpha = 1.0f, beta = 0.0f;
  std::lock_guard<std::mutex> lock(st.mu);  // the epilogue's pointers live in the shared descriptor
  const Plan& plan = plan_for(st, key, pre);
  if (!plan.fused) return false;
  PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  if (gelu)
    PT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &pre, sizeof(pre)));
  PT_CUBLAS_CHECK(cublasLtMatmul(st.handle, plan.op, &alpha, B, plan.a, A, plan.b, &beta, out, plan.c, out, plan.c,
                                 &plan.algo, st.workspace, kWorkspaceBytes, detail::stream()));
  return true;
}

}  // namespace

template <DType T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
          const void* B, int64_t ldb, float beta, void* C, int64_t ldc) {
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc, "gemm");
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_matrices<T>(C, M, N, ldc, beta, 1, 0);
  run<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, 1, 0, 0, 0);
}

template <DType T>
void gemm_batched(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                  int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch,
                  int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc, "gemm_batched");
  if (batch < 0) PT_THROW(InputError, "gemm_batched: negative batch ", batch);
  if (batch > INT_MAX) PT_THROW(InputError, "gemm_batched: batch ", batch, " is above ", INT_MAX);
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) return scale_matrices<T>(C, M, N, ldc, beta, batch, stride_c);
  if (batch > 1 && (stride_a == 0 || stride_b == 0)) {
    const int64_t es = static_cast<int64_t>(dtype_size(T));
    for (int64_t i = 0; i < batch; ++i)
      run<T>(trans_a, trans_b, M, N, K, alpha, static_cast<const char*>(A) + i * stride_a * es, lda,
             static_cast<const char*>(B) + i * stride_b * es, ldb, beta, static_cast<char*>(C) + i * stride_c * es,
             ldc, 1, 0, 0, 0);
    return;
  }
  run<T>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c);
}

template <DType T>
void gemm_batched_to_f32(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
                         int64_t lda, const void* B, int64_t ldb, float beta, void* C, int64_t ldc, int64_t batch,
                         int64_t stride_a, int64_t stride_b, int64_t stride_c) {
  static_assert(T == DType::BF16 || T == DType::F16, "half operands");
  constexpr DType F = DType::F32;
  check_args(trans_a, trans_b, M, N, K, lda, ldb, ldc, "gemm_batched_to_f32");
  if (batch < 0) PT_THROW(InputError, "gemm_batched_to_f32: negative batch ", batch);
  if (batch > INT_MAX) PT_THROW(InputError, "gemm_batched_to_f32: batch ", batch, " is above ", INT_MAX);
  if (M == 0 || N == 0 || batch == 0) return;
  if (K == 0) return scale_matrices<F>(C, M, N, ldc, beta, batch, stride_c);
  if (batch > 1 && (stride_a == 0 || stride_b == 0)) {
    for (int64_t i = 0; i < batch; ++i)
      run<T, F>(trans_a, trans_b, M, N, K, alpha, static_cast<const uint16_t*>(A) + i * stride_a, lda,
                static_cast<const uint16_t*>(B) + i * stride_b, ldb, beta, static_cast<float*>(C) + i * stride_c, ldc,
                1, 0, 0, 0);
    return;
  }
  run<T, F>(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, batch, stride_a, stride_b, stride_c);
}

template <DType T>
void gemm_bias(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
               void* out) {
  // Dense operands: lda = K, ldb = K or N (at least 1, as a BLAS wants them, where K == 0).
  const int64_t lda = std::max<int64_t>(1, K), ldb = trans_b ? lda : N;
  check_args(false, trans_b, M, N, K, lda, ldb, N, "gemm_bias");
  if (M == 0 || N == 0) return;
  if (K > 0 && run_with_epilogue<T>(trans_b, M, N, K, A, B, bias, nullptr, out)) return;
  gemm<T>(false, trans_b, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, out, N);
  bias_add<T>(out, bias, M, N);
}

template <DType T>
void gemm_bias_gelu(bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, const void* B, const void* bias,
                    void* pre, void* out) {
  check_args(false, trans_b, M, N, K, std::max<int64_t>(1, K), trans_b ? std::max<int64_t>(1, K) : N, N,
             "gemm_bias_gelu");
  if (M == 0 || N == 0) return;
  if (K > 0 && run_with_epilogue<T>(trans_b, M, N, K, A, B, bias, pre, out)) return;
  gemm_bias<T>(trans_b, M, N, K, A, B, bias, pre);
  gelu_forward<T>(out, pre, M * N);
}

#define PT_INST(T)                                                                                                 \
  template void gemm<T>(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*, int64_t,  \
                        float, void*, int64_t);                                                                    \
  template void gemm_batched<T>(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,  \
                                int64_t, float, void*, int64_t, int64_t, int64_t, int64_t, int64_t);             \
  template void gemm_bias<T>(bool, int64_t, int64_t, int64_t, const void*, const void*, const void*, void*);      \
  template void gemm_bias_gelu<T>(bool, int64_t, int64_t, int64_t, const void*, const void*, const void*, void*, \
                                  void*);
PT_INST(DType::F32)
PT_INST(DType::BF16)
PT_INST(DType::F16)
#undef PT_INST
template void gemm_batched_to_f32<DType::BF16>(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t,
                                               const void*, int64_t, float, void*, int64_t, int64_t, int64_t, int64_t,
                                               int64_t);
template void gemm_batched_to_f32<DType::F16>(bool, bool, int64_t, int64_t, int64_t, float, const void*, int64_t,
                                              const void*, int64_t, float, void*, int64_t, int64_t, int64_t, int64_t,
                                              int64_t);

}  // namespace paratrain::kernels::cuda
