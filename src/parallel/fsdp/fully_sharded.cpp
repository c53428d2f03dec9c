// FullyShardedDataParallel (fsdp.h): units of parameters that live as shards and are
// gathered around their forward and backward.
//
// A unit moves between three states: Sharded (its parameters' storages point at nothing),
// Gathering (an all-gather of every rank's shard into `flat` is in flight) and Gathered (the
// parameters point into `flat`). ensure_gathered() waits (that wait is the exposed gather
// time); prefetch() only issues. Backward: the identity recorded on a unit's output runs
// before the unit's own backward nodes (on_pre_backward: gather again, bind .grad to a zeroed
// flat gradient buffer); the grad-ready hooks count the unit's parameters down
// (on_ready) and, when the pass is done with the unit, free its parameters and, in the
// synchronised pass, launch the reduce-scatters in the fixed order. A reduce-scatter's input
// buffer is kept until it completes (at most two in flight).
//
// Every buffer lives on the parameters' device. On a GPU (nccl) the waits for a gather or a
// reduce-scatter only order the compute stream after it (Work::wait_on_device): the host goes
// on queueing, and a buffer freed afterwards is reused in compute-stream order, after the
// collective. The copies and the arithmetic are the dispatch-table kernels there; on the CPU
// the same bytes move by the same host loops as before.
#include "paratrain/parallel/fsdp.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <sstream>
#include <unordered_map>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"
#include "parallel/flat_ops.h"
#include "parallel/same_model.h"

namespace paratrain::parallel {

using detail::move_add;
using detail::owned_range;
using detail::scale;
using detail::wait_work;
using detail::wait_work_on;

using detail::Clock;
using detail::ms_between;

struct FullyShardedDataParallel::Impl : std::enable_shared_from_this<FullyShardedDataParallel::Impl> {
  struct Param {
    std::string name;
    Tensor param;
    int unit = -1;
    int64_t offset = 0;  // first element in its unit's flat buffer
    Tensor grad_view, accum_view;
    bool ready = false;  // its gradient is final in the synchronised pass
    int64_t passes = 0;  // backward passes that reached it since zero_grad (deterministic)
  };
  enum class State { Sharded, Gathering, Gathered };
  struct Unit {
    std::string label;  // "unit i" or "root", for messages
    std::vector<int> params;
    int64_t shard_len = 0;  // block length; flat buffers hold world x shard_len
    Tensor shard;           // this rank's parameter block [shard_len]
    Tensor grad_shard;      // this rank's block of the reduced gradient [shard_len]
    State state = State::Sharded;
    Tensor flat;  // the gathered parameters while not Sharded
    comm::WorkPtr gather;
    Tensor send_half, flat_half;         // comm_dtype bf16/f16: this rank's block and the gathered blocks
    Tensor grad_half, grad_shard_half;   // ... and the gradient's, for the reduce-scatter
    Tensor grad_flat, grad_accum;  // full gradient buffers, from its first backward to its reduce-scatter
    comm::WorkPtr rs;
    int pass_pending = 0;  // parameters still to be final in this backward pass
    bool complete = false, launched = false;
  };
  // One collective of the step, in issue order (the group runs them one after the other).
  struct Issued {
    bool gather;
    Clock::time_point at;
    comm::WorkPtr work;
  };

  std::shared_ptr<comm::ProcessGroup> pg;
  FsdpOptions opts;
  DeviceSpec device{Device::CPU, -1};  // every parameter's, so every buffer's
  int rank = 0, world = 1;
  std::vector<Param> params;
  std::vector<Unit> units;  // the caller's units in forward order, then the root unit
  std::vector<int> launch_order;
  size_t next_launch = 0;
  std::deque<int> rs_in_flight;
  bool no_sync = false;
  std::vector<Issued> issued;
  FsdpStepStats stats;
  int64_t gathered_units = 0, gathered_bytes = 0;

