// The flash attention kernels (kernels/cuda/flash_attention_kernel.cuh) run on the CPU over an
// emulation of the CUDA built-ins they use (tests/kernels/cuda_emulation.h: every CUDA thread
// of a block a host thread, __syncthreads a barrier) and of WMMA (here): operand fragments are
// 16 x 16 arrays that every lane of a warp holds whole; accumulators are spread over the warp's
// 32 lanes as on the GPU, 8 elements a lane in the layout of sm_80's mma.sync, so code that
// assumes which elements a lane holds fails here; WMMA's alignment (32 bytes) and
// leading-dimension rules are checked. Forward, D and the two backward kernels against a
// double-precision causal attention of the same 16-bit inputs. bf16: out within 1.5e-2 of
// 1 + |out|, lse within 1e-3, each of dq, dk, dv within 2e-2 relative L2 (P and dS are rounded
// to bf16 before their products, as FlashAttention rounds them; 3e-3 and 2.5e-3 seen). f16:
// out and the gradients within 1.2e-3 (3.6e-4 and 3e-4 seen; P rounded to bf16 instead fails
// it), lse within 1e-4. Head sizes 32, 64 and 128, one key, partial and several tiles, several
// batches and heads (PT_FLASH_EMULATED_ERRORS=1 prints the errors). This checks the kernels' indexing,
// masking, online softmax, tile loops and (under ThreadSanitizer, tests/CMakeLists.txt) their
// barriers on every machine; the launch, the hardware's WMMA and its memory model only a GPU
// checks (tests/gpu/layer_kernels_test.cpp).
// The f32-arithmetic kernels (flash_attention_f32_kernel.cuh: f32 FMAs on the CUDA cores, 256
// threads a block, 16-byte vector loads) run here too, against the same reference, on f32
// buffers (out within 2e-5 of 1 + |out|, lse within 1e-5, gradients within 1e-5 relative L2;
// 3e-6, 1.9e-6 and 8.6e-7 seen) and on bf16 and f16 ones (results rounded once to them). Every
// kernel runs with the rest of its shared memory NaN, and a write past what its launch asks for
// fails the test.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cuda_emulation.h"
#include "kernels/emulated_elements.h"
#include "paratrain/tensor/dtype.h"

using paratrain::bf16_to_f32;
using paratrain::f32_to_bf16;

namespace {  // WMMA, found by the kernels' wmma:: names

namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {}; struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <typename Use, int M, int N, int K, typename T, typename L = void>
struct fragment {  // an operand (matrix_a, matrix_b): every lane holds the whole 16 x 16 here
  float v[16][16];
};
// An accumulator: lane l holds 8 of the 256 elements, element i at element_at(l, i). The
// layout is sm_80's for mma.sync m16n8k16's C, twice (columns 0-7, then 8-15); CUDA leaves it
// unspecified, and the kernels learn each element's row and column from index fragments.
template <>
struct fragment<accumulator, 16, 16, 16, float, void> {
  static constexpr int num_elements = 8;
  float x[8];
};
using Acc = fragment<accumulator, 16, 16, 16, float, void>;
struct RowCol { int r, c; };
inline RowCol element_at(int i) {
  const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
  return {g + 8 * ((i / 2) % 2), 2 * t + i % 2 + 8 * (i / 4)};
}
inline void check(const void* p, unsigned ldm, int es) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) { std::fprintf(stderr, "unaligned wmma pointer\n"); std::abort(); }
  if (ldm % (16 / es) != 0) { std::fprintf(stderr, "bad ldm %u\n", ldm); std::abort(); }
}
template <typename Use, typename E, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, E, L>& f, const E* p, unsigned ldm) {
  check(p, ldm, 2);
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 16; ++j)  // element (row i, col j) of the 16x16 operand
      f.v[i][j] = to_float(std::is_same_v<L, wmma::row_major> ? p[i * ldm + j] : p[i + j * ldm]);
}
inline void load_matrix_sync(Acc& f, const float* p, unsigned ldm, layout_t) {
  check(p, ldm, 4);
  for (int i = 0; i < Acc::num_elements; ++i) {
    const RowCol e = element_at(i);
    f.x[i] = p[e.r * ldm + e.c];
  }
}
inline void fill_fragment(Acc& f, float x) {
  for (float& e : f.x) e = x;
}
// A lane's elements of d = a b + c need only its own elements of c (d may be c).
template <typename E, typename LA, typename LB>
void mma_sync(Acc& d, const fragment<matrix_a, 16, 16, 16, E, LA>& a, const fragment<matrix_b, 16, 16, 16, E, LB>& b,
              const Acc& c) {
  for (int i = 0; i < Acc::num_elements; ++i) {
    const RowCol e = element_at(i);
    float s = c.x[i];
    for (int k = 0; k < 16; ++k) s += a.v[e.r][k] * b.v[k][e.c];
    d.x[i] = s;
  }
}
inline void store_matrix_sync(float* p, const Acc& f, unsigned ldm, layout_t) {
  check(p, ldm, 4);
  for (int i = 0; i < Acc::num_elements; ++i) {
    const RowCol e = element_at(i);
    p[e.r * ldm + e.c] = f.x[i];
  }
}
}  // namespace wmma


}  // namespace

