#include "comm/transport_process_group.h"

#include <cstring>

#include "paratrain/base/env.h"
#include "paratrain/base/log.h"

namespace paratrain::comm {

ProcessGroupOptions resolve_options(const ProcessGroupOptions& in) {
  ProcessGroupOptions o = in;
  if (o.backend.empty()) o.backend = env::get_string("PARATRAIN_BACKEND");
  if (o.backend.empty()) o.backend = "auto";
  if (o.backend != "auto" && o.backend != "shm" && o.backend != "tcp" && o.backend != "mpi" && o.backend != "nccl")
    PT_THROW(InputError, "unknown communication backend '", o.backend, "' (auto, shm, tcp, mpi, nccl)");
  if (o.timeout_s <= 0) o.timeout_s = env::get_double("PARATRAIN_COMM_TIMEOUT_S");
  if (o.peer_timeout_s <= 0) o.peer_timeout_s = env::get_double("PARATRAIN_PEER_TIMEOUT_S");
  if (o.segment_bytes == 0) o.segment_bytes = static_cast<size_t>(env::get_int("PARATRAIN_SEGMENT_BYTES"));
  if (o.segment_bytes == 0) o.segment_bytes = 512u << 10;
  o.segment_bytes = (std::max<size_t>(o.segment_bytes, 64) + 63) / 64 * 64;
  if (o.shm_staging_bytes == 0) o.shm_staging_bytes = static_cast<size_t>(env::get_int("PARATRAIN_SHM_STAGING_BYTES"));
  if (o.tcp_streams <= 0) o.tcp_streams = static_cast<int>(env::get_int("PARATRAIN_TCP_STREAMS"));
  if (!o.debug_fingerprint) o.debug_fingerprint = env::get_string("PARATRAIN_DEBUG") == "detail";
  if (o.small_message_bytes == 0) o.small_message_bytes = 64u << 10;
  return o;
}

TransportProcessGroup::TransportProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                             const ProcessGroupOptions& options, std::vector<int> global_ranks,
                                             std::string name)
    : store_(std::move(store)), recorder_(&FlightRecorder::instance()), global_ranks_(std::move(global_ranks)) {
  if (size < 1 || rank < 0 || rank >= size) PT_THROW(InputError, "bad rank ", rank, " for a group of size ", size);
  rank_ = rank;
  size_ = size;
  options_ = resolve_options(options);
  TransportConfig tc;
  tc.backend = options_.backend == "mpi" ? "auto" : options_.backend;
  tc.shm.staging_bytes = options_.shm_staging_bytes;
  tc.shm.slot_bytes = std::min(options_.segment_bytes, options_.shm_staging_bytes / 4);
  tc.shm.peer_timeout_s = options_.peer_timeout_s;
  tc.tcp.streams = options_.tcp_streams;
  tc.tcp.slot_bytes = tc.shm.slot_bytes;
  tc.tcp.peer_timeout_s = options_.peer_timeout_s;
  tc.tcp.slots = std::max<size_t>(4, options_.shm_staging_bytes / std::max<size_t>(tc.shm.slot_bytes, 4096));
  transport_ = create_transport(*store_, rank, size, tc, Deadline::after_seconds(options_.timeout_s));
  // send/recv get pairs of their own, so a message in flight never sits between two
  // collectives on a channel (p2p.h).
  PrefixStore p2p_store("p2p", store_);
  p2p_transport_ = create_transport(p2p_store, rank, size, tc, Deadline::after_seconds(options_.timeout_s));
  // Ranks leave initialisation together (the store keys of this group are then all used).
  store_->add("init_done", 1);
  store_->set("init_done/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("init_done/" + std::to_string(r));
  store_->wait(keys, std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
  if (global_ranks_.empty())
    for (int r = 0; r < size; ++r) global_ranks_.push_back(r);
  record_group_ = recorder_->add_group(name, transport_->name(), rank, size, global_ranks_);
  if (const FlightGroup* g = recorder_->group(record_group_)) name_ = g->name;
  PT_LOG_DEBUG(kComm, "process group ", name_, " ready: backend ", transport_->name(), ", rank ", rank, " of ", size,
               size == 1 ? "" : ", every rank met at the store");
  engine_ = std::make_unique<Engine>();
  p2p_ = std::make_unique<P2pEngine>(p2p_transport_.get(), options_.timeout_s,
                                     [this](const std::string& why) { engine_->set_broken(why); });
}

TransportProcessGroup::~TransportProcessGroup() {
  // Run everything queued (so every send/recv is started), let p2p_ finish them (each has
  // its deadline; a failure marks the engine, which is still there), then stop both.
  try {
    engine_->submit("drain", [] {})->wait();
  } catch (const std::exception&) {
  }
  p2p_.reset();
  engine_.reset();
}

std::string TransportProcessGroup::describe(const Call& c, uint64_t seq) {
  std::string s = detail::concat(op_type_name(c.op), " #", seq);
  if (c.op == OpType::kBarrier) return s;
  s += detail::concat(" (", dtype_name(c.dtype), " x ", c.count, ", ", c.count * dtype_size(c.dtype), " bytes");
  if (c.op == OpType::kAllreduce || c.op == OpType::kReduce || c.op == OpType::kReduceScatter)
    s += detail::concat(", ", reduce_op_name(c.reduce_op));
  if (c.op == OpType::kBroadcast || c.op == OpType::kReduce) s += detail::concat(", root ", c.root);
  if (c.op == OpType::kSend) s += detail::concat(", to rank ", c.root, ", tag ", c.tag);
  if (c.op == OpType::kRecv) s += detail::concat(", from rank ", c.root, ", tag ", c.tag);
  return s + ")";
}

namespace {
struct Fingerprint {
  uint64_t seq;
  uint64_t count;
  int32_t root;
  uint8_t op, dtype, reduce_op, pad;
};
static_assert(sizeof(Fingerprint) == 24);
}  // namespace

void TransportProcessGroup::check_fingerprint(algorithms::Context& ctx, const Call& c, uint64_t seq) {
  Fingerprint mine{seq, c.count, c.root, uint8_t(c.op), uint8_t(c.dtype), uint8_t(c.reduce_op), 0};
  std::vector<Fingerprint> all(size_);
  algorithms::allgather_ring(ctx, &mine, all.data(), sizeof(Fingerprint), DType::U8);
  auto show = [&](int r, const Fingerprint& f) {
    Call o{OpType(f.op), DType(f.dtype), f.count, f.root, ReduceOp(f.reduce_op)};
    return detail::concat("rank ", r, " called ", describe(o, f.seq));
  };
  for (int r = 0; r < size_; ++r)
    if (std::memcmp(&all[r], &mine, sizeof(Fingerprint)) != 0)
      PT_THROW(CommError, "collective mismatch (PARATRAIN_DEBUG=detail): ", show(rank_, mine), " but ",
               show(r, all[r]));
}

void TransportProcessGroup::check_dtype(const Call& call) {
  if (call.op != OpType::kBarrier && call.dtype != DType::F32 && call.dtype != DType::BF16 && call.dtype != DType::F16 && call.dtype != DType::I32 &&
      call.dtype != DType::I64)
    PT_THROW(InputError, op_type_name(call.op), ": dtype ", dtype_name(call.dtype),
             " is not supported (f32, bf16, f16, i32, i64)");
}

WorkPtr TransportProcessGroup::submit_p2p(const Call& call, const void* buf) {
  check_dtype(call);
  uint64_t seq = seq_++;
  auto work = std::make_shared<Work>(std::function<std::string()>([call, seq] { return describe(call, seq); }));
  const uint64_t rec = recorder_->record(record_group_, seq, call.op, call.dtype, call.count, call.reduce_op,
                                         call.root, call.tag);
  if (rec) work->set_record(recorder_, rec);
  return engine_->submit_deferred(std::move(work),
                                  [this, call, buf, rec](const WorkPtr& w) {
                                    recorder_->started(rec);
                                    if (call.op == OpType::kSend)
                                      p2p_->post_send(w, buf, call.count, call.dtype, call.root, call.tag);
                                    else
                                      p2p_->post_recv(w, const_cast<void*>(buf), call.count, call.dtype, call.root,
                                                      call.tag);
                                  });
}

WorkPtr TransportProcessGroup::submit(const Call& call, std::function<void(algorithms::Context&)> fn) {
  check_dtype(call);
  uint64_t seq = seq_++;
  bool collective = call.op != OpType::kSend && call.op != OpType::kRecv;
  // Small calls are left up to a poll period (no wake-up), others 50 us, for the caller's
  // wait() to run them on its own thread (no hand-off).
  size_t bytes = call.count * (call.op == OpType::kBarrier ? 0 : dtype_size(call.dtype));
  Engine::Size size = bytes <= options_.small_message_bytes ? Engine::Size::kSmall : Engine::Size::kLarge;
  auto work = std::make_shared<Work>(std::function<std::string()>([call, seq] { return describe(call, seq); }));
  const uint64_t rec = recorder_->record(record_group_, seq, call.op, call.dtype, call.count, call.reduce_op,
                                         call.root, call.tag);
  if (rec) work->set_record(recorder_, rec);
  return engine_->submit(
      std::move(work),
      [this, call, seq, collective, rec, fn = std::move(fn)] {
        recorder_->started(rec);
        algorithms::Context ctx;
        ctx.transport = transport_.get();
        ctx.rank = rank_;
        ctx.size = size_;
        ctx.deadline = Deadline::after_seconds(options_.timeout_s);
        ctx.segment_bytes = std::min(options_.segment_bytes, transport_->slot_bytes()) / 64 * 64;
        ctx.scratch = &scratch_;
        try {
          if (collective && *options_.debug_fingerprint && size_ > 1) check_fingerprint(ctx, call, seq);
          fn(ctx);
        } catch (const PeerTimeout& e) {
          PT_THROW(TimeoutError, "rank ", rank_, ": ", describe(call, seq), " passed its deadline of ",
                   options_.timeout_s, " s (PARATRAIN_COMM_TIMEOUT_S); ranks not heard from: ", e.peer(), " (",
                   e.what(), ")");
        } catch (const PeerFailure& e) {
          PT_THROW(CommError, "rank ", rank_, ": ", describe(call, seq), " failed: ", e.what());
        } catch (const CommError& e) {
          if (std::string(e.what()).find("rank ") == 0) throw;
          PT_THROW(CommError, "rank ", rank_, ": ", describe(call, seq), ": ", e.what());
        }
      },
      size);
}

WorkPtr TransportProcessGroup::allreduce(void* buf, size_t count, DType dtype, ReduceOp op) {
  return submit({OpType::kAllreduce, dtype, count, -1, op}, [=, this](algorithms::Context& ctx) {
    size_t bytes = count * dtype_size(dtype);
    if (options_.deterministic) algorithms::allreduce_rank_ordered(ctx, buf, count, dtype, op);
    else if (bytes <= options_.small_message_bytes && bytes <= ctx.segment_bytes)
      algorithms::allreduce_recursive_doubling(ctx, buf, count, dtype, op);
    else algorithms::allreduce_ring(ctx, buf, count, dtype, op);
  });
}

WorkPtr TransportProcessGroup::reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) {
  return submit({OpType::kReduceScatter, dtype, count, -1, op}, [=, this](algorithms::Context& ctx) {
    if (options_.deterministic) algorithms::reduce_scatter_rank_ordered(ctx, in, out, count, dtype, op);
    else algorithms::reduce_scatter_ring(ctx, in, out, count, dtype, op);
  });
}

WorkPtr TransportProcessGroup::allgather(const void* in, void* out, size_t count, DType dtype) {
  return submit({OpType::kAllgather, dtype, count, -1, ReduceOp::kSum},
                [=](algorithms::Context& ctx) { algorithms::allgather_ring(ctx, in, out, count, dtype); });
}

static void check_rank(int r, int size, const char* what) {
  if (r < 0 || r >= size) PT_THROW(InputError, what, " rank ", r, " is outside the group of size ", size);
}

WorkPtr TransportProcessGroup::broadcast(void* buf, size_t count, DType dtype, int root) {
  check_rank(root, size_, "broadcast: root");
  return submit({OpType::kBroadcast, dtype, count, root, ReduceOp::kSum},
                [=](algorithms::Context& ctx) { algorithms::broadcast_chain(ctx, buf, count, dtype, root); });
}

WorkPtr TransportProcessGroup::reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) {
  check_rank(root, size_, "reduce: root");
  return submit({OpType::kReduce, dtype, count, root, op},
                [=](algorithms::Context& ctx) { algorithms::reduce_chain(ctx, buf, count, dtype, op, root); });
}

