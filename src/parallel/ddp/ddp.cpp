// DistributedDataParallel: the reducer (buckets, grad-ready hooks, overlapped all-reduce).
//
// The story of one synchronised step, as seen from the hooks:
//   1. zero_grad() zeroes each bucket's flat buffer and makes every .grad a view of it.
//   2. backward runs; the engine adds each parameter's gradient into its view in place and,
//      when the gradient is final, calls on_ready(i). In deterministic mode on_ready first
//      moves the micro-step's gradient into the accumulator (acc += g; g = 0).
//   3. On a synchronised pass, on_ready marks the parameter ready; when a bucket has no
//      pending parameters left, it and every following complete bucket are launched in
//      bucket order (never out of order: all ranks must issue the same collective sequence).
//   4. finish() handles parameters that never became ready (unused), waits for the buckets
//      with a deadline, scales by 1/world (or 1/(micro-steps x world)), and remembers the
//      ready order of the first step so the next zero_grad() can rebuild the buckets.
// ZeRO (zero_stage 1|2): the same story, but each bucket is padded to W equal blocks and
// reduce-scattered into this rank's block (`shard`); finish() scales the shard only and unsets
// .grad, stage 2 frees the full buffers (zero_grad() takes them again). allgather_parameters()
// packs the rank's updated block of the parameters, all-gathers it bucket by bucket (two in
// flight) and copies every block back into the parameters.
//
// Devices: every bucket, accumulator, shard and staging buffer is allocated on the
// parameters' device (all on one; the constructor checks). On the CPU the arithmetic is the
// host loops of flat_ops.h and the copies are contiguous copy_() (a memmove), the same bits as
// ever. On a GPU (with a group on it: nccl) the same steps run as kernels and copies on the
// compute stream, and a collective's result is waited for with Work::wait_on_device(): the
// compute stream waits for the comm stream on the GPU, the host goes on. No buffer needs
// cuda::record_stream: the group orders its comm stream after the compute stream at each
// call, and every buffer the comm stream used is freed (ZeRO-2's full buckets, the all-gather
// staging) or written again (zero_grad()) only after the compute stream was made to wait for
// that call (or the host waited for it), so the compute stream's reuse of a block is ordered
// after the collective. A failure that shows only after wait_on_device() returned is thrown by
// the next zero_grad() (check_device_waited) or, the group being broken, by its next call.
// Compression on a GPU: the fp16/bf16 casts and PowerSGD's factors, error buffers, GEMMs and
// Gram-Schmidt are the device's kernels (grad_compression.cpp), ordered like the buckets.
#include "paratrain/parallel/ddp.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "paratrain/base/trace.h"
#include "parallel/flat_ops.h"
#include "parallel/same_model.h"

namespace paratrain::parallel {

using detail::move_add;
using detail::scale;
using detail::wait_work;
using detail::wait_work_on;

using detail::Clock;
using detail::ms_between;

struct DistributedDataParallel::Impl {
  struct Param {
    std::string name;
    Tensor param;
    int bucket = -1;
    int64_t offset = 0;  // first element in its bucket's flat buffer
    Tensor view;        // .grad: a view of the bucket's flat buffer
    Tensor accum_view;  // deterministic: the accumulator's view
    bool ready = false;
    int64_t passes = 0;  // backward passes that reached it since zero_grad (deterministic)
  };
  struct Bucket {
    std::vector<int> params;
    Tensor flat;   // gradients, f32 [numel]
    Tensor accum;  // deterministic: accumulated micro-step gradients
    int64_t shard_len = 0;  // ZeRO: block length; flat/accum hold world x shard_len (zero padded)
    Tensor shard;           // ZeRO: this rank's block of the reduced gradient, f32 [shard_len]
    int pending = 0;
    comm::WorkPtr work;
    bool launched = false;
  };

  std::shared_ptr<comm::ProcessGroup> pg;
  DdpOptions opts;
  int rank = 0, world = 1;
  std::vector<Param> params;
  std::vector<Bucket> buckets;
  int next_launch = 0;
  bool no_sync = false;
  bool recording = true;  // the first synchronised pass records the ready order
  int64_t syncs = 0;      // finish() calls completed (DdpOptions::test_skip_allreduce_at)
  std::vector<int> ready_order;
  bool rebuild_pending = false, rebuilt = false;
  bool any_launched = false;
  Clock::time_point first_launch;
  DdpStepStats stats;
  std::unique_ptr<GradCompressor> compressor;  // --compress (communicating groups only)
  DeviceSpec device;  // the parameters' (all on one); the buffers are allocated there
  std::vector<comm::WorkPtr> device_waited;  // GPU: results waited for on the stream only