namespace paratrain::kernels::cuda::flash {
namespace {  // the header's unnamed namespace, where the kernels' `extern __shared__ smem` looks
alignas(128) unsigned char smem[1 << 18];  // the block's dynamic shared memory (one block at a time)
}  // namespace
namespace {
template <typename E>
struct Operand;
template <>
struct Operand<__nv_bfloat16> {
  static constexpr int kMinArch = 800;
  static float load(uint16_t b) { return bf16_to_f32(b); }
  static uint16_t store(float f) { return f32_to_bf16(f); }
  static __nv_bfloat16 round(float f) { return __float2bfloat16_rn(f); }
};
template <>
struct Operand<__half> {
  static constexpr int kMinArch = 700;
  static float load(uint16_t b) { return paratrain::f16_to_f32(b); }
  static uint16_t store(float f) { return paratrain::f32_to_f16(f); }
  static __half round(float f) { return __float2half_rn(f); }
};
}  // namespace
}  // namespace paratrain::kernels::cuda::flash

#include "kernels/cuda/flash_attention_kernel.cuh"

namespace paratrain::kernels::cuda::flash32 {
namespace {
alignas(128) unsigned char smem[1 << 18];  // the f32 kernels' dynamic shared memory
}  // namespace
}  // namespace paratrain::kernels::cuda::flash32

#include "kernels/cuda/flash_attention_f32_kernel.cuh"

