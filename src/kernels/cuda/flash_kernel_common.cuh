// What the two flash attention kernel sets share (flash_attention_kernel.cuh: tensor cores;
// flash_attention_f32_kernel.cuh: f32 arithmetic): the order a grid walks a head's tiles in,
// and the backward's first kernel, D = rowsum(dO * O) per query row. Kernels only, templates on
// E, the buffers' element rules (detail::Elem<dtype> on a GPU; emulated::F32/BF16/F16 in the
// CPU emulation): E::S the stored type, E::load widening to f32. Like the files that include
// it, this compiles on the host over tests/kernels/cuda_emulation.h.
#pragma once

namespace paratrain::kernels::cuda::flash_common {
// Internal linkage, as in the kernel files: each includer has its own kernels.
namespace {

// A block's tile when the grid's x runs over the tiles of one (batch, head), the last first. A
// query tile's work grows with its index (keys up to the diagonal), and a GPU starts blocks
// roughly in index order, so the longest start first and the short ones fill the tail. 32-bit
// unsigned arithmetic: in 64 bits it cost the tensor-core forward 18 registers (4 blocks per SM
// to 3 for head size 64) and made its dQ kernel spill; returned as int (sign-extended where the
// kernels widen it to 64 bits) it made the bf16 dQ kernel for head size 64 spill 20 bytes
// (CudaKernelResources.FlashKernelsOnHopper checks both).
__device__ __forceinline__ unsigned last_tile_first() { return gridDim.x - 1u - blockIdx.x; }

// D[bh T + t] = sum_d dO[b,t,h,d] O[b,t,h,d] (f32, HS the head size): a warp per row,
// kRowdotRows rows a block, B * NH * T rows in all.
constexpr int kRowdotRows = 8;
template <int HS, typename E>
__global__ void rowdot_kernel(float* D, const typename E::S* dout, const typename E::S* out, int64_t B, int64_t T,
                              int64_t C, int NH) {
  const int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (r >= B * NH * T) return;  // whole warps leave together (the block is a multiple of 32)
  const int64_t bh = r / T, t = r % T, b = bh / NH, h = bh % NH;
  const typename E::S* o = out + (b * T + t) * C + h * HS;
  const typename E::S* d = dout + (b * T + t) * C + h * HS;
  float s = 0.0f;
  for (int i = lane; i < HS; i += 32) s += E::load(d[i]) * E::load(o[i]);
  for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) D[r] = s;
}

}  // namespace
}  // namespace paratrain::kernels::cuda::flash_common
