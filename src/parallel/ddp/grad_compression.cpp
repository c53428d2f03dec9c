// Gradient compression for DDP (grad_compression.h): fp16/bf16 casts and PowerSGD.
//
// Per step the compressor sees the buckets in launch order (the same on every rank). Each
// launched bucket becomes a Pending entry holding its mode, its scratch buffers and its
// Works; finish() completes them in the same order. PowerSGD state that lives across steps
// (the error feedback e and the warm-start Q) is kept per parameter id, so a bucket rebuild
// (DDP re-orders buckets after the first step) does not lose it.
//
// Buckets on a GPU: every step is a dispatch-table kernel of the bucket's device (the scale,
// the casts into a device half buffer; PowerSGD's copies, GEMMs and Gram-Schmidt on device
// factors and error buffers), and finish() orders the compute stream after each all-reduce
// instead of blocking the host. On the CPU the same kernels give the same bits as ever.
#include "paratrain/parallel/grad_compression.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/orthogonalize.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/tensor/random.h"
#include "parallel/flat_ops.h"

namespace paratrain::parallel {

namespace {
using kernels::Registry;
// The kernel of `table` for the buckets' gradients: f32 on the CPU.
template <typename Table>
auto bucket_kernel(Table Registry::*table, Device device = Device::CPU) {
  return (kernels::registry().*table).at(device, DType::F32);
}
}  // namespace

CompressKind parse_compress(const std::string& s) {
  if (s == "none") return CompressKind::None;
  if (s == "fp16" || s == "f16") return CompressKind::F16;
  if (s == "bf16") return CompressKind::BF16;
  if (s == "powersgd") return CompressKind::PowerSGD;
  PT_THROW(InputError, "unknown --compress '", s, "' (expected none, fp16, bf16 or powersgd)");
}

const char* compress_name(CompressKind k) {
  switch (k) {
    case CompressKind::None: return "none";
    case CompressKind::F16: return "fp16";
    case CompressKind::BF16: return "bf16";
    case CompressKind::PowerSGD: return "powersgd";
  }
  return "?";
}

void validate_compress(const CompressOptions& o) {
  if (o.powersgd_rank < 1) PT_THROW(InputError, "--powersgd-rank must be at least 1, got ", o.powersgd_rank);
  if (o.powersgd_start_iter < 0)
    PT_THROW(InputError, "--powersgd-start-iter must not be negative, got ", o.powersgd_start_iter);
}

CompressOptions compress_options(const std::string& kind, int64_t powersgd_rank, int64_t powersgd_start_iter,
                                 uint64_t seed, bool deterministic) {
  CompressOptions o;
  o.kind = parse_compress(kind);
  o.powersgd_rank = powersgd_rank;
  o.powersgd_start_iter = powersgd_start_iter;
  o.seed = seed;
  validate_compress(o);
  if (deterministic && o.kind != CompressKind::None)
    PT_THROW(InputError, "--compress ", compress_name(o.kind),
             " cannot be combined with --deterministic (compressed gradients are not bit-identical to one process)");
  return o;
}

namespace {
int64_t rest_of(const std::vector<int64_t>& shape) {
  int64_t m = 1;
  for (size_t d = 1; d < shape.size(); ++d) m *= shape[d];
  return m;
}
int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

bool powersgd_compresses(const std::vector<int64_t>& shape, int64_t rank) {
  if (shape.size() < 2) return false;
  const int64_t n = shape[0], m = rest_of(shape);
  return n > 0 && m > 0 && rank * (n + m) < n * m;
}

CompressBytes compress_bytes(const std::vector<std::vector<int64_t>>& shapes, const CompressOptions& o) {
  CompressBytes b;
  for (const auto& s : shapes) {
    const int64_t n = numel_of(s);
    b.tensors++;
    b.uncompressed += 4 * n;
    switch (o.kind) {
      case CompressKind::None: b.compressed += 4 * n; break;
      case CompressKind::F16:
      case CompressKind::BF16: b.compressed += 2 * n; break;
      case CompressKind::PowerSGD:
        if (powersgd_compresses(s, o.powersgd_rank)) {
          b.matrices++;
          b.compressed += 4 * o.powersgd_rank * (s[0] + rest_of(s));
        } else {
          b.compressed += 4 * n;
        }
        break;
    }
  }
  return b;
}

std::string compress_summary(const std::vector<std::vector<int64_t>>& shapes, const CompressOptions& o) {
  const CompressBytes b = compress_bytes(shapes, o);
  std::ostringstream s;
  s << "compress " << compress_name(o.kind);
  if (o.kind == CompressKind::PowerSGD) s << " rank " << o.powersgd_rank;
  s << std::fixed << std::setprecision(2) << ": " << static_cast<double>(b.uncompressed) / (1 << 20) << " MiB -> "
    << static_cast<double>(b.compressed) / (1 << 20) << " MiB per step ("
    << std::setprecision(1) << static_cast<double>(b.uncompressed) / std::max<double>(1.0, static_cast<double>(b.compressed))
    << "x less";
  if (o.kind == CompressKind::PowerSGD)
    s << "; " << b.matrices << " of " << b.tensors << " tensors as rank-" << o.powersgd_rank << " factors, the first "
      << o.powersgd_start_iter << " steps uncompressed";
  s << ")";
  return s.str();
}

std::string compress_summary(const nn::Module& module, const CompressOptions& o) {
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& [name, t] : module.named_parameters())
    if (t.requires_grad()) shapes.push_back(t.shape());
  return compress_summary(shapes, o);
}

void orthogonalize_columns(float* P, int64_t n, int64_t r) { kernels::cpu::orthogonalize_columns(P, n, r); }

// ---------------------------------------------------------------------------------------

namespace {
using detail::wait_work;

// PowerSGD's per-parameter memory, kept across steps, on the gradients' device.
struct Memory {
  Tensor error;  // n x m, e = M - P Q_local^T of the last compressed step
  Tensor q;      // m x r: warm start (the last all-reduced Q / world)
};

struct Matrix {
  int id;
  float* M;  // the gradient in the bucket, n x m row-major
  int64_t n, m;
  int64_t p_off, q_off;  // into Pending::pbuf / qbuf
};

enum class Mode { F32, Cast16, PowerSGD };

// `buf` as n f32 elements on `like`'s device: kept when it already is (the factor buffers are
// reused step after step), else new.
void reuse_or_make(Tensor& buf, const Tensor& like, int64_t n) {
  if (!buf.defined() || buf.numel() != n || buf.device_spec() != like.device_spec()) buf = like.new_empty({n});
}

struct Pending {
  Mode mode = Mode::F32;
  float* flat = nullptr;
  int64_t numel = 0;
  Tensor bucket;                // the bucket's tensor (on a GPU: f32 and Cast16 only)
  Device device = Device::CPU;
  std::vector<uint16_t> half;  // Cast16 on the host
  Tensor half_on_device;       // Cast16 on a GPU
  void* half_buf = nullptr;    // Cast16: whichever of the two this bucket uses
  // PowerSGD: [uncompressed tensors | P factors] travel together, then [Q factors].
  std::vector<std::pair<int64_t, int64_t>> plain;  // (offset in flat, numel) sent as they are
  int64_t plain_numel = 0;
  std::vector<Matrix> mats;
  Tensor up;  // uncompressed values, then the P factors (on the bucket's device)
  Tensor q;   // the Q factors
  comm::WorkPtr first, second;
};
}  // namespace

struct GradCompressor::State {
  std::map<int, Memory> memory;
  std::vector<Pending> pending;  // this step's buckets, in launch order (reused across steps)
  size_t launched = 0;
  int64_t bytes = 0;  // of the step in progress
};

GradCompressor::GradCompressor(const CompressOptions& o, std::shared_ptr<comm::ProcessGroup> pg, double timeout_s)
    : opts_(o), pg_(std::move(pg)), timeout_s_(timeout_s), st_(std::make_unique<State>()) {
  validate_compress(o);
  PT_CHECK(pg_ != nullptr, "GradCompressor needs a process group");
}

GradCompressor::~GradCompressor() { wait_quietly(); }

void GradCompressor::wait_quietly() {
  for (auto& p : st_->pending)
    for (auto* w : {&p.first, &p.second}) {
      if (!*w) continue;
      try {
        wait_work(*w, timeout_s_);
      } catch (const std::exception&) {
      }
      w->reset();
    }
  st_->launched = 0;
  st_->bytes = 0;
}

void GradCompressor::launch(Tensor& flat, const std::vector<GradSlot>& slots) {
  State& st = *st_;
  PT_CHECK(flat.dtype() == DType::F32 && flat.is_contiguous(), "compressed buckets are contiguous f32");
  if (st.launched == st.pending.size()) st.pending.emplace_back();
  Pending& b = st.pending[st.launched++];
  b.flat = flat.data<float>();
  b.numel = flat.numel();
  b.bucket = flat;
  b.device = flat.device();
  const detail::OnDeviceOf on(flat);
  b.first.reset();
  b.second.reset();
  const int world = pg_->size();
  const float inv_world = 1.0f / static_cast<float>(world);

  Mode mode = Mode::F32;
  if (opts_.kind == CompressKind::F16 || opts_.kind == CompressKind::BF16) mode = Mode::Cast16;
  if (opts_.kind == CompressKind::PowerSGD && steps_ >= opts_.powersgd_start_iter) mode = Mode::PowerSGD;
  b.mode = mode;

  if (mode == Mode::F32) {
    b.first = pg_->allreduce(b.flat, static_cast<size_t>(b.numel), DType::F32, comm::ReduceOp::kSum);
    st.bytes += 4 * b.numel;
    return;
  }
  if (mode == Mode::Cast16) {
    const bool f16 = opts_.kind == CompressKind::F16;
    const DType half_type = f16 ? DType::F16 : DType::BF16;
    if (b.device == Device::CPU) {
      b.half.resize(static_cast<size_t>(b.numel));
      b.half_buf = b.half.data();
    } else {
      if (b.half_on_device.numel() != b.numel) b.half_on_device = flat.new_empty({b.numel}, half_type);
      b.half_buf = b.half_on_device.data_ptr();
    }
    bucket_kernel(&Registry::scale, b.device)(b.flat, b.flat, inv_world, b.numel);
    kernels::registry().cast_from_f32.at(b.device, half_type)(b.half_buf, b.flat, b.numel);
    b.first = pg_->allreduce(b.half_buf, static_cast<size_t>(b.numel), half_type, comm::ReduceOp::kSum);
    st.bytes += 2 * b.numel;
    return;
  }

  // ---- PowerSGD: error feedback, P = M Q, all-reduce [uncompressed | P] ----
  const int64_t r = opts_.powersgd_rank;
  b.plain.clear();
  b.mats.clear();
  b.plain_numel = 0;
  int64_t p_total = 0, q_total = 0;
  for (const GradSlot& s : slots) {
    const int64_t off = s.grad.data<float>() - b.flat;
    PT_CHECK(off >= 0 && off + s.grad.numel() <= b.numel, "gradient slot outside its bucket");
    if (powersgd_compresses(s.grad.shape(), r)) {
      const int64_t n = s.grad.size(0), m = s.grad.numel() / n;
      b.mats.push_back({s.id, b.flat + off, n, m, p_total, q_total});
      p_total += n * r;
      q_total += m * r;
    } else {
      b.plain.emplace_back(off, s.grad.numel());
      b.plain_numel += s.grad.numel();
    }
  }
  const Device dev = b.device;
  reuse_or_make(b.up, flat, b.plain_numel + p_total);
  reuse_or_make(b.q, flat, q_total);
  float* up = b.up.data<float>();
  int64_t u = 0;
  for (auto [off, n] : b.plain) {
    bucket_kernel(&Registry::copy, dev)(up + u, b.flat + off, n);
    u += n;
  }
  float* pbase = up + b.plain_numel;
  for (const Matrix& mt : b.mats) {
    Memory& mem = st.memory[mt.id];
    if (!mem.q.defined()) {
      // The same N(0, 1) start on every rank: a generator seeded by (seed, parameter id).
      std::vector<float> q0(static_cast<size_t>(mt.m * r));
      Generator g(opts_.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(mt.id) + 1);
      for (auto& v : q0) v = static_cast<float>(g.normal());
      mem.q = Tensor::from_vector(q0, {mt.m, r}).to(flat.device_spec());
    }
    if (!mem.error.defined())
      mem.error = Tensor::zeros({mt.n, mt.m}, DType::F32, flat.device_spec());
    else
      bucket_kernel(&Registry::axpy, dev)(mt.M, mem.error.data_ptr(), 1.0f, mt.n * mt.m);  // M += e
    // P (n x r) = M (n x m) Q (m x r)
    bucket_kernel(&Registry::gemm, dev)(false, false, mt.n, r, mt.m, 1.0f, mt.M, mt.m, mem.q.data_ptr(), r, 0.0f,
                                        pbase + mt.p_off, r);
  }
  b.first = pg_->allreduce(up, static_cast<size_t>(b.up.numel()), DType::F32, comm::ReduceOp::kSum);
  st.bytes += 4 * b.up.numel();
}

void GradCompressor::finish() {
  State& st = *st_;
  const int world = pg_->size();
  const float inv_world = 1.0f / static_cast<float>(world);
  const int64_t r = opts_.powersgd_rank;
  int64_t f32_bytes = 0;
  try {
    // Phase 1, bucket order: the first all-reduce; PowerSGD orthogonalises P, computes
    // Q = M^T P and starts its all-reduce, then the residual while it is in flight.
    for (size_t k = 0; k < st.launched; ++k) {
      Pending& b = st.pending[k];
      f32_bytes += 4 * b.numel;
      // On a GPU the compute stream waits for the sum there, and the host goes on.
      const detail::OnDeviceOf on(b.bucket);
      detail::wait_work_on(b.first, timeout_s_, b.device != Device::CPU);
      b.first.reset();
      if (b.mode == Mode::F32) {
        bucket_kernel(&Registry::scale, b.device)(b.flat, b.flat, inv_world, b.numel);
        continue;
      }
      if (b.mode == Mode::Cast16) {
        kernels::registry().cast_to_f32.at(b.device, opts_.kind == CompressKind::F16 ? DType::F16 : DType::BF16)(
            b.flat, b.half_buf, b.numel);
        continue;
      }
      const Device dev = b.device;
      float* up = b.up.data<float>();
      float* qs = b.q.data<float>();
      float* pbase = up + b.plain_numel;
      for (const Matrix& mt : b.mats) {
        float* P = pbase + mt.p_off;
        bucket_kernel(&Registry::orthogonalize_columns, dev)(P, mt.n, r);
        // Q (m x r) = M^T (m x n) P (n x r); a copy stays local for the residual.
        bucket_kernel(&Registry::gemm, dev)(true, false, mt.m, r, mt.n, 1.0f, mt.M, mt.m, P, r, 0.0f, qs + mt.q_off, r);
        bucket_kernel(&Registry::copy, dev)(st.memory[mt.id].q.data_ptr(), qs + mt.q_off, mt.m * r);
      }
      if (!b.mats.empty()) {
        b.second = pg_->allreduce(qs, static_cast<size_t>(b.q.numel()), DType::F32, comm::ReduceOp::kSum);
        st.bytes += 4 * b.q.numel();
      }
      for (const Matrix& mt : b.mats) {
        // e = M - P Q_local^T: what this rank's share of the approximation left out.
        Memory& mem = st.memory[mt.id];
        bucket_kernel(&Registry::copy, dev)(mem.error.data_ptr(), mt.M, mt.n * mt.m);
        bucket_kernel(&Registry::gemm, dev)(false, true, mt.n, mt.m, r, -1.0f, pbase + mt.p_off, r, mem.q.data_ptr(), r,
                                            1.0f, mem.error.data_ptr(), mt.m);
      }
      int64_t u = 0;
      for (auto [off, n] : b.plain) {
        bucket_kernel(&Registry::scale, dev)(b.flat + off, up + u, inv_world, n);
        u += n;
      }
    }
    // Phase 2: M = P Q^T / world; Q / world is next step's warm start.
    for (size_t k = 0; k < st.launched; ++k) {
      Pending& b = st.pending[k];
      if (b.mode != Mode::PowerSGD || b.mats.empty()) continue;
      const detail::OnDeviceOf on(b.bucket);
      detail::wait_work_on(b.second, timeout_s_, b.device != Device::CPU);
      b.second.reset();
      const Device dev = b.device;
      const float* pbase = b.up.data<float>() + b.plain_numel;
      const float* qs = b.q.data<float>();
      for (const Matrix& mt : b.mats) {
        Memory& mem = st.memory[mt.id];
        bucket_kernel(&Registry::scale, dev)(mem.q.data_ptr(), qs + mt.q_off, inv_world, mt.m * r);
        bucket_kernel(&Registry::gemm, dev)(false, true, mt.n, mt.m, r, 1.0f, pbase + mt.p_off, r, mem.q.data_ptr(), r,
                                            0.0f, mt.M, mt.m);
      }
    }
  } catch (...) {
    wait_quietly();
    throw;
  }
  bytes_ = st.bytes;
  bytes_f32_ = f32_bytes;
  st.bytes = 0;
  st.launched = 0;
  ++steps_;
}

}  // namespace paratrain::parallel
