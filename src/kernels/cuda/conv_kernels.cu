// The launches of the CUDA conv2d and max-pool device passes (conv_kernels.h; the kernels:
// conv_kernels.cuh): grid-stride grids (launch.h's grid_for) on the compute stream, Elem<T>'s
// element rules (the CPU's).
#include <cmath>

#include "kernels/cuda/block_reduce.cuh"
#include "kernels/cuda/conv_kernels.h"
#include "kernels/cuda/launch.h"

namespace paratrain::kernels::cuda::conv_detail {
using detail::block_sum;
}  // namespace paratrain::kernels::cuda::conv_detail

#include "kernels/cuda/conv_kernels.cuh"

namespace paratrain::kernels::cuda::conv_detail {
namespace {

using detail::launch_over;

template <DType T>
using E = detail::Elem<T>;
template <DType T>
using S = typename E<T>::S;

}  // namespace

template <DType T>
void im2col(void* col, const void* inp, int64_t cnt, const Geom& g) {
  launch_over(g.rows() * cnt * g.cols(), "conv2d im2col", im2col_kernel<E<T>>, static_cast<S<T>*>(col),
              static_cast<const S<T>*>(inp), cnt, g);
}

template <DType T>
void col2im_add(void* dinp, const float* dcol, int64_t cnt, const Geom& g) {
  launch_over(cnt * g.Ci * g.H * g.W, "conv2d col2im", col2im_add_kernel<E<T>>, static_cast<S<T>*>(dinp), dcol, cnt,
              g);
}

template <DType T>
void out_from_channel_major(void* out, const float* cm, const void* bias, int64_t cnt, int64_t Co, int64_t L) {
  launch_over(cnt * Co * L, "conv2d forward", out_from_channel_major_kernel<E<T>>, static_cast<S<T>*>(out), cm,
              static_cast<const S<T>*>(bias), cnt, Co, L);
}

template <DType T>
void channel_major_from(void* cm, const void* dout, int64_t cnt, int64_t Co, int64_t L) {
  launch_over(Co * cnt * L, "conv2d backward", channel_major_from_kernel<E<T>>, static_cast<S<T>*>(cm),
              static_cast<const S<T>*>(dout), cnt, Co, L);
}

template <DType T>
void bias_grad(void* dbias, const void* dout, int64_t N, int64_t Co, int64_t L) {
  if (Co == 0) return;
  bias_grad_kernel<E<T>><<<static_cast<unsigned>(Co), kBiasThreads, 0, detail::stream()>>>(
      static_cast<S<T>*>(dbias), static_cast<const S<T>*>(dout), N, Co, L);
  PT_CUDA_CHECK_LAUNCH();
}

template <DType T>
void maxpool_forward(void* out, int32_t* argmax, const void* inp, int64_t N, int64_t C, int64_t H, int64_t W,
                     int64_t K, int64_t stride, int64_t pad, int64_t Ho, int64_t Wo) {
  launch_over(N * C * Ho * Wo, "maxpool2d_forward", maxpool_forward_kernel<E<T>>, static_cast<S<T>*>(out), argmax,
              static_cast<const S<T>*>(inp), N, C, H, W, K, stride, pad, Ho, Wo);
}

template <DType T>
void maxpool_backward_planes(float* d, const void* dout, const int32_t* argmax, int64_t planes, int64_t HW,
                             int64_t HoWo) {
  launch_over(planes, "maxpool2d_backward", maxpool_backward_planes_kernel<E<T>>, d, static_cast<const S<T>*>(dout),
              argmax, planes, HW, HoWo);
}

#define PT_INST(T)                                                                                                  \
  template void im2col<T>(void*, const void*, int64_t, const Geom&);                                               \
  template void col2im_add<T>(void*, const float*, int64_t, const Geom&);                                          \
  template void out_from_channel_major<T>(void*, const float*, const void*, int64_t, int64_t, int64_t);            \
  template void channel_major_from<T>(void*, const void*, int64_t, int64_t, int64_t);                              \
  template void bias_grad<T>(void*, const void*, int64_t, int64_t, int64_t);                                       \
  template void maxpool_forward<T>(void*, int32_t*, const void*, int64_t, int64_t, int64_t, int64_t, int64_t,      \
                                   int64_t, int64_t, int64_t, int64_t);                                            \
  template void maxpool_backward_planes<T>(float*, const void*, const int32_t*, int64_t, int64_t, int64_t);
PT_INST(DType::F32)
PT_INST(DType::BF16)
PT_INST(DType::F16)
#undef PT_INST

}  // namespace paratrain::kernels::cuda::conv_detail
