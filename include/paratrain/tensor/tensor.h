// Tensor: a strided view of a reference-counted Storage.
//
// A Tensor is a cheap handle (copying it shares the storage, like torch.Tensor). Views
// (reshape of contiguous data, transpose, narrow, permute, select) share storage and change
// shape/strides/offset; contiguous() and clone() copy. Storage comes from the device's
// caching allocator (allocator.h), so freed memory is reused by the next step.
//
// Autograd state (requires_grad, .grad, the node that produced it, hooks) lives in an
// AutogradMeta the tensor points to; the autograd layer fills it in. A default-constructed
// Tensor is "undefined" (defined() == false).
//
// Thread-safety: distinct Tensors may be used from different threads; one Tensor's data must
// not be written concurrently with other access.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain {

namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);

// A block of device memory. Owns it unless created over external memory (from_blob).
class Storage {
 public:
  // Allocates from allocator_for(device, index); cuda with index -1: the current device.
  Storage(size_t nbytes, Device device, int index = -1);
  // Page-locked host memory (cuda::pinned_allocator()), for asynchronous copies to a GPU.
  struct Pinned {};
  Storage(size_t nbytes, Pinned);
  Storage(void* external, size_t nbytes, Device device, std::function<void(void*)> deleter, int index = 0);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  int device_index() const { return device_index_; }  // the GPU of a cuda storage; 0 for cpu
  bool pinned() const { return pinned_; }

  // Points this storage at memory someone else manages, `p` (at least nbytes() bytes), or at
  // nothing (nullptr), releasing memory it owned. Every tensor on this storage, views and
  // tensors saved by autograd included, sees the new memory: how fully sharded data
  // parallelism frees a parameter after its forward and gathers it into a flat buffer again.
  // Reading a tensor while its storage points at nothing is the caller's error.
  void rebind(void* p);
  // Takes over `from`'s memory, device and ownership, releasing what this storage held;
  // `from` is left pointing at nothing (and owning nothing). Every tensor on this storage sees
  // the new memory and device: how Tensor::move_to_ moves a parameter with all its aliases.
  void take_over(Storage& from);

 private:
  Allocator& owner() const;  // the allocator an owned block came from

  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Device device_ = Device::CPU;
  int device_index_ = 0;
  bool pinned_ = false;
  bool owned_ = true;
  std::function<void(void*)> deleter_;
};

class Tensor;

// Autograd bookkeeping attached to a tensor (filled in by the autograd layer).
struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  std::shared_ptr<Tensor> grad;                   // accumulated gradient (leaves, or retained)
  std::shared_ptr<autograd::Node> grad_fn;        // node that produced this tensor (non-leaf)
  int output_nr = 0;                              // which output of grad_fn
  std::vector<std::function<void(Tensor&)>> grad_ready_hooks;  // fired when .grad is final
  std::string name;                               // parameter name, for messages
};

class Tensor {
 public:
  Tensor() = default;

