#include "common.h"

namespace paratrain::ops::detail {

Tensor f32_contiguous(const Tensor& x, const char* op, const char* what) {
  if (!x.defined()) PT_THROW(InputError, op, ": ", what, " is undefined");
  if (x.dtype() != DType::F32)
    PT_THROW(InputError, op, ": ", what, " must be f32, got ", dtype_name(x.dtype()));
  return x.contiguous();
}

Tensor i32_contiguous(const Tensor& x, const char* op, const char* what) {
  if (!x.defined()) PT_THROW(InputError, op, ": ", what, " is undefined");
  if (x.dtype() == DType::I32) return x.contiguous();
  if (x.dtype() == DType::I64 || x.dtype() == DType::U16 || x.dtype() == DType::U8) return x.to(DType::I32);
  PT_THROW(InputError, op, ": ", what, " must be integer ids, got ", dtype_name(x.dtype()));
}

void expect_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.shape() != b.shape())
    PT_THROW(InputError, op, ": shapes ", shape_str(a.shape()), " and ", shape_str(b.shape()), " differ");
}

Tensor grad_or_zeros(const Tensor& g, const Shape& shape) {
  if (!g.defined()) return Tensor::zeros(shape);
  return g.contiguous();
}

}  // namespace paratrain::ops::detail