  bool communicates() const { return pg && world > 1; }
  bool on_gpu() const { return device.kind == Device::CUDA; }
  // A collective's result is next read on the compute stream (header comment, "Devices").
  void wait_result(const comm::WorkPtr& w) {
    wait_work_on(w, opts.timeout_s, on_gpu());
    if (w && on_gpu()) device_waited.push_back(w);
  }
  // Throws the failure of a call waited for only on the GPU in the last step, if it failed.
  void check_device_waited() {
    std::vector<comm::WorkPtr> ws;
    ws.swap(device_waited);
    for (const auto& w : ws)
      if (std::exception_ptr e = w->error()) std::rethrow_exception(e);
  }

  void build_buckets(const std::vector<int>& order) {
    buckets.clear();
    size_t cap = opts.first_bucket_bytes > 0 ? opts.first_bucket_bytes : opts.bucket_bytes;
    Bucket cur;
    size_t cur_bytes = 0;
    for (int i : order) {
      const size_t bytes = params[i].param.nbytes();
      if (!cur.params.empty() && cur_bytes + bytes > cap) {
        buckets.push_back(std::move(cur));
        cur = Bucket();
        cur_bytes = 0;
        cap = opts.bucket_bytes;
      }
      cur.params.push_back(i);
      cur_bytes += bytes;
    }
    if (!cur.params.empty()) buckets.push_back(std::move(cur));
    for (size_t b = 0; b < buckets.size(); ++b) {
      Bucket& bk = buckets[b];
      int64_t total = 0;
      for (int i : bk.params) total += params[i].param.numel();
      if (opts.zero_stage > 0) {  // W equal blocks, the last rank's padded with zeros
        bk.shard_len = (total + world - 1) / world;
        total = bk.shard_len * world;
        bk.shard = Tensor::zeros({bk.shard_len}, DType::F32, device);
      }
      bk.flat = Tensor::zeros({total}, DType::F32, device);
      if (opts.deterministic) bk.accum = Tensor::zeros({total}, DType::F32, device);
      int64_t off = 0;
      for (int i : bk.params) {
        Param& p = params[i];
        const int64_t n = p.param.numel();
        p.bucket = static_cast<int>(b);
        p.offset = off;
        p.view = bk.flat.narrow(0, off, n).view(p.param.shape());
        if (opts.deterministic) p.accum_view = bk.accum.narrow(0, off, n).view(p.param.shape());
        off += n;
      }
      bk.pending = static_cast<int>(bk.params.size());
    }
  }

  void reset_step_state() {
    for (auto& p : params) p.ready = false;
    for (auto& b : buckets) {
      b.pending = static_cast<int>(b.params.size());
      b.work.reset();
      b.launched = false;
    }
    next_launch = 0;
    any_launched = false;
  }

  void launch(Bucket& b) {
    if (!any_launched) {
      any_launched = true;
      first_launch = Clock::now();
    }
    b.launched = true;
    if (!communicates()) return;
    if (opts.zero_stage > 0) {  // ZeRO: this rank receives only the sum of its block
      const Tensor& in = opts.deterministic ? b.accum : b.flat;
      b.work = pg->reduce_scatter(in.data_ptr(), b.shard.data_ptr(), static_cast<size_t>(b.shard_len), DType::F32,
                                  comm::ReduceOp::kSum);
      return;
    }
    if (compressor) {  // grad_compression.h: casts or PowerSGD, collectives still in bucket order
      std::vector<GradSlot> slots;
      for (int i : b.params) slots.push_back({i, params[i].view});
      return compressor->launch(b.flat, slots);
    }
    // Default mode: the average is taken inside the all-reduce (the division happens where
    // the sums are formed, on the group's thread, overlapped), so finish() has no pass left.
    Tensor& buf = opts.deterministic ? b.accum : b.flat;
    if (syncs == opts.test_skip_allreduce_at && &b == &buckets.front()) {  // test hook (DdpOptions)
      PT_LOG_WARN(kParallel, "PARATRAIN_TEST_SKIP_ALLREDUCE: rank ", rank, " skips the all-reduce of its first bucket (",
                  b.flat.numel(), " values) at step ", syncs);
      return;
    }
    b.work = pg->allreduce(buf.data_ptr(), static_cast<size_t>(buf.numel()), DType::F32,
                           opts.deterministic ? comm::ReduceOp::kSum : comm::ReduceOp::kAvg);
  }

