#include "paratrain/parallel/tensor_parallel/comm_ops.h"

#include <chrono>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"

namespace paratrain::parallel {

namespace {

using Clock = std::chrono::steady_clock;

// Times one collective into `s` (its enqueue time where it does not block: comm_ops.h).
template <typename Fn>
void timed(TpCommStats& s, size_t bytes, Fn fn) {
  const auto t0 = Clock::now();
  fn();
  s.ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  s.bytes += static_cast<int64_t>(bytes);
  s.calls += 1;
}

// The gradient, or zeros on the forward's device when none came.
Tensor grad_or_zeros(const Tensor& g, const DeviceSpec& device, const Shape& shape, DType dtype) {
  return g.defined() ? g.contiguous() : Tensor::zeros(shape, dtype, device);
}

void check_buffers(const Tensor& in, const Tensor& out, int64_t in_parts, int64_t out_parts, const char* op) {
  if (!in.is_contiguous() || !out.is_contiguous())
    PT_THROW(InputError, "TpGroup::", op, ": buffers must be contiguous");
  if (in.dtype() != out.dtype())
    PT_THROW(InputError, "TpGroup::", op, ": input is ", dtype_name(in.dtype()), " but output ", dtype_name(out.dtype()));
  if (in.device_spec() != out.device_spec())
    PT_THROW(InputError, "TpGroup::", op, ": input is on ", in.device_spec().str(), " but output on ",
             out.device_spec().str());
  if (in.numel() * out_parts != out.numel() * in_parts)
    PT_THROW(InputError, "TpGroup::", op, ": ", in.numel(), " elements in, ", out.numel(), " out; expected a ratio of ",
             in_parts, ":", out_parts);
}

// Sequence blocks of x (B, T, ...): viewed as (B, n, T/n * row) with row = the product of the
// trailing dims, block i of the sequence is [:, i, :]. The collectives cut contiguous ranges,
// so a packed (n, B, T/n * row) tensor holds block i as one range: pack and unpack are the
// permute (1, 0, 2) of one into the other (a strided copy on either device).
struct SeqBlocks {
  int64_t B = 0, T = 0, row = 1;
  int n = 1;
  SeqBlocks(const Shape& s, int parts, const char* op) : n(parts) {
    if (s.size() < 2) PT_THROW(InputError, op, ": needs a (B, T, ...) tensor, got ", shape_str(s));
    B = s[0];
    T = s[1];
    for (size_t i = 2; i < s.size(); ++i) row *= s[i];
  }
  int64_t run() const { return T / n * row; }
  // x (B, T, ...) contiguous, T divisible by n -> packed (n, B, T/n * row).
  Tensor pack(const Tensor& x) const {
    Tensor packed = x.new_empty({n, B, run()});
    packed.copy_(x.view({B, n, run()}).permute({1, 0, 2}));
    return packed;
  }
  // packed (n, B, T/n * row) contiguous -> (B, T, ...) of `shape`.
  Tensor unpack(const Tensor& packed, const Shape& shape) const {
    Tensor out = packed.new_empty({B, n, run()});
    out.copy_(packed.view({n, B, run()}).permute({1, 0, 2}));
    return out.view(shape);
  }
};

Shape with_dim(Shape s, size_t d, int64_t v) {
  s[d] = v;
  return s;
}

// Full (B, T, ...) from this rank's (B, T/n, ...): all-gather and unpack.
Tensor all_gather_seq(const Tensor& local, TpGroup& tp) {
  const Shape full_shape = with_dim(local.shape(), 1, local.size(1) * tp.size());
  Tensor packed = local.new_empty({static_cast<int64_t>(local.numel()) * tp.size()});
  tp.allgather(local, packed);
  return SeqBlocks(full_shape, tp.size(), "gather_sequence").unpack(packed, full_shape);
}

// This rank's block of the sum over ranks of full (B, T, ...): pack and reduce-scatter.
Tensor reduce_scatter_seq(const Tensor& full, TpGroup& tp) {
  const int n = tp.size();
  if (full.size(1) % n != 0)
    PT_THROW(InputError, "sequence parallelism: sequence length ", full.size(1), " is not divisible by tp ", n);
  const Tensor packed = SeqBlocks(full.shape(), n, "reduce_scatter_sequence").pack(full);
  Tensor out = full.new_empty(with_dim(full.shape(), 1, full.size(1) / n));
  tp.reduce_scatter(packed, out);
  return out;
}

void record(const char* name, const Tensor& in, Tensor& out, autograd::LambdaNode::Fn fn) {
  if (!autograd::any_requires_grad({&in})) return;
  autograd::record(std::make_shared<autograd::LambdaNode>(name, std::move(fn)), {&in}, {&out});
}

}  // namespace

void TpGroup::allreduce(void* buf, size_t count, DType dtype, comm::ReduceOp op) {
  if (!pg_ || pg_->size() == 1) return;
  timed(stats_, count * dtype_size(dtype), [&] { pg_->allreduce(buf, count, dtype, op)->wait_on_device(); });
}

void TpGroup::allreduce(Tensor& buf, comm::ReduceOp op) {
  if (!buf.is_contiguous()) PT_THROW(InputError, "TpGroup::allreduce: the buffer must be contiguous");
  allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), buf.dtype(), op);
}