namespace {
using namespace paratrain::kernels::cuda;

// How close each result must come to the double-precision reference, per operand type: P and dS
// are rounded to it, so bf16 (8 significant bits) is allowed about 8 times f16's (11) error.
struct Tolerances {
  double out, lse, grad;
};
// E: the tensor-core kernels' operand type (__nv_bfloat16, __half), or the f32-arithmetic
// kernels' element rules (emulated::F32, BF16, F16: the buffers' type and conversions).
namespace el = paratrain::kernels::emulated;
template <typename E>
constexpr bool kTensorCores = std::is_same_v<E, __nv_bfloat16> || std::is_same_v<E, __half>;

// f32 arithmetic: f32's rounding, and a 16-bit result rounded once (out within half an ulp
// of |out|; a gradient added into prefilled 16-bit dqkv, then rounded).
template <typename E>
constexpr Tolerances kTol = std::is_same_v<E, el::F32>    ? Tolerances{2e-5, 1e-5, 1e-5}
                            : std::is_same_v<E, el::BF16> ? Tolerances{5e-3, 1e-5, 5e-3}
                            : std::is_same_v<E, el::F16>  ? Tolerances{7e-4, 1e-5, 6e-4}
                            : std::is_same_v<E, __half>   ? Tolerances{1.2e-3, 1e-4, 1.2e-3}
                                                          : Tolerances{1.5e-2, 1e-3, 2e-2};

// worst = max(worst, e), a NaN e (an element left unwritten, a 0/0) counting as infinite.
void note(double& worst, double e) { worst = e <= worst ? worst : (std::isnan(e) ? INFINITY : e); }

// The buffers' element type of the kernels on E and its conversions: 16-bit bits and
// flash::Operand for the tensor-core kernels, E itself for the f32-arithmetic ones.
template <typename E, bool = kTensorCores<E>>
struct Buffer : flash::Operand<E> {
  using type = uint16_t;
};
template <typename E>
struct Buffer<E, false> : E {
  using type = typename E::S;
};
const char* type_name(const __nv_bfloat16&) { return "bf16 (tensor cores)"; }
const char* type_name(const __half&) { return "f16 (tensor cores)"; }
template <typename E>
const char* type_name(const E&) {
  return dtype_name(E::kType);
}

// Runs a grid of `threads`-thread blocks of a kernel that declares `bytes` of dynamic shared
// memory (what its launcher asks for), with the rest of the emulated shared memory `smem` NaN
// (0xff bytes): a read past `bytes` makes a result NaN, and a write past it is reported here,
// where on a GPU it would fault or run over another block's memory.
template <size_t N, typename F>
void launch_in_bounds(unsigned char (&smem)[N], size_t bytes, unsigned tiles, unsigned bh, unsigned threads, F&& f) {
  ASSERT_LE(bytes, N);
  std::fill(smem + bytes, smem + N, static_cast<unsigned char>(0xff));
  launch(tiles, bh, threads, f);
  const auto past = std::find_if(smem + bytes, smem + N, [](unsigned char c) { return c != 0xff; });
  EXPECT_EQ(past, smem + N) << "a kernel wrote shared memory byte " << (past - smem) << ", past the " << bytes
                            << " its launch asks for";
}

// D = rowsum(dO * O), launched as both launchers launch it: whole warps past the last row.
template <int HS, typename Rules, typename V>
void run_rowdot(float* D, const V* dout, const V* out, int64_t B, int64_t T, int64_t C, int64_t NH) {
  namespace k = flash_common;
  launch(unsigned((B * NH * T + k::kRowdotRows - 1) / k::kRowdotRows), 1, 32 * k::kRowdotRows,
         [&] { k::rowdot_kernel<HS, Rules>(D, dout, out, B, T, C, int(NH)); });
}

// The forward, D and the two backward kernels on E, launched as flash_attention.cu and
// flash_attention_f32.cu launch them (the shared memory they ask for; whole warps past the last
// row for D).
template <int HS, typename E, typename V>
void run_kernels(V* out, float* lse, float* D, V* dqkv, const V* qkv, const V* dout, int64_t B, int64_t T,
                 int64_t NH, float scale) {
  const int64_t C = NH * HS, BH = B * NH;
  const unsigned tiles = static_cast<unsigned>((T + 63) / 64), bh = static_cast<unsigned>(BH);
  if constexpr (!kTensorCores<E>) {
    namespace k = flash32;
    static_assert(k::kRows == 64);
    using S = k::Shape<HS>;
    launch_in_bounds(k::smem, S::kForwardBytes, tiles, bh, k::kThreads,
                     [&] { k::forward_kernel<HS, E>(out, lse, qkv, T, C, int(NH), scale); });
    run_rowdot<HS, E>(D, dout, out, B, T, C, NH);
    launch_in_bounds(k::smem, S::kBackwardBytes, tiles, bh, k::kThreads,
                     [&] { k::backward_keys_kernel<HS, E>(dqkv, dout, qkv, lse, D, T, C, int(NH), scale); });
    launch_in_bounds(k::smem, S::kBackwardBytes, tiles, bh, k::kThreads,
                     [&] { k::backward_queries_kernel<HS, E>(dqkv, dout, qkv, lse, D, T, C, int(NH), scale); });
  } else {
    namespace k = flash;
    static_assert(k::kRows == 64);
    launch_in_bounds(k::smem, k::Layout<HS>::kBytes, tiles, bh, k::kThreads,
                     [&] { k::flash_forward_kernel<HS, E>(out, lse, qkv, B, T, C, int(NH), scale); });
    run_rowdot<HS, std::conditional_t<std::is_same_v<E, __half>, el::F16, el::BF16>>(D, dout, out, B, T, C, NH);
    launch_in_bounds(k::smem, k::BackwardLayout<HS>::kBytes, tiles, bh, k::kThreads,
                     [&] { k::flash_backward_keys_kernel<HS, E>(dqkv, dout, qkv, lse, D, B, T, C, int(NH), scale); });
    launch_in_bounds(k::smem, k::BackwardLayout<HS>::kBytes, tiles, bh, k::kThreads, [&] {
      k::flash_backward_queries_kernel<HS, E>(dqkv, dout, qkv, lse, D, B, T, C, int(NH), scale);
    });
  }
}

template <int HS, typename E = __nv_bfloat16>
void check_case(int64_t B, int64_t T, int64_t NH, uint32_t seed) {
  SCOPED_TRACE(std::string(type_name(E{})) + " HS=" + std::to_string(HS) + " B=" + std::to_string(B) +
               " T=" + std::to_string(T) + " NH=" + std::to_string(NH));
  using Op = Buffer<E>;
  using V = typename Op::type;
  constexpr Tolerances tol = kTol<E>;
  const int64_t C = NH * HS, BH = B * NH;
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<V> qkv(B * T * 3 * C), dout(B * T * C), dqkv(B * T * 3 * C);
  for (auto& x : qkv) x = Op::store(nd(rng) * 1.5f);
  for (auto& x : dout) x = Op::store(nd(rng));
  for (auto& x : dqkv) x = Op::store(nd(rng) * 0.05f);
  const std::vector<V> dqkv0 = dqkv;
  std::vector<V> out(B * T * C, Op::store(std::nanf("")));  // a row left unwritten stays NaN
  std::vector<float> lse(BH * T, -1), D(BH * T, -7);
  const float scale = 1.0f / std::sqrt(float(HS));
  run_kernels<HS, E>(out.data(), lse.data(), D.data(), dqkv.data(), qkv.data(), dout.data(), B, T, NH, scale);
  // double references from the kernels' inputs
  double worst = 0, worst_lse = 0, worst_D = 0;
  std::vector<double> want(B * T * 3 * C, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < NH; ++h) {
      auto at = [&](int64_t tt, int part, int64_t d) {
        return double(Op::load(qkv[(b * T + tt) * 3 * C + part * C + h * HS + d]));
      };
      auto g = [&](int64_t tt, int64_t d) { return double(Op::load(dout[(b * T + tt) * C + h * HS + d])); };
      auto W = [&](int64_t tt, int part, int64_t d) -> double& { return want[(b * T + tt) * 3 * C + part * C + h * HS + d]; };
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int d = 0; d < HS; ++d) dot += at(t, 0, d) * at(j, 1, d);
          s[j] = dot * scale;
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& v : s) sum += (v = std::exp(v - mx));
        for (auto& v : s) v /= sum;  // P
        note(worst_lse, std::fabs(lse[(b * NH + h) * T + t] - (mx + std::log(sum))));
        double Dt = 0;
        for (int d = 0; d < HS; ++d) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += s[j] * at(j, 2, d);
          note(worst, std::fabs(Op::load(out[(b * T + t) * C + h * HS + d]) - o) / (1 + std::fabs(o)));
          Dt += g(t, d) * Op::load(out[(b * T + t) * C + h * HS + d]);
        }
        note(worst_D, std::fabs(D[(b * NH + h) * T + t] - Dt) / (1 + std::fabs(Dt)));
        for (int64_t j = 0; j <= t; ++j) {
          double dp = 0;
          for (int d = 0; d < HS; ++d) dp += g(t, d) * at(j, 2, d);
          const double ds = s[j] * (dp - Dt);
          for (int d = 0; d < HS; ++d) {
            W(t, 0, d) += scale * ds * at(j, 1, d);
            W(j, 1, d) += scale * ds * at(t, 0, d);
            W(j, 2, d) += s[j] * g(t, d);
          }
        }
      }
    }
  double err2[3] = {0, 0, 0}, norm2[3] = {0, 0, 0};
  for (int64_t i = 0; i < (int64_t)want.size(); ++i) {
    const int part = (i % (3 * C)) / C;
    const double got = double(Op::load(dqkv[i])) - double(Op::load(dqkv0[i]));
    err2[part] += (got - want[i]) * (got - want[i]);
    norm2[part] += want[i] * want[i];
  }
  if (std::getenv("PT_FLASH_EMULATED_ERRORS"))  // how close it came, for choosing the tolerances
    std::printf("  out %.3g, lse %.3g, D %.3g\n", worst, worst_lse, worst_D);
  EXPECT_LT(worst, tol.out) << "out, relative to 1 + |out|";
  EXPECT_LT(worst_lse, tol.lse) << "lse";
  EXPECT_LT(worst_D, 1e-4) << "D = rowsum(dO * O)";
  const char* part_names[3] = {"dq", "dk", "dv"};
  for (int p = 0; p < 3; ++p) {
    if (norm2[p] == 0) {  // T == 1: one key per query, so dq = dk = 0 exactly; only rounding is left
      EXPECT_LT(std::sqrt(err2[p] / static_cast<double>(want.size())), 1e-3) << part_names[p] << " (zero)";
    } else {
      if (std::getenv("PT_FLASH_EMULATED_ERRORS")) std::printf("  %s %.3g\n", part_names[p], std::sqrt(err2[p] / norm2[p]));
      EXPECT_LT(std::sqrt(err2[p] / norm2[p]), tol.grad) << part_names[p] << ", relative L2";
    }
  }
}