  void launch_ready() {
    while (next_launch < static_cast<int>(buckets.size()) && buckets[next_launch].pending == 0) {
      const trace::CallTagScope tag("bucket", next_launch);  // on the bucket's collectives in --trace
      launch(buckets[next_launch++]);
    }
  }

  void mark_ready(int i) {
    Param& p = params[i];
    p.ready = true;
    if (recording) ready_order.push_back(i);
    if (--buckets[p.bucket].pending == 0) launch_ready();
  }

  void on_ready(int i, Tensor& grad) {
    Param& p = params[i];
    if (!grad.defined()) return;
    if (grad.data_ptr() != p.view.data_ptr()) {
      // .grad was replaced (set to none, or assigned): fold it into the bucket. The engine
      // passes *meta.grad by reference, so assign in place rather than set_grad().
      p.view.copy_(grad);
      grad = p.view;
    }
    if (opts.deterministic) {
      move_add(p.accum_view, p.view);
      p.passes++;
    }
    if (no_sync) return;
    if (p.ready)
      PT_THROW(InputError, "DistributedDataParallel: parameter ", p.name,
               " received a gradient twice in one synchronised step (call backward once per step outside "
               "no_sync(), then finish())");
    mark_ready(i);
  }

  // ZeRO-2: takes a released bucket's buffers again (the caching allocator hands back the
  // same blocks) and points the parameters' views at them; zero_grad() zeroes them.
  void reacquire(Bucket& bk) {
    bk.flat = Tensor::empty({bk.shard_len * world}, DType::F32, device);
    if (opts.deterministic) bk.accum = Tensor::empty({bk.shard_len * world}, DType::F32, device);
    for (int i : bk.params) {
      Param& p = params[i];
      p.view = bk.flat.narrow(0, p.offset, p.param.numel()).view(p.param.shape());
      if (opts.deterministic) p.accum_view = bk.accum.narrow(0, p.offset, p.param.numel()).view(p.param.shape());
    }
  }

  // ZeRO, in finish(): waits for each bucket's reduce-scatter, scales this rank's shard and
  // unsets .grad (the full buffers now hold only this rank's own, unreduced gradient); stage
  // 2 frees them. Returns the bytes reduce-scattered.
  int64_t finish_shards(float factor) {
    int64_t bytes = 0;
    for (auto& b : buckets) {
      wait_result(b.work);
      const Tensor& buf = opts.deterministic ? b.accum : b.flat;
      if (!communicates()) b.shard.copy_(buf.narrow(0, rank * b.shard_len, b.shard_len));
      if (opts.deterministic || world > 1) scale(b.shard, factor);
      bytes += static_cast<int64_t>(buf.nbytes());
      for (int i : b.params) params[i].param.set_grad(Tensor());
      if (opts.zero_stage == 2) {
        for (int i : b.params) params[i].view = Tensor(), params[i].accum_view = Tensor();
        b.flat = Tensor();
        b.accum = Tensor();
      }
    }
    return bytes;
  }

  void wait_all_quietly() {
    if (compressor) compressor->wait_quietly();
    for (auto& b : buckets) {
      if (!b.work) continue;
      try {
        wait_work(b.work, opts.timeout_s);
      } catch (const std::exception&) {
      }
    }
  }

