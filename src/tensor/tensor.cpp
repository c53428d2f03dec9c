#include "paratrain/tensor/tensor.h"

#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_allocator.h"
#include "tensor/cuda/tensor_copy.h"

namespace paratrain {

#if !PARATRAIN_HAVE_CUDA
// Without CUDA no storage is ever on a GPU (allocator_for refuses), so these are unreachable.
namespace detail {
void cuda_copy(Tensor&, const Tensor&) { PT_THROW(InputError, "this build of paratrain has no CUDA support"); }
void cuda_fill(Tensor&, double) { PT_THROW(InputError, "this build of paratrain has no CUDA support"); }
}  // namespace detail
#endif

// ---------------- Storage ----------------
Storage::Storage(size_t nbytes, Device device, int index) : nbytes_(nbytes), device_(device) {
  if (device == Device::CUDA) device_index_ = index >= 0 ? index : cuda::current_device();
  data_ = nbytes ? owner().allocate(nbytes) : nullptr;
}

Storage::Storage(size_t nbytes, Pinned) : nbytes_(nbytes), pinned_(true) {
  data_ = nbytes ? owner().allocate(nbytes) : nullptr;
}

Storage::Storage(void* external, size_t nbytes, Device device, std::function<void(void*)> deleter, int index)
    : data_(external), nbytes_(nbytes), device_(device), device_index_(index), owned_(false),
      deleter_(std::move(deleter)) {}

Allocator& Storage::owner() const {
  return pinned_ ? cuda::pinned_allocator() : allocator_for(device_, device_index_);
}

Storage::~Storage() {
  if (owned_) {
    if (data_) owner().deallocate(data_, nbytes_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

void Storage::rebind(void* p) {
  if (owned_ && data_) owner().deallocate(data_, nbytes_);
  if (!owned_ && deleter_) deleter_(data_);
  owned_ = false;
  deleter_ = nullptr;
  data_ = p;
}

void Storage::take_over(Storage& from) {
  if (&from == this) return;
  rebind(nullptr);  // releases what this storage owned
  data_ = from.data_;
  nbytes_ = from.nbytes_;
  device_ = from.device_;
  device_index_ = from.device_index_;
  pinned_ = from.pinned_;
  owned_ = from.owned_;
  deleter_ = std::move(from.deleter_);
  from.data_ = nullptr;
  from.owned_ = false;
  from.deleter_ = nullptr;
}

// ---------------- helpers ----------------
std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  int64_t acc = 1;
  for (int64_t i = static_cast<int64_t>(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return st;
}

static int64_t wrap_dim(int64_t d, int64_t ndim) {
  int64_t w = d < 0 ? d + ndim : d;
  PT_CHECK(w >= 0 && w < ndim, "dimension ", d, " out of range for a ", ndim, "-d tensor");
  return w;
}

// ---------------- factories ----------------
Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, int index) {
  for (int64_t d : shape) PT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device, index);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape) PT_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), Storage::Pinned{});
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, int index) {
  Tensor t = empty(shape, dtype, device, index);
  t.zero_();
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype) {
  Tensor t = empty(shape, dtype);
  t.fill_(value);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, DeviceSpec device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  PT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: ", values.size(),
           " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::F32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::from_vector_i32(const std::vector<int32_t>& values, const Shape& shape) {
  PT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector_i32: size mismatch");
  Tensor t = empty(shape, DType::I32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::from_vector_i64(const std::vector<int64_t>& values, const Shape& shape) {
  PT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector_i64: size mismatch");
  Tensor t = empty(shape, DType::I64);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * 8);
  return t;
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, std::function<void(void*)> deleter) {
  Tensor t;
  t.storage_ = std::make_shared<Storage>(data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype),
                                         Device::CPU, std::move(deleter));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

// ---------------- metadata ----------------
int64_t Tensor::size(int64_t d) const { return shape_[wrap_dim(d, dim())]; }
int64_t Tensor::stride(int64_t d) const { return strides_[wrap_dim(d, dim())]; }

bool Tensor::is_contiguous() const {
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != expected) return false;
    expected *= shape_[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  PT_CHECK(defined(), "data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

// ---------------- element access ----------------
namespace {

double load_as_double(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::U8: return static_cast<const uint8_t*>(base)[i];
    case DType::U16: return static_cast<const uint16_t*>(base)[i];
  }
  return 0;
}

void store_from_double(void* base, int64_t i, DType t, double v) {
  switch (t) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::U8: static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(v); break;
    case DType::U16: static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(v); break;
  }
}

// Calls fn(linear_index, element_offset) for every element of a strided layout, row-major.
template <typename Fn>
void for_each_offset(const Shape& shape, const Shape& strides, Fn&& fn) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  if (nd == 0) {
    fn(0, 0);
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  int64_t off = 0;
  const int64_t inner = shape[nd - 1], inner_stride = strides[nd - 1];
  for (int64_t linear = 0; linear < n; linear += inner) {
    for (int64_t j = 0; j < inner; ++j) fn(linear + j, off + j * inner_stride);
    for (int64_t d = nd - 2; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= strides[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

// dst and src of one shape and dtype, both with innermost stride 1: memcpy of each
// innermost run, the outer dimensions walked row-major.
void copy_inner_runs(Tensor& dst, const Tensor& src) {
  const Shape& shape = dst.shape();
  const int64_t nd = static_cast<int64_t>(shape.size());
  const size_t run = static_cast<size_t>(shape[nd - 1]) * dtype_size(dst.dtype());
  const int64_t esz = static_cast<int64_t>(dtype_size(dst.dtype()));
  auto* d = static_cast<char*>(dst.data_ptr());
  const auto* s = static_cast<const char*>(src.data_ptr());
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t doff = 0, soff = 0;  // elements
  for (int64_t r = 0, runs = dst.numel() / shape[nd - 1]; r < runs; ++r) {
    std::memcpy(d + doff * esz, s + soff * esz, run);
    for (int64_t k = nd - 2; k >= 0; --k) {
      if (++idx[k] < shape[k]) {
        doff += dst.stride(k), soff += src.stride(k);
        break;
      }
      doff -= dst.stride(k) * (shape[k] - 1), soff -= src.stride(k) * (shape[k] - 1);
      idx[k] = 0;
    }
  }
}

}  // namespace

double Tensor::item() const {
  PT_CHECK(numel() == 1, "item() of a tensor with ", numel(), " elements");
  if (is_cuda()) return to(DeviceSpec{}).item();
  return load_as_double(data_ptr(), 0, dtype_);
}

std::vector<float> Tensor::to_vector() const {
  if (is_cuda()) return to(DeviceSpec{}).to_vector();
  std::vector<float> out(static_cast<size_t>(numel()));
  const void* base = data_ptr();
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) {
    out[i] = static_cast<float>(load_as_double(base, off, dtype_));
  });
  return out;
}

std::vector<int64_t> Tensor::to_vector_i64() const {
  if (is_cuda()) return to(DeviceSpec{}).to_vector_i64();
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  const void* base = data_ptr();
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) {
    // int64 directly: a double holds only 53 bits
    out[i] = dtype_ == DType::I64 ? static_cast<const int64_t*>(base)[off]
                                  : static_cast<int64_t>(load_as_double(base, off, dtype_));
  });
  return out;
}

// ---------------- views ----------------
Tensor Tensor::view(const Shape& shape) const {
  PT_CHECK(is_contiguous(), "view() of a non-contiguous tensor ", to_string());
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      PT_CHECK(infer < 0, "view(): more than one -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    PT_CHECK(known > 0 && numel() % known == 0, "view(): cannot infer -1 in ", shape_str(shape), " for ", numel(), " elements");
    s[infer] = numel() / known;
  }
  PT_CHECK(shape_numel(s) == numel(), "view(): shape ", shape_str(s), " does not fit ", numel(), " elements");
  Tensor t;
  t.storage_ = storage_;
  t.shape_ = s;
  t.strides_ = contiguous_strides(s);
  t.offset_ = offset_;
  t.dtype_ = dtype_;
  return t;
}

Tensor Tensor::reshape(const Shape& shape) const {
  return is_contiguous() ? view(shape) : contiguous().view(shape);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> dims(dim());
  std::iota(dims.begin(), dims.end(), 0);
  std::swap(dims[wrap_dim(d0, dim())], dims[wrap_dim(d1, dim())]);
  return permute(dims);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  PT_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute(): ", dims.size(), " dims for a ", dim(), "-d tensor");
  Tensor t;
  t.storage_ = storage_;
  t.offset_ = offset_;
  t.dtype_ = dtype_;
  t.shape_.resize(dims.size());
  t.strides_.resize(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], dim());
    t.shape_[i] = shape_[d];
    t.strides_[i] = strides_[d];
  }
  return t;
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  d = wrap_dim(d, dim());
  PT_CHECK(start >= 0 && length >= 0 && start + length <= shape_[d], "narrow(", d, ", ", start, ", ", length,
           ") out of range for ", to_string());
  Tensor t = *this;
  t.meta_ = nullptr;
  t.offset_ = offset_ + start * strides_[d];
  t.shape_[d] = length;
  return t;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim());
  Tensor t = narrow(d, index, 1);
  t.shape_.erase(t.shape_.begin() + d);
  t.strides_.erase(t.strides_.begin() + d);
  return t;
}