WorkPtr TransportProcessGroup::all_to_all(const void* in, void* out, size_t count, DType dtype) {
  return submit({OpType::kAllToAll, dtype, count, -1, ReduceOp::kSum},
                [=](algorithms::Context& ctx) { algorithms::all_to_all_direct(ctx, in, out, count, dtype); });
}

WorkPtr TransportProcessGroup::send(const void* buf, size_t count, DType dtype, int dst, int tag) {
  check_rank(dst, size_, "send: destination");
  if (dst == rank_) PT_THROW(InputError, "send: rank ", rank_, " cannot send to itself");
  return submit_p2p({OpType::kSend, dtype, count, dst, ReduceOp::kSum, tag}, buf);
}

WorkPtr TransportProcessGroup::recv(void* buf, size_t count, DType dtype, int src, int tag) {
  check_rank(src, size_, "recv: source");
  if (src == rank_) PT_THROW(InputError, "recv: rank ", rank_, " cannot receive from itself");
  return submit_p2p({OpType::kRecv, dtype, count, src, ReduceOp::kSum, tag}, buf);
}

WorkPtr TransportProcessGroup::barrier() {
  return submit({OpType::kBarrier, DType::U8, 0, -1, ReduceOp::kSum},
                [](algorithms::Context& ctx) { algorithms::barrier_dissemination(ctx); });
}

std::shared_ptr<ProcessGroup> TransportProcessGroup::new_group(const std::vector<int>& ranks) {
  int id = next_group_id_++;
  if (ranks.empty()) PT_THROW(InputError, "new_group: empty rank list");
  for (size_t i = 0; i < ranks.size(); ++i) {
    check_rank(ranks[i], size_, "new_group:");
    if (i > 0 && ranks[i] <= ranks[i - 1]) PT_THROW(InputError, "new_group: ranks must be ascending and unique");
  }
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  auto sub_store = std::make_shared<PrefixStore>("sub" + std::to_string(id), store_);
  ProcessGroupOptions o = options_;
  std::vector<int> global;
  for (int r : ranks) global.push_back(global_ranks_[static_cast<size_t>(r)]);
  return std::make_shared<TransportProcessGroup>(sub_store, static_cast<int>(it - ranks.begin()),
                                                 static_cast<int>(ranks.size()), o, std::move(global),
                                                 name_.empty() ? "" : name_ + "/" + std::to_string(id));
}

}  // namespace paratrain::comm