  bool communicates() const { return pg && world > 1; }
  bool on_gpu() const { return device.kind == Device::CUDA; }
  Tensor buffer(int64_t n, DType dtype = DType::F32) const { return Tensor::empty({n}, dtype, device); }
  Tensor zeros(int64_t n) const { return Tensor::zeros({n}, DType::F32, device); }
  // Parameters gathered and gradients reduce-scattered in a 16-bit type (options.comm_dtype).
  bool half_comm() const { return communicates() && opts.comm_dtype != DType::F32; }
  int64_t comm_bytes(const Unit& u) const {
    return u.shard_len * world * static_cast<int64_t>(half_comm() ? 2 : sizeof(float));
  }
  void cast_from_f32(Tensor& out, const Tensor& in) const {
    kernels::registry().cast_from_f32.at(device.kind, opts.comm_dtype)(out.data_ptr(), in.data_ptr(), in.numel());
  }
  void cast_to_f32(Tensor& out, const Tensor& in) const {
    kernels::registry().cast_to_f32.at(device.kind, opts.comm_dtype)(out.data_ptr(), in.data_ptr(), in.numel());
  }
  int root() const { return static_cast<int>(units.size()) - 1; }
  int64_t unit_bytes(const Unit& u) const { return u.shard_len * world * static_cast<int64_t>(sizeof(float)); }

  void note_issued(bool gather, const comm::WorkPtr& w) {
    if (w) issued.push_back({gather, Clock::now(), w});
  }

  // ---- parameters ----
  void prefetch(int u) {
    Unit& un = units[u];
    if (un.state != State::Sharded) return;
    un.flat = buffer(un.shard_len * world);
    if (half_comm()) {  // the shard rounded to the 16-bit type travels; every rank gets the same values
      un.send_half = buffer(un.shard_len, opts.comm_dtype);
      un.flat_half = buffer(un.shard_len * world, opts.comm_dtype);
      cast_from_f32(un.send_half, un.shard);
      un.gather = pg->allgather(un.send_half.data_ptr(), un.flat_half.data_ptr(), static_cast<size_t>(un.shard_len),
                                opts.comm_dtype);
    } else if (communicates()) {
      un.gather = pg->allgather(un.shard.data_ptr(), un.flat.data_ptr(), static_cast<size_t>(un.shard_len), DType::F32);
    }
    if (communicates()) {
      note_issued(true, un.gather);
      stats.gathers++;
      stats.gather_bytes += comm_bytes(un);
    } else {
      un.flat.copy_(un.shard);
    }
    un.state = State::Gathering;
    gathered_units++;
    gathered_bytes += unit_bytes(un);
    stats.peak_gathered_units = std::max(stats.peak_gathered_units, gathered_units);
    stats.peak_gathered_bytes = std::max(stats.peak_gathered_bytes, gathered_bytes);
  }

  void ensure_gathered(int u) {
    Unit& un = units[u];
    if (un.state == State::Gathered) return;
    prefetch(u);
    if (un.gather) {
      const auto t0 = Clock::now();
      wait_work_on(un.gather, opts.timeout_s, on_gpu());
      stats.gather_exposed_ms += ms_between(t0, Clock::now());
      un.gather.reset();
    }
    if (un.flat_half.defined()) {
      cast_to_f32(un.flat, un.flat_half);
      un.flat_half = Tensor(), un.send_half = Tensor();
    }
    auto* base = static_cast<char*>(un.flat.data_ptr());
    for (int i : un.params)
      params[i].param.storage()->rebind(base + params[i].offset * static_cast<int64_t>(sizeof(float)));
    un.state = State::Gathered;
  }

  void release(int u) {
    Unit& un = units[u];
    if (un.state == State::Sharded) return;
    if (un.gather) un.gather->wait_ignoring_failure();  // its buffer must outlive the call
    un.gather.reset();
    for (int i : un.params) params[i].param.storage()->rebind(nullptr);
    un.flat = Tensor(), un.flat_half = Tensor(), un.send_half = Tensor();
    un.state = State::Sharded;
    gathered_units--;
    gathered_bytes -= unit_bytes(un);
  }

