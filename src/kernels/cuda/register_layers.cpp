// The CUDA layer kernels (kernels/cuda/layers.h) in the dispatch tables for Device::CUDA:
// f32 for LayerNorm, softmax, log-softmax, cross-entropy and attention, and bf16 where the CPU
// registers bf16 for the same table (attention, cross-entropy), with the CPU's buffer dtypes
// (lse, losses and dlosses f32); conv2d and max-pool for f32, bf16 and f16, as the CPU
// (conv.h). The attention is PARATRAIN_CUDA_ATTENTION's form:
//   gemm (the default): batched f32 GEMMs over every head (kernels/attention_by_gemm.h);
//   gemm-bf16: the same, bf16 with bf16 products on tensor cores;
//   flash: bf16 and f16 by the fused flash kernels on tensor cores (flash_attention.cu), f32 by
//     their f32-arithmetic twins on the CUDA cores (flash_attention_f32.cu); shapes and GPUs
//     they do not take run as gemm, the CPU's rounding;
//   tiles: every dtype by the f32-arithmetic flash kernels (the CPU's contract: bf16 and f16
//     widened, P and dS not rounded); what they do not take runs as gemm.
// softmax_row_max and softmax_row_exp_sum return a host float per row and have no CUDA
// kernel (NoKernelError).
#include <mutex>
#include <set>
#include <string>

#include "kernels/cuda/conv.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/register.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "paratrain/kernels/attention_by_gemm.h"

namespace paratrain::kernels::cuda {
namespace {

// The attention by batched GEMMs in the attention tables' signatures (chunk rows automatic;
// bf16 products for bf16 when `Half`).
template <DType T, bool Half = false>
void gemm_attention_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  attention_by_gemm_forward<Device::CUDA, T>(out, lse, qkv, B, Tn, C, NH, 0, Half);
}
template <DType T, bool Half = false>
void gemm_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                             int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  attention_by_gemm_backward<Device::CUDA, T>(dqkv, dout, qkv, out, lse, B, Tn, C, NH, 0, Half);
}

// The form whose flash kernels these are: `flash` the tensor-core ones for bf16 and f16 (P and
// dS rounded to the 16-bit type; f32 the f32-arithmetic ones), `tiles` the f32-arithmetic ones
// for every dtype (the CPU's contract).
constexpr const char* form_name(FlashKernels k) { return k == FlashKernels::kTensorCores ? "flash" : "tiles"; }

// PARATRAIN_CUDA_ATTENTION asked for flash kernels that do not take an attention: said once per
// form, dtype and reason (a warning, not an error: that attention runs as gemm, within the
// CPU's contract and with the same lse rows, so either backward reads the other forward's).
void warn_once_not_flash(FlashKernels k, DType dtype, const std::string& why) {
  static std::mutex mu;
  static std::set<std::string> said;
  const std::string key = std::string(form_name(k)) + " " + dtype_name(dtype) + ": " + why;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!said.insert(key).second) return;
  }
  PT_LOG_WARN(kGeneral, "PARATRAIN_CUDA_ATTENTION=", form_name(k), ": the flash kernels do not take this ",
              dtype_name(dtype), " attention (", why, "); it runs as gemm");
}

// The flash kernels K in the attention tables' signatures.
template <DType T, FlashKernels K>
void flash_attention_forward(void* out, void* lse, const void* qkv, int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  std::string why;
  if (attention_forward_flash(K, T, out, static_cast<float*>(lse), qkv, B, Tn, C, NH, &why)) return;
  warn_once_not_flash(K, T, why);
  gemm_attention_forward<T>(out, lse, qkv, B, Tn, C, NH);
}
template <DType T, FlashKernels K>
void flash_attention_backward(void* dqkv, const void* dout, const void* qkv, const void* out, const void* lse,
                              int64_t B, int64_t Tn, int64_t C, int64_t NH) {
  if (!attention_backward_flash(K, T, dqkv, dout, qkv, out, static_cast<const float*>(lse), B, Tn, C, NH))
    gemm_attention_backward<T>(dqkv, dout, qkv, out, lse, B, Tn, C, NH);
}

// PARATRAIN_CUDA_ATTENTION: which attention the tables hold.
enum class AttentionForm { kFlash, kGemm, kGemmBf16Products, kTiles };
AttentionForm attention_form() {
  const std::string v = env::get_string("PARATRAIN_CUDA_ATTENTION");
  if (v == "flash") return AttentionForm::kFlash;
  if (v == "gemm") return AttentionForm::kGemm;
  if (v == "gemm-bf16") return AttentionForm::kGemmBf16Products;
  if (v == "tiles") return AttentionForm::kTiles;
  PT_THROW(InputError, "PARATRAIN_CUDA_ATTENTION='", v, "': use flash, gemm, gemm-bf16 or tiles");
}

}  // namespace