  // ---- factories ----
  // On `device`; cuda with `index` -1 is the calling thread's current device.
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU, int index = -1);
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::CPU, int index = -1);
  static Tensor empty(const Shape& shape, DType dtype, DeviceSpec device) {
    return empty(shape, dtype, device.kind, device.index);
  }
  static Tensor zeros(const Shape& shape, DType dtype, DeviceSpec device) {
    return zeros(shape, dtype, device.kind, device.index);
  }
  // Host memory that is page-locked, so copies to a GPU from it run asynchronously.
  static Tensor empty_pinned(const Shape& shape, DType dtype = DType::F32);
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32);
  // On a GPU: empty, then fill_ (a kernel on the device's compute stream, no host memory).
  static Tensor full(const Shape& shape, double value, DType dtype, DeviceSpec device);
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor from_vector_i32(const std::vector<int32_t>& values, const Shape& shape);
  static Tensor from_vector_i64(const std::vector<int64_t>& values, const Shape& shape);
  // Wraps external memory without copying; `deleter` (may be empty) runs when the last view dies.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype,
                          std::function<void(void*)> deleter = {});

  // ---- metadata ----
  bool defined() const { return storage_ != nullptr; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::CPU; }
  // The GPU of a cuda tensor (0 for cpu), and both as a DeviceSpec ("cpu", "cuda:1").
  int device_index() const { return storage_ ? storage_->device_index() : 0; }
  DeviceSpec device_spec() const {
    return device() == Device::CPU ? DeviceSpec{Device::CPU, -1} : DeviceSpec{Device::CUDA, device_index()};
  }
  bool is_cuda() const { return device() == Device::CUDA; }
  bool is_pinned() const { return storage_ && storage_->pinned(); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape_numel(shape_); }
  // The bytes of the elements the tensor views; 0 for an undefined one (whose shape is a
  // scalar's, numel() 1): memory accounting sums nbytes() over buffers that may be released.
  size_t nbytes() const { return defined() ? static_cast<size_t>(numel()) * dtype_size(dtype_) : 0; }
  int64_t offset() const { return offset_; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // ---- data ----
  void* data_ptr() const;
  template <typename T>
  T* data() const {
    return static_cast<T*>(data_ptr());
  }
  // The single value of a one-element tensor, as double. item(), to_vector() and
  // to_vector_i64() of a cuda tensor copy to the host and wait for the device.
  double item() const;
  // Copies the elements out in row-major order, converted to float / int64.
  std::vector<float> to_vector() const;
  std::vector<int64_t> to_vector_i64() const;

  // ---- new tensors like this one (PyTorch's new_empty, new_zeros, new_full) ----
  // Fresh contiguous tensors on this tensor's device (device_spec(): cpu, or this tensor's
  // GPU, whatever the thread's current device), in `dtype` (this tensor's when omitted).
  // No autograd state. How ops allocate outputs and gradients beside their inputs.
  Tensor new_empty(const Shape& shape) const { return new_empty(shape, dtype_); }
  Tensor new_empty(const Shape& shape, DType dtype) const { return empty(shape, dtype, device_spec()); }
  Tensor new_zeros(const Shape& shape) const { return new_zeros(shape, dtype_); }
  Tensor new_zeros(const Shape& shape, DType dtype) const { return zeros(shape, dtype, device_spec()); }
  Tensor new_full(const Shape& shape, double value) const { return new_full(shape, value, dtype_); }
  Tensor new_full(const Shape& shape, double value, DType dtype) const {
    return full(shape, value, dtype, device_spec());
  }

  // ---- views (share storage) ----
  Tensor view(const Shape& shape) const;       // requires contiguous; one -1 allowed
  Tensor reshape(const Shape& shape) const;    // view when possible, else a contiguous copy
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor flatten() const { return reshape({numel()}); }

  // ---- copies ----
  Tensor contiguous() const;  // this when already contiguous
  Tensor clone() const;       // always a fresh contiguous copy
  Tensor to(DType dtype) const;
  // This tensor on `device` (this when it is there already): a contiguous copy otherwise.
  Tensor to(DeviceSpec device) const;
  // Moves this tensor's storage to `device` in place (PyTorch's `param.data = param.to(d)`,
  // done on the shared Storage): every tensor on the same storage -- views, the copies of a
  // parameter that layers and optimizers hold, tensors autograd saved -- is then on `device`
  // with the same shape, strides, offset, dtype and autograd state (requires_grad, name,
  // hooks). The old memory goes back to its allocator (stream-ordered on a GPU; from_blob
  // memory to its deleter) once the copy no longer needs it. A no-op when the storage is
  // there already. Raw pointers taken before (data_ptr) are stale afterwards; the caller
  // makes sure nothing else uses the storage meanwhile (e.g. queued work on another stream).
  // The gradient (.grad) is not moved: Module::to moves it.
  void move_to_(DeviceSpec device);
  // A pinned host copy (this when it is pinned already); needs a CUDA GPU.
  Tensor pin_memory() const;
  // Copies `src` (same shape, any dtype/strides, any device) into this tensor's elements.
  // Copies that involve a GPU run on the GPU's compute stream (tensor/cuda.h) in order with
  // its kernels: to a GPU they return once the source may be reused (from pinned memory at
  // once, the source kept alive until the copy ran); to the host they wait for the data.
  void copy_(const Tensor& src);
  void fill_(double value);
  void zero_();

  // ---- autograd state (see autograd layer) ----
  bool requires_grad() const { return meta_ && meta_->requires_grad; }
  Tensor& set_requires_grad(bool r);
  // The accumulated gradient; undefined Tensor when none yet.
  Tensor grad() const;
  void set_grad(const Tensor& g);
  bool is_leaf() const { return !meta_ || !meta_->grad_fn; }
  AutogradMeta& autograd_meta();  // creates it on first use
  const std::shared_ptr<AutogradMeta>& autograd_meta_ptr() const { return meta_; }
  // A tensor sharing data but detached from the graph.
  Tensor detach() const;
  const std::string& name() const;
  void set_name(const std::string& n) { autograd_meta().name = n; }

  std::string to_string() const;  // "Tensor[f32 2x3 cpu]", "Tensor[bf16 4 cuda:0]"

 private:
  std::shared_ptr<Storage> storage_;
  Shape shape_;
  Shape strides_;
  int64_t offset_ = 0;  // in elements
  DType dtype_ = DType::F32;
  std::shared_ptr<AutogradMeta> meta_;
};

// Contiguous strides for a shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace paratrain