  // The units after `u` in forward order (the first block after the root), up to opts.prefetch.
  void prefetch_forward(int u) {
    const int L = root();
    for (int k = 1, next = (u == L ? 0 : u + 1); k <= opts.prefetch && next < L; ++k, ++next) prefetch(next);
  }
  // The units before `u` in forward order (the last block before the root's backward).
  void prefetch_backward(int u) {
    for (int k = 1, prev = (u == root() ? root() - 1 : u - 1); k <= opts.prefetch && prev >= 0; ++k, --prev)
      prefetch(prev);
  }

  // ---- forward ----
  Tensor run_unit(int u, const Tensor& x, const nn::Module::ForwardBody& body) {
    const bool is_root = u == root();
    if (is_root) prefetch(u);  // issue the root, then the first block behind it
    prefetch_forward(u);
    ensure_gathered(u);
    Tensor y = body(x);
    const bool graph = autograd::grad_enabled() && y.defined() && y.requires_grad();
    if (graph) y = with_pre_backward(u, y);
    // The root stays gathered until its gradients are reduced; a block until its backward
    // only without reshard_after_forward.
    if (!graph || (!is_root && opts.reshard_after_forward)) release(u);
    return y;
  }

  Tensor with_pre_backward(int u, const Tensor& y);

  // ---- backward ----
  void on_pre_backward(int u) {
    Unit& un = units[u];
    ensure_gathered(u);
    prefetch_backward(u);
    if (!un.grad_flat.defined()) {
      un.grad_flat = zeros(un.shard_len * world);
      if (opts.deterministic) un.grad_accum = zeros(un.shard_len * world);
      for (int i : un.params) {
        Param& p = params[i];
        p.grad_view = un.grad_flat.narrow(0, p.offset, p.param.numel()).view(p.param.shape());
        if (opts.deterministic) p.accum_view = un.grad_accum.narrow(0, p.offset, p.param.numel()).view(p.param.shape());
        p.param.set_grad(p.grad_view);
      }
    }
    un.pass_pending = static_cast<int>(un.params.size());
  }

  void on_ready(int i, Tensor& grad) {
    Param& p = params[i];
    Unit& un = units[p.unit];
    if (!grad.defined()) return;
    PT_CHECK(p.grad_view.defined(), "FullyShardedDataParallel: ", p.name,
             " got a gradient before its unit's backward began (was it used outside its unit's forward?)");
    if (grad.data_ptr() != p.grad_view.data_ptr()) {  // .grad was replaced: fold it in (as DDP)
      p.grad_view.copy_(grad);
      grad = p.grad_view;
    }
    if (opts.deterministic) {
      move_add(p.accum_view, p.grad_view);
      p.passes++;
    }
    if (!no_sync) {
      if (p.ready)
        PT_THROW(InputError, "FullyShardedDataParallel: parameter ", p.name,
                 " received a gradient twice in one synchronised step (call backward once per step outside "
                 "no_sync(), then finish())");
      p.ready = true;
    }
    if (--un.pass_pending > 0) return;
    // The pass is done with this unit: its parameters are not needed again until the next
    // forward. In the synchronised pass its gradient is complete.
    if (!no_sync) {
      un.complete = true;
      launch_ready();  // frees the launched units
    } else {
      release(p.unit);
    }
  }

  void launch_ready() {
    while (next_launch < launch_order.size() && units[launch_order[next_launch]].complete)
      launch(launch_order[next_launch++]);
  }