void register_layer_kernels(Registry& r) {
  constexpr Device G = Device::CUDA;
  constexpr DType F = DType::F32, BF = DType::BF16, H = DType::F16;
  r.layernorm_forward.set(G, F, erase<&cuda::layernorm_forward>);
  r.layernorm_backward.set(G, F, erase<&cuda::layernorm_backward>);
  r.softmax_forward.set(G, F, erase<&cuda::softmax_forward>);
  r.softmax_backward.set(G, F, erase<&cuda::softmax_backward>);
  r.log_softmax_forward.set(G, F, erase<&cuda::log_softmax_forward>);
  r.log_softmax_backward.set(G, F, erase<&cuda::log_softmax_backward>);
  r.crossentropy_forward.set(G, F, erase<&cuda::crossentropy_forward>);
  r.crossentropy_forward.set(G, BF, erase<&cuda::crossentropy_forward_bf16>);
  r.crossentropy_backward.set(G, F, erase<&cuda::crossentropy_backward>);
  r.crossentropy_backward.set(G, BF, erase<&cuda::crossentropy_backward_bf16>);
  r.crossentropy_forward.set(G, H, erase<&cuda::crossentropy_forward_f16>);
  r.crossentropy_backward.set(G, H, erase<&cuda::crossentropy_backward_f16>);
  // f16 (--precision fp16): the flash kernels where the form is flash or tiles, else the GEMM
  // attention with f32 products.
  r.attention_forward.set(G, H, &gemm_attention_forward<H>);
  r.attention_backward.set(G, H, &gemm_attention_backward<H>);
  switch (attention_form()) {
    case AttentionForm::kFlash:
    case AttentionForm::kTiles: {
      constexpr FlashKernels TC = FlashKernels::kTensorCores, F32A = FlashKernels::kF32Arithmetic;
      const bool tiles = attention_form() == AttentionForm::kTiles;
      r.attention_forward.set(G, F, &flash_attention_forward<F, F32A>);
      r.attention_forward.set(G, BF, tiles ? &flash_attention_forward<BF, F32A> : &flash_attention_forward<BF, TC>);
      r.attention_forward.set(G, H, tiles ? &flash_attention_forward<H, F32A> : &flash_attention_forward<H, TC>);
      r.attention_backward.set(G, F, &flash_attention_backward<F, F32A>);
      r.attention_backward.set(G, BF, tiles ? &flash_attention_backward<BF, F32A> : &flash_attention_backward<BF, TC>);
      r.attention_backward.set(G, H, tiles ? &flash_attention_backward<H, F32A> : &flash_attention_backward<H, TC>);
      break;
    }
    case AttentionForm::kGemm:
    case AttentionForm::kGemmBf16Products: {
      const bool half = attention_form() == AttentionForm::kGemmBf16Products;
      r.attention_forward.set(G, F, &gemm_attention_forward<F>);
      r.attention_forward.set(G, BF, half ? &gemm_attention_forward<BF, true> : &gemm_attention_forward<BF>);
      r.attention_backward.set(G, F, &gemm_attention_backward<F>);
      r.attention_backward.set(G, BF, half ? &gemm_attention_backward<BF, true> : &gemm_attention_backward<BF>);
      break;
    }
  }
  r.attention_split_heads.set(G, F, erase<&cuda::attention_split_heads>);
  r.attention_split_heads.set(G, BF, erase<&cuda::attention_split_heads_bf16>);
  r.attention_split_heads.set(G, H, erase<&cuda::attention_split_heads_f16>);
  r.attention_merge_heads.set(G, F, erase<&cuda::attention_merge_heads>);
  r.attention_merge_heads.set(G, BF, erase<&cuda::attention_merge_heads_bf16>);
  r.attention_merge_heads.set(G, H, erase<&cuda::attention_merge_heads_f16>);
  r.attention_chunk_softmax.set(G, F, erase<&cuda::attention_chunk_softmax>);
  r.attention_chunk_probs.set(G, F, erase<&cuda::attention_chunk_probs>);
  r.attention_chunk_dscores.set(G, F, erase<&cuda::attention_chunk_dscores>);
  r.attention_rowdot.set(G, F, erase<&cuda::attention_rowdot>);
#define PT_CUDA_ALL(name)                              \
  r.name.set(G, F, &cuda::name<DType::F32>);           \
  r.name.set(G, BF, &cuda::name<DType::BF16>);         \
  r.name.set(G, DType::F16, &cuda::name<DType::F16>)
  PT_CUDA_ALL(conv2d_forward);
  PT_CUDA_ALL(conv2d_backward);
  PT_CUDA_ALL(maxpool2d_forward);
  PT_CUDA_ALL(maxpool2d_backward);
#undef PT_CUDA_ALL
}

}  // namespace paratrain::kernels::cuda
