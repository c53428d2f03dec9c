// The mechanism of the kernels' one dispatch point: a table per op of kernels keyed by the
// (device, dtype) they compute on. kernels/registry.h lists the tables; an op asks there
// instead of calling kernels::cpu directly, so CPU and CUDA kernels, f32 and the half
// types plug into the same autograd ops, optimizers and communication code.
//
// A kernel is a free function over raw buffers, llm.c style (the shape legends of
// kernels/cpu/*.h). In a table, buffers of floating-point data are `void*` / `const void*`:
// the kernel registered for (device, dtype) reads them as that dtype, unless its legend
// says a buffer is f32 (statistics such as LayerNorm's mean/rstd, attention's log-sum-exp,
// optimizer state). Integer buffers (token ids, masks) keep their types.
//
// Thread-safety: a table is filled once, before first use (registry.cpp), and only read
// afterwards.
#pragma once

#include <array>
#include <cstddef>
#include <type_traits>

#include "paratrain/base/error.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::kernels {

// An op asked for a (device, dtype) that has no kernel: the message names the op, the
// device and the dtype. An InputError: the combination is not built, it is not a crash.
class NoKernelError : public InputError {
 public:
  using InputError::InputError;
};

template <typename Fn>
class KernelTable;

template <typename R, typename... Args>
class KernelTable<R(Args...)> {
 public:
  using Fn = R (*)(Args...);
  explicit constexpr KernelTable(const char* op) : op_(op) {}

  const char* op() const { return op_; }
  void set(Device d, DType t, Fn fn) { fns_[index(d)][static_cast<size_t>(t)] = fn; }
  bool has(Device d, DType t) const { return fns_[index(d)][static_cast<size_t>(t)] != nullptr; }
  // The kernel for (d, t); NoKernelError naming the op, device and dtype when there is none.
  Fn at(Device d, DType t) const {
    if (Fn f = fns_[index(d)][static_cast<size_t>(t)]) return f;
    PT_THROW(NoKernelError, "kernel '", op_, "' has no implementation for device ", device_name(d), " and dtype ",
             dtype_name(t));
  }

 private:
  static constexpr size_t kDevices = 2, kDTypes = 7;
  static size_t index(Device d) { return static_cast<size_t>(d); }
  const char* op_;
  std::array<std::array<Fn, kDTypes>, kDevices> fns_{};
};

// ---- type erasure of a typed kernel (float* buffers become void*) ----
namespace detail {
template <typename T>
struct Erase {
  using type = T;
};
template <>
struct Erase<float*> {
  using type = void*;
};
template <>
struct Erase<const float*> {
  using type = const void*;
};
template <>
struct Erase<uint16_t*> {
  using type = void*;
};
template <>
struct Erase<const uint16_t*> {
  using type = const void*;
};
template <typename Fn>
struct ErasedFn;
template <typename R, typename... Args>
struct ErasedFn<R(Args...)> {
  using type = R(typename Erase<Args>::type...);
};
template <auto F, typename Fn = std::remove_pointer_t<decltype(F)>>
struct Adapt;
template <auto F, typename R, typename... Args>
struct Adapt<F, R(Args...)> {
  static R call(typename Erase<Args>::type... a) { return F(static_cast<Args>(a)...); }
};
}  // namespace detail

// The table signature of a typed kernel signature: void(float*, const float*, int64_t) ->
// void(void*, const void*, int64_t).
template <typename Fn>
using Erased = typename detail::ErasedFn<Fn>::type;

// The erased entry point of the typed kernel F, for KernelTable::set.
template <auto F>
constexpr auto erase = &detail::Adapt<F>::call;

}  // namespace paratrain::kernels