// ---------------- copies ----------------
Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape_, dtype_, device(), device_index());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor t = empty(shape_, dtype, device(), device_index());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DeviceSpec d) const {
  if (d.kind == Device::CPU && !is_cuda()) return *this;
  if (d.kind == Device::CUDA && d.index < 0) d.index = cuda::current_device();
  if (d.kind == Device::CUDA && is_cuda() && d.index == device_index()) return *this;
  Tensor t = empty(shape_, dtype_, d.kind, d.index);
  t.copy_(*this);
  return t;
}

void Tensor::move_to_(DeviceSpec d) {
  PT_CHECK(defined(), "move_to_() of an undefined tensor");
  if (d.kind == Device::CPU && !is_cuda()) return;  // pinned host memory is on the cpu too
  if (d.kind == Device::CUDA && d.index < 0) d.index = cuda::current_device();
  if (d.kind == Device::CUDA && is_cuda() && d.index == device_index()) return;
  // The whole storage, byte for byte, so every view of it keeps its offset and strides.
  const int64_t n = static_cast<int64_t>(storage_->nbytes());
  Tensor bytes;
  bytes.storage_ = storage_;
  bytes.shape_ = {n};
  bytes.strides_ = {1};
  bytes.dtype_ = DType::U8;
  Tensor moved = empty({n}, DType::U8, d);
  moved.copy_(bytes);
  storage_->take_over(*moved.storage_);
}