  void launch(int u) {
    Unit& un = units[u];
    un.launched = true;
    release(u);
    Tensor& in = opts.deterministic ? un.grad_accum : un.grad_flat;
    if (half_comm()) {  // as DDP's --compress bf16|fp16: the mean's terms, cast, summed in the 16-bit type
      scale(in, 1.0f / static_cast<float>(world));
      un.grad_half = buffer(in.numel(), opts.comm_dtype);
      un.grad_shard_half = buffer(un.shard_len, opts.comm_dtype);
      cast_from_f32(un.grad_half, in);
      un.rs = pg->reduce_scatter(un.grad_half.data_ptr(), un.grad_shard_half.data_ptr(),
                                 static_cast<size_t>(un.shard_len), opts.comm_dtype, comm::ReduceOp::kSum);
    } else if (communicates()) {
      un.rs = pg->reduce_scatter(in.data_ptr(), un.grad_shard.data_ptr(), static_cast<size_t>(un.shard_len),
                                 DType::F32, comm::ReduceOp::kSum);
    }
    if (communicates()) {
      note_issued(false, un.rs);
      stats.reduce_scatters++;
      stats.reduce_scatter_bytes += comm_bytes(un);
    } else {
      un.grad_shard.copy_(in.narrow(0, rank * un.shard_len, un.shard_len));
    }
    rs_in_flight.push_back(u);
    while (rs_in_flight.size() > 2) retire_front();
  }

  // Waits for the oldest reduce-scatter and drops its full gradient buffers.
  void retire_front() {
    Unit& un = units[rs_in_flight.front()];
    rs_in_flight.pop_front();
    if (un.rs) {
      const auto t0 = Clock::now();
      wait_work_on(un.rs, opts.timeout_s, on_gpu());
      stats.reduce_scatter_exposed_ms += ms_between(t0, Clock::now());
      un.rs.reset();
    }
    if (un.grad_shard_half.defined()) {
      cast_to_f32(un.grad_shard, un.grad_shard_half);
      un.grad_half = Tensor(), un.grad_shard_half = Tensor();
    }
    drop_gradients(un);
  }

  void drop_gradients(Unit& un) {
    for (int i : un.params) {
      params[i].grad_view = Tensor();
      params[i].accum_view = Tensor();
      params[i].param.set_grad(Tensor());
    }
    un.grad_flat = Tensor();
    un.grad_accum = Tensor();
  }

  // Waits for everything in flight and returns every unit to Sharded, without gradients.
  void reset() {
    for (auto& un : units) {
      if (un.rs) un.rs->wait_ignoring_failure();
      un.rs.reset();
    }
    rs_in_flight.clear();
    for (int u = 0; u < static_cast<int>(units.size()); ++u) {
      release(u);
      drop_gradients(units[u]);
      units[u].complete = units[u].launched = false;
    }
    for (auto& p : params) p.ready = false, p.passes = 0;
    next_launch = 0;
  }