  void rebuild() {
    const int n = static_cast<int>(params.size());
    std::vector<int64_t> order;
    std::vector<bool> seen(n, false);
    for (int i : ready_order)
      if (!seen[i]) order.push_back(i), seen[i] = true;
    for (const auto& b : buckets)
      for (int i : b.params)
        if (!seen[i]) order.push_back(i), seen[i] = true;
    if (communicates()) {
      pg->broadcast(order.data(), order.size(), DType::I64, 0)->wait();  // host memory: nccl stages it
      std::vector<bool> got(n, false);
      for (int64_t i : order) {
        PT_CHECK(i >= 0 && i < n && !got[i], "rank 0's bucket order is not a permutation");
        got[i] = true;
      }
    }
    std::vector<int> o(order.begin(), order.end());
    build_buckets(o);
  }
};

DistributedDataParallel::DistributedDataParallel(nn::Module& module, std::shared_ptr<comm::ProcessGroup> pg,
                                                 DdpOptions options)
    : module_(module), impl_(std::make_shared<Impl>()) {
  Impl& im = *impl_;
  im.pg = std::move(pg);
  im.opts = options;
  if (options.zero_stage < 0 || options.zero_stage > 2)
    PT_THROW(InputError, "DistributedDataParallel: zero_stage must be 0, 1 or 2, got ", options.zero_stage);
  if (options.zero_stage > 0) im.opts.reorder_buckets = false;  // the shard layout stays fixed
  if (im.pg) {
    im.rank = im.pg->rank();
    im.world = im.pg->size();
    if (options.deterministic && im.world > 1 && !im.pg->options().deterministic)
      PT_THROW(InputError,
               "DistributedDataParallel: deterministic mode needs a process group created with the "
               "deterministic (rank-ordered) option");
  }
  validate_compress(options.compress);
  // ---- the parameters' device: one for all, and a group whose buffers live there ----
  std::string first_name;
  for (auto& [name, t] : module.named_parameters()) {
    if (!t.requires_grad()) continue;
    if (first_name.empty()) {
      first_name = name, im.device = t.device_spec();
    } else if (t.device_spec() != im.device) {
      PT_THROW(InputError, "DistributedDataParallel: the parameters are on more than one device: ", first_name,
               " is on ", im.device.str(), ", ", name, " on ", t.device_spec().str(),
               " (move the whole model to one device first)");
    }
  }
  if (im.communicates() && im.pg->backend_name() == "nccl" && !im.on_gpu())
    PT_THROW(InputError, "DistributedDataParallel: the parameters are on ", im.device.str(),
             " but the process group is nccl (backend nccl needs the parameters on the group's GPU)");
  if (options.deterministic && options.compress.kind != CompressKind::None)
    PT_THROW(InputError, "--compress ", compress_name(options.compress.kind),
             " cannot be combined with --deterministic (compressed gradients are not bit-identical to one process)");
  if (options.zero_stage > 0 && options.compress.kind != CompressKind::None)
    PT_THROW(InputError, "--compress ", compress_name(options.compress.kind),
             " cannot be combined with --zero (ZeRO reduce-scatters f32 shards; compression replaces all-reduce)");
  if (options.compress.kind != CompressKind::None && im.communicates())
    im.compressor = std::make_unique<GradCompressor>(options.compress, im.pg, options.timeout_s);
  for (auto& [name, t] : module.named_parameters()) {
    if (!t.requires_grad()) continue;
    if (t.dtype() != DType::F32)
      PT_THROW(InputError, "DistributedDataParallel: parameter ", name, " is ", dtype_name(t.dtype()),
               "; gradient buckets hold f32 parameters only");
    PT_CHECK(t.is_contiguous(), "parameter ", name, " is not contiguous");
    Impl::Param p;
    p.name = name;
    p.param = t;
    im.params.push_back(std::move(p));
  }

  // ---- every rank must hold the same model: compare fingerprints ----
  if (im.communicates()) {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const auto& p : im.params) named.emplace_back(p.name, p.param);
    detail::check_same_model(*im.pg, named, "DistributedDataParallel");
    if (options.broadcast_parameters) {
      std::vector<comm::WorkPtr> works;
      for (auto& p : im.params)
        works.push_back(im.pg->broadcast(p.param.data_ptr(), static_cast<size_t>(p.param.numel()), DType::F32, 0));
      for (auto& w : works) wait_work(w, options.timeout_s);
    }
  }

  // ---- buckets in reverse registration order, hooks ----
  std::vector<int> order;
  for (int i = static_cast<int>(im.params.size()) - 1; i >= 0; --i) order.push_back(i);
  im.build_buckets(order);
  std::weak_ptr<Impl> weak = impl_;
  for (int i = 0; i < static_cast<int>(im.params.size()); ++i) {
    autograd::register_grad_ready_hook(im.params[i].param, [weak, i](Tensor& g) {
      if (auto p = weak.lock()) p->on_ready(i, g);
    });
  }
  zero_grad();
}

