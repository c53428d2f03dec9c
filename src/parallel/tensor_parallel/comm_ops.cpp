#include "paratrain/parallel/tensor_parallel/comm_ops.h"

#include <chrono>
#include <cstring>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"

namespace paratrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// Times one blocking collective into `s`.
template <typename Fn>
void timed(TpCommStats& s, size_t bytes, Fn fn) {
  const auto t0 = Clock::now();
  fn();
  s.ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.bytes += static_cast<int64_t>(bytes);
  s.calls += 1;
}

Tensor grad_or_zeros(const Tensor& g, const Shape& shape, DType dtype) {
  return g.defined() ? g.contiguous() : Tensor::zeros(shape, dtype);
}

// Sequence blocks: x (B, T, R...) contiguous, viewed as (B, n, T/n, R) -> packed (n, B, T/n, R)
// so that block i is one contiguous range (what the collectives cut), and back.
struct SeqBlocks {
  int64_t B = 0, T = 0, row = 0;  // row: bytes of one position (product of trailing dims x size)
  int n = 1;
  SeqBlocks(const Shape& s, DType dt, int parts, const char* op) : n(parts) {
    if (s.size() < 2) PT_THROW(InputError, op, ": needs a (B, T, ...) tensor, got ", shape_str(s));
    B = s[0];
    T = s[1];
    row = static_cast<int64_t>(dtype_size(dt));
    for (size_t i = 2; i < s.size(); ++i) row *= s[i];
  }
  // (B, T) -> packed; T must be divisible by n.
  void pack(void* dst, const void* src) const {
    const int64_t tl = T / n, run = tl * row;
    auto* d = static_cast<char*>(dst);
    const auto* p = static_cast<const char*>(src);
    for (int i = 0; i < n; ++i)
      for (int64_t b = 0; b < B; ++b) std::memcpy(d + (i * B + b) * run, p + (b * T + i * tl) * row, run);
  }
  void unpack(void* dst, const void* src) const {
    const int64_t tl = T / n, run = tl * row;
    auto* d = static_cast<char*>(dst);
    const auto* p = static_cast<const char*>(src);
    for (int i = 0; i < n; ++i)
      for (int64_t b = 0; b < B; ++b) std::memcpy(d + (b * T + i * tl) * row, p + (i * B + b) * run, run);
  }
};

Shape with_dim(Shape s, size_t d, int64_t v) {
  s[d] = v;
  return s;
}

// Full (B, T, ...) from this rank's (B, T/n, ...): all-gather and unpack.
Tensor all_gather_seq(const Tensor& local, TpGroup& tp) {
  const Shape full_shape = with_dim(local.shape(), 1, local.size(1) * tp.size());
  Tensor packed = Tensor::empty({static_cast<int64_t>(local.numel()) * tp.size()}, local.dtype());
  tp.allgather(local.data_ptr(), packed.data_ptr(), static_cast<size_t>(local.numel()), local.dtype());
  Tensor out = Tensor::empty(full_shape, local.dtype());
  SeqBlocks(full_shape, local.dtype(), tp.size(), "gather_sequence").unpack(out.data_ptr(), packed.data_ptr());
  return out;
}

// This rank's block of the sum over ranks of full (B, T, ...): pack and reduce-scatter.
Tensor reduce_scatter_seq(const Tensor& full, TpGroup& tp) {
  const int n = tp.size();
  if (full.size(1) % n != 0)
    PT_THROW(InputError, "sequence parallelism: sequence length ", full.size(1), " is not divisible by tp ", n);
  Tensor packed = Tensor::empty({static_cast<int64_t>(full.numel())}, full.dtype());
  SeqBlocks(full.shape(), full.dtype(), n, "reduce_scatter_sequence").pack(packed.data_ptr(), full.data_ptr());
  Tensor out = Tensor::empty(with_dim(full.shape(), 1, full.size(1) / n), full.dtype());
  tp.reduce_scatter(packed.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()), full.dtype());
  return out;
}

void record(const char* name, const Tensor& in, Tensor& out, autograd::LambdaNode::Fn fn) {
  if (!autograd::any_requires_grad({&in})) return;
  autograd::record(std::make_shared<autograd::LambdaNode>(name, std::move(fn)), {&in}, {&out});
}

}  // namespace