  // Busy time of each collective of the step: the group runs them in issue order, so one
  // starts when it was issued or when the one before it finished, whichever is later. On a
  // GPU only the collectives the host has seen complete count (the others were waited for on
  // the device).
  void account_busy_time() {
    Clock::time_point prev{};
    for (const auto& c : issued) {
      if (!c.work->is_completed()) continue;
      const auto fin = c.work->finished_at();
      const double ms = ms_between(std::max(c.at, prev), fin);
      (c.gather ? stats.gather_ms : stats.reduce_scatter_ms) += std::max(0.0, ms);
      prev = std::max(prev, fin);
    }
    issued.clear();
  }
};

Tensor FullyShardedDataParallel::Impl::with_pre_backward(int u, const Tensor& y) {
  Tensor out = y.detach();
  std::weak_ptr<Impl> weak = weak_from_this();
  autograd::record(std::make_shared<autograd::LambdaNode>("fsdp_pre_backward",
                                                          [weak, u](std::vector<Tensor>& g) {
                                                            if (auto im = weak.lock()) im->on_pre_backward(u);
                                                            return std::vector<Tensor>{g[0]};
                                                          }),
                   {&y}, {&out});
  return out;
}

FullyShardedDataParallel::FullyShardedDataParallel(nn::Module& root, const std::vector<nn::Module*>& unit_modules,
                                                   std::shared_ptr<comm::ProcessGroup> pg, FsdpOptions options)
    : root_(root), impl_(std::make_shared<Impl>()) {
  Impl& im = *impl_;
  im.pg = std::move(pg);
  im.opts = options;
  if (options.prefetch < 0) PT_THROW(InputError, "FullyShardedDataParallel: prefetch must be 0 or more, got ", options.prefetch);
  if (options.comm_dtype != DType::F32 && options.comm_dtype != DType::BF16 && options.comm_dtype != DType::F16)
    PT_THROW(InputError, "FullyShardedDataParallel: comm_dtype must be f32, bf16 or f16, got ", dtype_name(options.comm_dtype));
  if (options.comm_dtype != DType::F32 && options.deterministic)
    PT_THROW(InputError, "FullyShardedDataParallel: a 16-bit comm_dtype cannot be combined with deterministic mode "
             "(rounded parameters and gradients are not bit-identical to plain data parallelism)");
  if (im.pg) {
    im.rank = im.pg->rank();
    im.world = im.pg->size();
    if (options.deterministic && im.world > 1 && !im.pg->options().deterministic)
      PT_THROW(InputError,
               "FullyShardedDataParallel: deterministic mode needs a process group created with the deterministic "
               "(rank-ordered) option");
  }
  if (!root.supports_forward_wrappers())
    PT_THROW(InputError, "FullyShardedDataParallel: the root module's forward does not run forward wrappers");
  std::unordered_map<const Storage*, int> by_storage;
  for (auto& [name, t] : root.named_parameters()) {
    if (!t.requires_grad())
      PT_THROW(InputError, "FullyShardedDataParallel: parameter ", name, " does not require a gradient; only trainable parameters can be sharded");
    if (im.params.empty()) im.device = t.device_spec();
    if (t.device_spec() != im.device)
      PT_THROW(InputError, "FullyShardedDataParallel: parameter ", name, " is on ", t.device_spec().str(), " but ",
               im.params.front().name, " is on ", im.device.str(), " (move the whole model with Module::to first)");
    if (t.dtype() != DType::F32)
      PT_THROW(InputError, "FullyShardedDataParallel: parameter ", name, " is ", dtype_name(t.dtype()), "; shards hold f32 parameters only");
    if (!t.is_contiguous() || t.data_ptr() != t.storage()->data() || t.storage()->nbytes() != t.nbytes())
      PT_THROW(InputError, "FullyShardedDataParallel: parameter ", name, " must be contiguous and own its whole storage");
    if (by_storage.count(t.storage().get()))
      PT_THROW(InputError, "FullyShardedDataParallel: parameter ", name, " shares its storage with another parameter");
    by_storage[t.storage().get()] = static_cast<int>(im.params.size());
    Impl::Param p;
    p.name = name;
    p.param = t;
    im.params.push_back(std::move(p));
  }
  // ---- units: the caller's, then the root unit with every parameter left ----
  im.units.resize(unit_modules.size() + 1);
  for (size_t u = 0; u < unit_modules.size(); ++u) {
    nn::Module* m = unit_modules[u];
    Impl::Unit& un = im.units[u];
    un.label = "unit " + std::to_string(u);
    if (!m || !m->supports_forward_wrappers())
      PT_THROW(InputError, "FullyShardedDataParallel: ", un.label, "'s forward does not run forward wrappers");
    for (auto& [name, t] : m->named_parameters()) {
      auto it = by_storage.find(t.storage().get());
      if (it == by_storage.end())
        PT_THROW(InputError, "FullyShardedDataParallel: ", un.label, " (parameter ", name, ") is not inside the root module");
      Impl::Param& p = im.params[it->second];
      if (p.unit >= 0)
        PT_THROW(InputError, "FullyShardedDataParallel: parameter ", p.name, " is in two units (", im.units[p.unit].label, " and ", un.label, ")");
      p.unit = static_cast<int>(u);
      un.params.push_back(it->second);
    }
    if (un.params.empty()) PT_THROW(InputError, "FullyShardedDataParallel: ", un.label, " has no parameters");
  }
  const int L = im.root();
  im.units[L].label = "root";
  for (int i = 0; i < static_cast<int>(im.params.size()); ++i)
    if (im.params[i].unit < 0) im.params[i].unit = L, im.units[L].params.push_back(i);
  for (auto& un : im.units) std::sort(un.params.begin(), un.params.end());  // registration order

  if (im.communicates()) {
    std::vector<std::pair<std::string, Tensor>> named;
    for (const auto& p : im.params) named.emplace_back(p.name, p.param);
    detail::check_same_model(*im.pg, named, "FullyShardedDataParallel");
  }
  // ---- shards: lay each unit out flat, take rank 0's values, keep this rank's block ----
  for (auto& un : im.units) {
    int64_t total = 0;
    for (int i : un.params) im.params[i].offset = total, total += im.params[i].param.numel();
    un.shard_len = std::max<int64_t>(1, (total + im.world - 1) / im.world);
    Tensor flat = im.zeros(un.shard_len * im.world);
    for (int i : un.params) {
      const Tensor& t = im.params[i].param;
      flat.narrow(0, im.params[i].offset, t.numel()).copy_(t.view({t.numel()}));
    }
    if (im.communicates() && options.broadcast_parameters)
      wait_work(im.pg->broadcast(flat.data_ptr(), static_cast<size_t>(flat.numel()), DType::F32, 0), options.timeout_s);
    un.shard = flat.narrow(0, im.rank * un.shard_len, un.shard_len).clone();
    un.grad_shard = im.zeros(un.shard_len);
  }
  for (auto& p : im.params) p.param.storage()->rebind(nullptr);
  for (int u = L - 1; u >= 0; --u) im.launch_order.push_back(u);
  im.launch_order.push_back(L);  // blocks last to first, then the root

  // ---- wrappers and hooks ----
  std::weak_ptr<Impl> weak = impl_;
  auto wrapper = [weak](int u) {
    return [weak, u](const Tensor& x, const nn::Module::ForwardBody& body) {
      auto im = weak.lock();
      return im ? im->run_unit(u, x, body) : body(x);
    };
  };
  for (size_t u = 0; u < unit_modules.size(); ++u) unit_modules[u]->add_forward_wrapper(wrapper(static_cast<int>(u)));
  root.add_forward_wrapper(wrapper(L));
  units_ = unit_modules;
  for (int i = 0; i < static_cast<int>(im.params.size()); ++i)
    autograd::register_grad_ready_hook(im.params[i].param, [weak, i](Tensor& g) {
      if (auto p = weak.lock()) p->on_ready(i, g);
    });
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  if (!impl_) return;
  impl_->reset();
  for (nn::Module* m : units_) m->clear_forward_wrappers();
  root_.clear_forward_wrappers();
}

int FullyShardedDataParallel::rank() const { return impl_->rank; }
int FullyShardedDataParallel::world_size() const { return impl_->world; }
const FsdpOptions& FullyShardedDataParallel::options() const { return impl_->opts; }
const FsdpStepStats& FullyShardedDataParallel::last_stats() const { return impl_->stats; }
int64_t FullyShardedDataParallel::num_units() const { return static_cast<int64_t>(impl_->units.size()); }
const std::shared_ptr<comm::ProcessGroup>& FullyShardedDataParallel::process_group() const { return impl_->pg; }

float FullyShardedDataParallel::backward_seed(int64_t grad_accum) const {
  PT_CHECK(grad_accum >= 1, "grad_accum must be at least 1");
  return impl_->opts.deterministic ? 1.0f : 1.0f / static_cast<float>(grad_accum);
}

void FullyShardedDataParallel::zero_grad() {
  Impl& im = *impl_;
  im.reset();
  im.stats = FsdpStepStats();
  im.issued.clear();
}

FullyShardedDataParallel::NoSync FullyShardedDataParallel::no_sync() { return NoSync(impl_->no_sync); }

void FullyShardedDataParallel::finish() {
  Impl& im = *impl_;
  if (im.next_launch != im.launch_order.size()) {
    std::vector<std::string> missing;
    for (const auto& p : im.params)
      if (!p.ready) missing.push_back(p.name);
    const size_t n_missing = missing.size();
    im.reset();
    PT_THROW(InputError, "FullyShardedDataParallel (rank ", im.rank, "): ", n_missing,
             " parameter(s) received no gradient in this step: ", detail::name_list(missing),
             ". Their units can never be reduced (every parameter must take part in each step)");
  }
  int64_t micro = 1;
  if (im.opts.deterministic)
    for (const auto& p : im.params) micro = std::max(micro, p.passes);
  const float factor = im.opts.deterministic ? 1.0f / static_cast<float>(micro * im.world)
                                             : 1.0f / static_cast<float>(im.world);
  try {
    while (!im.rs_in_flight.empty()) im.retire_front();
  } catch (...) {
    im.reset();
    throw;
  }
  for (auto& un : im.units)  // (16-bit communication averaged before the cast)
    if ((im.opts.deterministic || im.world > 1) && !im.half_comm()) scale(un.grad_shard, factor);
  im.account_busy_time();
  im.reset();  // every reduce-scatter has completed: frees what is still gathered, clears the step's flags
}

std::vector<ShardPiece> FullyShardedDataParallel::shard_pieces() const {
  const Impl& im = *impl_;
  std::vector<ShardPiece> out;
  for (const auto& un : im.units)
    for (int i : un.params) {
      const auto& p = im.params[i];
      const auto own = owned_range(p.offset, p.param.numel(), im.rank, un.shard_len);
      if (own.count == 0) continue;
      out.push_back({p.name, un.shard.narrow(0, own.at, own.count), un.grad_shard.narrow(0, own.at, own.count),
                     own.begin, p.param.shape()});
    }
  return out;
}

std::map<std::string, Tensor> FullyShardedDataParallel::parameter_pieces() const {
  std::map<std::string, Tensor> out;
  for (auto& piece : shard_pieces()) out[piece.name] = piece.param;
  return out;
}

void FullyShardedDataParallel::load_full_state(const std::map<std::string, Tensor>& state) {
  Impl& im = *impl_;
  for (const auto& p : im.params) {
    auto it = state.find(p.name);
    if (it == state.end()) PT_THROW(InputError, "FullyShardedDataParallel: the state has no tensor '", p.name, "'");
    if (it->second.shape() != p.param.shape() || it->second.dtype() != DType::F32)
      PT_THROW(InputError, "FullyShardedDataParallel: tensor '", p.name, "' is ", dtype_name(it->second.dtype()), " ",
               shape_str(it->second.shape()), ", the parameter f32 ", shape_str(p.param.shape()));
  }
  for (auto& piece : shard_pieces()) {
    const Tensor& whole = state.at(piece.name);
    piece.param.copy_(whole.contiguous().view({whole.numel()}).narrow(0, piece.begin, piece.param.numel()));
  }
}

std::map<std::string, Tensor> FullyShardedDataParallel::full_state() {
  Impl& im = *impl_;
  std::map<std::string, Tensor> out;
  for (int u = 0; u < static_cast<int>(im.units.size()); ++u) {
    const bool was = im.units[u].state != Impl::State::Sharded;
    im.ensure_gathered(u);
    for (int i : im.units[u].params) out[im.params[i].name] = im.params[i].param.clone();
    if (!was) im.release(u);
  }
  return out;
}

FsdpMemory FullyShardedDataParallel::memory() const {
  const Impl& im = *impl_;
  FsdpMemory m;
  for (const auto& un : im.units) {
    m.parameter_shard_bytes += static_cast<int64_t>(un.shard.nbytes());
    m.gradient_shard_bytes += static_cast<int64_t>(un.grad_shard.nbytes());
    m.largest_unit_bytes = std::max(m.largest_unit_bytes, im.unit_bytes(un));
    for (const Tensor* t : {&un.grad_flat, &un.grad_accum})
      if (t->defined()) m.gradient_bytes += static_cast<int64_t>(t->nbytes());
  }
  for (const auto& p : im.params) m.parameter_bytes += static_cast<int64_t>(p.param.nbytes());
  m.gathered_bytes = im.gathered_bytes;
  m.gradient_bytes += m.gradient_shard_bytes;
  return m;
}

int64_t FullyShardedDataParallel::gradient_bytes() const { return memory().gradient_bytes; }

}  // namespace paratrain::parallel
