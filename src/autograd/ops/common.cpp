#include "common.h"

#include "paratrain/tensor/cuda.h"

namespace paratrain::ops::detail {

Tensor float_contiguous(const Tensor& x, const char* op, const char* what) {
  if (!x.defined()) PT_THROW(InputError, op, ": ", what, " is undefined");
  if (!dtype_is_float(x.dtype()))
    PT_THROW(InputError, op, ": ", what, " must be floating point (f32, bf16, f16), got ", dtype_name(x.dtype()));
  return x.contiguous();
}

namespace {
using NamedTensor = std::pair<const char*, const Tensor*>;

// The first defined tensor of `ts` (nullptr when none) and the first later defined one that
// `differs` from it (nullptr when none).
template <typename Differs>
std::pair<const NamedTensor*, const NamedTensor*> first_mismatch(std::initializer_list<NamedTensor> ts,
                                                                 Differs differs) {
  const NamedTensor* first = nullptr;
  for (const auto& t : ts) {
    if (!t.second->defined()) continue;
    if (!first)
      first = &t;
    else if (differs(*t.second, *first->second))
      return {first, &t};
  }
  return {first, nullptr};
}
}  // namespace

void expect_same_dtype(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const auto [first, other] = first_mismatch(ts, [](const Tensor& a, const Tensor& b) { return a.dtype() != b.dtype(); });
  if (other)
    PT_THROW(InputError, op, ": ", other->first, " is ", dtype_name(other->second->dtype()), " but ", first->first,
             " is ", dtype_name(first->second->dtype()), " (cast one, or run the op under an AutocastGuard)");
}

void expect_same_device(const char* op, std::initializer_list<std::pair<const char*, const Tensor*>> ts) {
  const auto [first, other] =
      first_mismatch(ts, [](const Tensor& a, const Tensor& b) { return a.device_spec() != b.device_spec(); });
  if (other)
    PT_THROW(InputError, op, ": ", first->first, " is on ", first->second->device_spec().str(), " but ", other->first,
             " is on ", other->second->device_spec().str(), " (move the module with Module::to, the data with Tensor::to)");
  if (first && first->second->is_cuda()) {
    const int d = first->second->device_index(), current = cuda::current_device();
    if (d != current)
      PT_THROW(InputError, op, ": ", first->first, " is on cuda:", d, " but this thread's current GPU is cuda:", current,
               " (kernels run on the current GPU: call cuda::set_device(", d, ") first)");
  }
}

void convert_into(Tensor& dst, const Tensor& src) {
  PT_CHECK(dst.numel() == src.numel() && dst.is_contiguous() && src.is_contiguous(), "convert_into: layouts differ");
  const auto& K = kernels::registry();
  PT_CHECK(dst.device_spec() == src.device_spec(), "convert_into: ", src.device_spec().str(), " into ",
           dst.device_spec().str());
  if (dst.dtype() == src.dtype()) {
    Tensor flat = dst.view({dst.numel()});
    flat.copy_(src.view({src.numel()}));  // a memmove on the cpu
  } else if (src.dtype() == DType::F32) {
    K.cast_from_f32.at(dst.device(), dst.dtype())(dst.data_ptr(), src.data_ptr(), src.numel());
  } else if (dst.dtype() == DType::F32) {
    K.cast_to_f32.at(src.device(), src.dtype())(dst.data_ptr(), src.data_ptr(), src.numel());
  } else {  // half to the other half, through f32
    Tensor f = src.new_empty(src.shape(), DType::F32);
    K.cast_to_f32.at(src.device(), src.dtype())(f.data_ptr(), src.data_ptr(), src.numel());
    K.cast_from_f32.at(dst.device(), dst.dtype())(dst.data_ptr(), f.data_ptr(), src.numel());
  }
}

Tensor convert(const Tensor& src, DType t) {
  if (src.dtype() == t) return src;
  Tensor c = src.contiguous();
  Tensor out = src.new_empty(src.shape(), t);
  convert_into(out, c);
  return out;
}

DType widest(DType a, DType b) { return a == b ? a : DType::F32; }

Tensor cast_view(const Tensor& half, const Tensor& param) {
  Tensor out = half.detach();
  if (autograd::any_requires_grad({&param})) {
    const DType to = param.dtype();
    record_lambda("to_dtype", {&param}, {&out}, [to](std::vector<Tensor>& g) { return std::vector<Tensor>{convert(g[0], to)}; });
  }
  return out;
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

Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DeviceSpec device) {
  if (!g.defined()) return Tensor::zeros(shape, DType::F32, device);
  return g.contiguous();
}

}  // namespace paratrain::ops::detail