void TpGroup::allreduce(void* buf, size_t count, DType dtype, comm::ReduceOp op) {
  if (!pg_ || pg_->size() == 1) return;
  timed(stats_, count * dtype_size(dtype), [&] { pg_->allreduce(buf, count, dtype, op)->wait(); });
}

void TpGroup::allgather(const void* in, void* out, size_t count, DType dtype) {
  if (!pg_ || pg_->size() == 1) {
    std::memcpy(out, in, count * dtype_size(dtype));
    return;
  }
  timed(stats_, count * dtype_size(dtype) * static_cast<size_t>(pg_->size()),
        [&] { pg_->allgather(in, out, count, dtype)->wait(); });
}

void TpGroup::reduce_scatter(const void* in, void* out, size_t count, DType dtype) {
  if (!pg_ || pg_->size() == 1) {
    std::memcpy(out, in, count * dtype_size(dtype));
    return;
  }
  timed(stats_, count * dtype_size(dtype) * static_cast<size_t>(pg_->size()),
        [&] { pg_->reduce_scatter(in, out, count, dtype)->wait(); });
}

Tensor copy_to_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  Tensor out = x.detach();
  const Shape shape = x.shape();
  const DType dt = x.dtype();
  record("copy_to_tp", x, out, [tp, shape, dt](std::vector<Tensor>& g) {
    Tensor d = grad_or_zeros(g[0], shape, dt).clone();
    tp->allreduce(d.data_ptr(), static_cast<size_t>(d.numel()), d.dtype());
    return std::vector<Tensor>{d};
  });
  return out;
}

Tensor reduce_from_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  Tensor out = x.contiguous().clone();
  tp->allreduce(out.data_ptr(), static_cast<size_t>(out.numel()), out.dtype());
  out = out.detach();
  record("reduce_from_tp", x, out, [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor gather_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  SeqBlocks check(x.shape(), x.dtype(), tp->size(), "gather_sequence");
  Tensor out = all_gather_seq(x.contiguous(), *tp);
  const Shape full = out.shape();
  const DType dt = x.dtype();
  record("gather_sequence", x, out, [tp, full, dt](std::vector<Tensor>& g) {
    return std::vector<Tensor>{reduce_scatter_seq(grad_or_zeros(g[0], full, dt), *tp)};
  });
  return out;
}

Tensor reduce_scatter_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  SeqBlocks check(x.shape(), x.dtype(), tp->size(), "reduce_scatter_sequence");
  Tensor out = reduce_scatter_seq(x.contiguous(), *tp);
  const Shape local = out.shape();
  const DType dt = x.dtype();
  record("reduce_scatter_sequence", x, out, [tp, local, dt](std::vector<Tensor>& g) {
    return std::vector<Tensor>{all_gather_seq(grad_or_zeros(g[0], local, dt), *tp)};
  });
  return out;
}

Tensor gather_last_dim(const Tensor& x_in, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x_in;
  const Tensor x = x_in.contiguous();
  const int n = tp->size();
  const int64_t last = x.size(-1), rows = x.numel() / std::max<int64_t>(last, 1);
  Tensor gathered = Tensor::empty({n, rows, last}, x.dtype());
  tp->allgather(x.data_ptr(), gathered.data_ptr(), static_cast<size_t>(x.numel()), x.dtype());
  Shape full = x.shape();
  full.back() = last * n;
  Tensor out = Tensor::empty(full, x.dtype());
  const size_t esz = dtype_size(x.dtype()), run = static_cast<size_t>(last) * esz;
  auto* d = static_cast<char*>(out.data_ptr());
  const auto* s = static_cast<const char*>(gathered.data_ptr());
  for (int i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) std::memcpy(d + (r * n + i) * run, s + (i * rows + r) * run, run);
  const int me = tp->rank();
  const Shape local = x.shape();
  record("gather_last_dim", x_in, out, [local, last, n, me, rows, esz](std::vector<Tensor>& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    Tensor gf = g[0].contiguous();
    Tensor d = Tensor::empty(local, gf.dtype());
    const size_t run = static_cast<size_t>(last) * esz;
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(d.data_ptr()) + r * run,
                  static_cast<const char*>(gf.data_ptr()) + (r * n + me) * run, run);
    return std::vector<Tensor>{d};
  });
  return out;
}

}  // namespace paratrain::parallel