void TpGroup::allgather(const Tensor& in, Tensor& out) {
  check_buffers(in, out, 1, size(), "allgather");
  if (!pg_ || pg_->size() == 1) {
    out.view(in.shape()).copy_(in);
    return;
  }
  const size_t count = static_cast<size_t>(in.numel());
  timed(stats_, count * dtype_size(in.dtype()) * static_cast<size_t>(pg_->size()),
        [&] { pg_->allgather(in.data_ptr(), out.data_ptr(), count, in.dtype())->wait_on_device(); });
}

void TpGroup::reduce_scatter(const Tensor& in, Tensor& out) {
  check_buffers(in, out, size(), 1, "reduce_scatter");
  if (!pg_ || pg_->size() == 1) {
    out.copy_(in.view(out.shape()));
    return;
  }
  const size_t count = static_cast<size_t>(out.numel());
  timed(stats_, count * dtype_size(in.dtype()) * static_cast<size_t>(pg_->size()),
        [&] { pg_->reduce_scatter(in.data_ptr(), out.data_ptr(), count, in.dtype())->wait_on_device(); });
}

Tensor copy_to_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  Tensor out = x.detach();
  const Shape shape = x.shape();
  const DType dt = x.dtype();
  const DeviceSpec like = x.device_spec();
  record("copy_to_tp", x, out, [tp, shape, dt, like](std::vector<Tensor>& g) {
    Tensor d = grad_or_zeros(g[0], like, shape, dt).clone();
    tp->allreduce(d);
    return std::vector<Tensor>{d};
  });
  return out;
}

Tensor reduce_from_tp(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  Tensor out = x.contiguous().clone();
  tp->allreduce(out);
  out = out.detach();
  record("reduce_from_tp", x, out, [](std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

Tensor gather_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  SeqBlocks check(x.shape(), tp->size(), "gather_sequence");
  Tensor out = all_gather_seq(x.contiguous(), *tp);
  const Shape full = out.shape();
  const DType dt = x.dtype();
  const DeviceSpec like = x.device_spec();
  record("gather_sequence", x, out, [tp, full, dt, like](std::vector<Tensor>& g) {
    return std::vector<Tensor>{reduce_scatter_seq(grad_or_zeros(g[0], like, full, dt), *tp)};
  });
  return out;
}

Tensor reduce_scatter_sequence(const Tensor& x, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x;
  SeqBlocks check(x.shape(), tp->size(), "reduce_scatter_sequence");
  Tensor out = reduce_scatter_seq(x.contiguous(), *tp);
  const Shape local = out.shape();
  const DType dt = x.dtype();
  const DeviceSpec like = x.device_spec();
  record("reduce_scatter_sequence", x, out, [tp, local, dt, like](std::vector<Tensor>& g) {
    return std::vector<Tensor>{all_gather_seq(grad_or_zeros(g[0], like, local, dt), *tp)};
  });
  return out;
}

Tensor gather_last_dim(const Tensor& x_in, const std::shared_ptr<TpGroup>& tp) {
  if (tp->size() == 1) return x_in;
  const Tensor x = x_in.contiguous();
  const int n = tp->size();
  const int64_t last = x.size(-1), rows = x.numel() / std::max<int64_t>(last, 1);
  // Rank i's (rows, last) at block i, then (rows, n, last): row r holds every rank's columns.
  Tensor gathered = x.new_empty({n, rows, last});
  tp->allgather(x, gathered);
  Shape full = x.shape();
  full.back() = last * n;
  Tensor out = x.new_empty({rows, n, last});
  out.copy_(gathered.permute({1, 0, 2}));
  out = out.view(full);
  const int me = tp->rank();
  const Shape local = x.shape();
  record("gather_last_dim", x_in, out, [local, last, n, me, rows](std::vector<Tensor>& g) {
    if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
    const Tensor gf = g[0].contiguous();
    Tensor d = gf.new_empty({rows, last});
    d.copy_(gf.view({rows, n, last}).select(1, me));
    return std::vector<Tensor>{d.view(local)};
  });
  return out;
}

}  // namespace paratrain::parallel