Tensor Tensor::pin_memory() const {
  if (is_pinned()) return *this;
  Tensor t = empty_pinned(shape_, dtype_);
  t.copy_(*this);
  return t;
}

void Tensor::copy_(const Tensor& src) {
  PT_CHECK(src.shape_ == shape_, "copy_(): shape ", shape_str(src.shape_), " into ", shape_str(shape_));
  if (numel() == 0) return;
  if (is_cuda() || src.is_cuda()) {
    detail::cuda_copy(*this, src);
    return;
  }
  if (src.dtype_ == dtype_ && is_contiguous() && src.is_contiguous()) {
    std::memmove(data_ptr(), src.data_ptr(), nbytes());
    return;
  }
  if (is_contiguous() && src.is_contiguous() && dtype_ == DType::F32 && src.dtype_ == DType::BF16) {
    float* d = data<float>();
    const uint16_t* s = src.data<uint16_t>();
    for (int64_t i = 0, n = numel(); i < n; ++i) d[i] = bf16_to_f32(s[i]);
    return;
  }
  // The same dtype, both innermost dimensions dense, different storages: the bytes of each
  // innermost run at once (views of one storage take the general path, which reads every
  // element before writing any).
  if (src.dtype_ == dtype_ && src.storage_ != storage_ && dim() > 0 && strides_.back() == 1 &&
      src.strides_.back() == 1) {
    copy_inner_runs(*this, src);
    return;
  }
  // General path: gather src elements in row-major order, then scatter into this layout.
  std::vector<double> tmp(static_cast<size_t>(numel()));
  const void* sb = src.data_ptr();
  for_each_offset(src.shape_, src.strides_, [&](int64_t i, int64_t off) { tmp[i] = load_as_double(sb, off, src.dtype_); });
  void* db = data_ptr();
  if (src.dtype_ == dtype_ && dtype_ == DType::F32) {
    const float* sp = src.data<float>();
    float* dp = static_cast<float*>(db);
    // exact copy for f32 (no round trip needed, but double holds f32 exactly anyway)
    (void)sp;
    for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) { dp[off] = static_cast<float>(tmp[i]); });
    return;
  }
  for_each_offset(shape_, strides_, [&](int64_t i, int64_t off) { store_from_double(db, off, dtype_, tmp[i]); });
}

void Tensor::fill_(double value) {
  if (is_cuda()) {
    detail::cuda_fill(*this, value);
    return;
  }
  void* b = data_ptr();
  if (is_contiguous() && dtype_ == DType::F32) {
    float* p = static_cast<float*>(b);
    float v = static_cast<float>(value);
    for (int64_t i = 0, n = numel(); i < n; ++i) p[i] = v;
    return;
  }
  for_each_offset(shape_, strides_, [&](int64_t, int64_t off) { store_from_double(b, off, dtype_, value); });
}

void Tensor::zero_() {
  if (is_cuda()) {
    detail::cuda_fill(*this, 0.0);
  } else if (is_contiguous()) {
    if (nbytes()) std::memset(data_ptr(), 0, nbytes());
  } else {
    fill_(0.0);
  }
}

// ---------------- autograd state ----------------
AutogradMeta& Tensor::autograd_meta() {
  if (!meta_) meta_ = std::make_shared<AutogradMeta>();
  return *meta_;
}

Tensor& Tensor::set_requires_grad(bool r) {
  if (r) PT_CHECK(dtype_is_float(dtype_), "only floating-point tensors can require gradients");
  autograd_meta().requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const {
  if (!meta_ || !meta_->grad) return Tensor();
  return *meta_->grad;
}

void Tensor::set_grad(const Tensor& g) {
  AutogradMeta& m = autograd_meta();
  if (!g.defined())
    m.grad.reset();
  else
    m.grad = std::make_shared<Tensor>(g);
}

Tensor Tensor::detach() const {
  Tensor t = *this;
  t.meta_ = nullptr;
  return t;
}

const std::string& Tensor::name() const {
  static const std::string empty_name;
  return meta_ ? meta_->name : empty_name;
}

std::string Tensor::to_string() const {
  std::ostringstream os;
  os << "Tensor[" << dtype_name(dtype_) << " ";
  for (size_t i = 0; i < shape_.size(); ++i) os << (i ? "x" : "") << shape_[i];
  if (shape_.empty()) os << "scalar";
  os << " " << device_spec().str() << "]";
  return os.str();
}

}  // namespace paratrain