TEST(FlashAttentionEmulated, ForwardAndBackwardFollowADoublePrecisionAttention) {
  check_case<64>(1, 1, 1, 1);    // one key
  check_case<64>(2, 65, 2, 4);   // a full and a partial tile, two batches and heads
  check_case<128>(1, 70, 1, 6);  // head size 128
  check_case<64>(1, 190, 1, 9);  // three tiles: the online softmax rescales twice
  check_case<32>(2, 80, 2, 11);  // head size 32 (gpt-nano's)
}

// The same kernels on f16 operands (--precision fp16), at f16's tolerances.
TEST(FlashAttentionEmulated, F16ForwardAndBackwardFollowADoublePrecisionAttention) {
  check_case<64, __half>(1, 1, 1, 2);    // one key
  check_case<64, __half>(2, 130, 1, 5);  // two full tiles and a partial one
  check_case<32, __half>(1, 70, 2, 12);  // head size 32
  check_case<128, __half>(1, 65, 1, 7);  // head size 128
}

// The f32-arithmetic kernels (CUDA cores): 256 threads a block, each with 4 rows and 4 strided
// columns of a score tile; head size 32 takes its result columns in pairs.
TEST(FlashAttentionEmulated, F32ForwardAndBackwardFollowADoublePrecisionAttention) {
  check_case<64, el::F32>(1, 1, 1, 3);    // one key
  check_case<64, el::F32>(1, 130, 2, 8);  // two full tiles and a partial one, two heads
  check_case<32, el::F32>(2, 70, 1, 13);  // head size 32, two batches
  check_case<128, el::F32>(1, 65, 1, 10);  // head size 128
}

// The same kernels over bf16 and f16 buffers (PARATRAIN_CUDA_ATTENTION=tiles): 8 values a
// 16-byte load, widened; f32 arithmetic, each result rounded once.
TEST(FlashAttentionEmulated, F32ArithmeticOnHalfBuffersFollowsADoublePrecisionAttention) {
  check_case<64, el::BF16>(2, 70, 1, 14);
  check_case<32, el::BF16>(1, 65, 2, 15);
  check_case<64, el::F16>(1, 130, 1, 16);
  check_case<128, el::F16>(1, 40, 1, 17);
}

}  // namespace