DistributedDataParallel::~DistributedDataParallel() {
  if (impl_) impl_->wait_all_quietly();
}

int DistributedDataParallel::rank() const { return impl_->rank; }
int DistributedDataParallel::world_size() const { return impl_->world; }
const DdpOptions& DistributedDataParallel::options() const { return impl_->opts; }
const DdpStepStats& DistributedDataParallel::last_stats() const { return impl_->stats; }
bool DistributedDataParallel::buckets_rebuilt() const { return impl_->rebuilt; }

std::vector<std::vector<std::string>> DistributedDataParallel::bucket_names() const {
  std::vector<std::vector<std::string>> out;
  for (const auto& b : impl_->buckets) {
    out.emplace_back();
    for (int i : b.params) out.back().push_back(impl_->params[i].name);
  }
  return out;
}

float DistributedDataParallel::backward_seed(int64_t grad_accum) const {
  PT_CHECK(grad_accum >= 1, "grad_accum must be at least 1");
  return impl_->opts.deterministic ? 1.0f : 1.0f / static_cast<float>(grad_accum);
}

void DistributedDataParallel::zero_grad() {
  Impl& im = *impl_;
  im.wait_all_quietly();
  if (im.rebuild_pending) {
    im.rebuild();
    im.rebuild_pending = false;
    im.rebuilt = true;
  }
  im.check_device_waited();
  im.reset_step_state();
  for (auto& b : im.buckets) {
    if (!b.flat.defined()) im.reacquire(b);  // ZeRO-2 released it at finish()
    b.flat.zero_();
    if (b.accum.defined()) b.accum.zero_();
  }
  for (auto& p : im.params) {
    p.passes = 0;
    p.param.set_grad(p.view);
  }
}

DistributedDataParallel::NoSync DistributedDataParallel::no_sync() { return NoSync(impl_->no_sync); }

void DistributedDataParallel::finish() {
  Impl& im = *impl_;
  const auto t0 = Clock::now();
  std::vector<int> missing;
  for (int i = 0; i < static_cast<int>(im.params.size()); ++i)
    if (!im.params[i].ready) missing.push_back(i);
  if (!missing.empty()) {
    if (im.opts.find_unused_parameters) {
      // Launch order stays the bucket order on every rank: the missing ones count as ready now.
      for (int i : missing) {
        im.params[i].ready = true;
        --im.buckets[im.params[i].bucket].pending;
      }
      im.launch_ready();
    } else {
      im.wait_all_quietly();
      std::vector<std::string> names;
      for (int i : missing) names.push_back(im.params[i].name);
      const size_t n_missing = missing.size();
      im.reset_step_state();
      PT_THROW(InputError, "DistributedDataParallel (rank ", im.rank, "): ", n_missing,
               " parameter(s) received no gradient in this step: ", detail::name_list(names),
               ". Their buckets can never be complete; if the model leaves parameters unused, construct it "
               "with find_unused_parameters = true");
    }
  }
  PT_CHECK(im.next_launch == static_cast<int>(im.buckets.size()), "not every bucket was launched");

  int64_t micro = 1;
  if (im.opts.deterministic)
    for (const auto& p : im.params) micro = std::max(micro, p.passes);
  const float factor = im.opts.deterministic ? 1.0f / static_cast<float>(micro * im.world)
                                             : 1.0f / static_cast<float>(im.world);
  int64_t bytes = 0;
  const bool sharded = im.opts.zero_stage > 0;  // ZeRO: the shards instead of the loop below
  if (sharded) {
    try {
      bytes = im.finish_shards(factor);
    } catch (...) {
      im.wait_all_quietly();
      im.reset_step_state();
      throw;
    }
  }
  int64_t bytes_f32 = 0;
  try {
    if (im.compressor) {  // leaves the mean over ranks in every bucket
      im.compressor->finish();
      bytes = im.compressor->bytes_sent(), bytes_f32 = im.compressor->bytes_uncompressed();
    }
    for (auto& b : im.buckets) {
      if (sharded) break;
      if (im.compressor) break;
      im.wait_result(b.work);
      Tensor& buf = im.opts.deterministic ? b.accum : b.flat;
      if (im.opts.deterministic) scale(buf, factor);  // else averaged in the all-reduce
      if (im.opts.deterministic) b.flat.copy_(b.accum);
      bytes += static_cast<int64_t>(buf.nbytes());
      bytes_f32 += static_cast<int64_t>(buf.nbytes());
    }
  } catch (...) {
    im.wait_all_quietly();
    im.reset_step_state();
    throw;
  }
  const auto t1 = Clock::now();
  im.stats.exposed_comm_ms = im.communicates() ? ms_between(t0, t1) : 0.0;
  im.stats.comm_ms = im.communicates() && im.any_launched ? ms_between(im.first_launch, t1) : 0.0;
  im.stats.buckets = static_cast<int64_t>(im.buckets.size());
  im.stats.bytes = im.communicates() ? bytes : 0;
  im.stats.bytes_uncompressed = im.communicates() ? (sharded ? bytes : bytes_f32) : 0;
  im.reset_step_state();
  ++im.syncs;
  if (im.recording) {
    im.recording = false;
    if (im.opts.reorder_buckets && im.communicates()) im.rebuild_pending = true;
  }
  // In deterministic mode the accumulators are zeroed by the next zero_grad(); .grad holds
  // the result.
  for (auto& p : im.params) p.passes = 0;
}

std::vector<ShardPiece> DistributedDataParallel::shard_pieces() const {
  const Impl& im = *impl_;
  std::vector<ShardPiece> out;
  if (im.opts.zero_stage == 0) return out;
  for (const auto& b : im.buckets)
    for (int i : b.params) {
      const auto& p = im.params[i];
      const auto own = detail::owned_range(p.offset, p.param.numel(), im.rank, b.shard_len);
      if (own.count == 0) continue;
      out.push_back({p.name, p.param.view({-1}).narrow(0, own.begin, own.count), b.shard.narrow(0, own.at, own.count),
                     own.begin, p.param.shape()});
    }
  return out;
}

void DistributedDataParallel::allgather_parameters() {
  Impl& im = *impl_;
  PT_CHECK(im.opts.zero_stage > 0, "allgather_parameters() needs zero_stage 1 or 2");
  if (!im.communicates()) return;
  // Per bucket: pack this rank's block of the parameters, all-gather the blocks, copy them
  // back into every parameter. At most two buckets in flight, so the staging memory stays
  // about two buckets.
  struct InFlight {
    int bucket;
    Tensor send, all;
    comm::WorkPtr work;
  };
  std::vector<InFlight> q;
  auto unpack = [&](InFlight& f) {
    im.wait_result(f.work);
    for (int i : im.buckets[f.bucket].params) {
      auto& p = im.params[i];
      p.param.view({-1}).copy_(f.all.narrow(0, p.offset, p.param.numel()));
    }
  };
  try {
    for (int bi = 0; bi < static_cast<int>(im.buckets.size()); ++bi) {
      const auto& b = im.buckets[bi];
      InFlight f{bi, Tensor::zeros({b.shard_len}, DType::F32, im.device),
                 Tensor::empty({b.shard_len * im.world}, DType::F32, im.device), nullptr};
      for (int i : b.params) {
        const auto& p = im.params[i];
        const auto own = detail::owned_range(p.offset, p.param.numel(), im.rank, b.shard_len);
        if (own.count > 0) f.send.narrow(0, own.at, own.count).copy_(p.param.view({-1}).narrow(0, own.begin, own.count));
      }
      f.work = im.pg->allgather(f.send.data_ptr(), f.all.data_ptr(), static_cast<size_t>(b.shard_len), DType::F32);
      q.push_back(std::move(f));
      if (q.size() == 2) {
        unpack(q.front());
        q.erase(q.begin());
      }
    }
    for (auto& f : q) unpack(f);
  } catch (...) {
    for (auto& f : q) {  // the buffers must outlive the calls that use them
      try {
        wait_work(f.work, im.opts.timeout_s);
      } catch (const std::exception&) {
      }
    }
    throw;
  }
}

const std::shared_ptr<comm::ProcessGroup>& DistributedDataParallel::process_group() const { return impl_->pg; }

int DistributedDataParallel::zero_stage() const { return impl_->opts.zero_stage; }

int64_t DistributedDataParallel::gradient_bytes() const {
  int64_t n = 0;
  for (const auto& b : impl_->buckets)
    n += static_cast<int64_t>(b.flat.nbytes() + b.accum.nbytes() + b.shard.nbytes());
  return n;
}

}  // namespace paratrain::parallel
