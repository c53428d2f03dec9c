#include "comm/backends/mpi/mpi_process_group.h"

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <immintrin.h>

#include <climits>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "comm/algorithms/reduce_kernels.h"
#include "comm/deadline.h"
#include "comm/engine.h"
#include "comm/transport_process_group.h"
#include "paratrain/comm/flight_recorder.h"

namespace paratrain::comm::mpi {
namespace {

struct MpiRuntime {
  bool we_initialised = false;
  bool multiple = false;  // MPI_THREAD_MULTIPLE: else every MPI call here is serialised (lock())
  std::mutex mu;
  MpiRuntime() {
    int inited = 0;
    MPI_Initialized(&inited);
    int provided = 0;
    if (!inited) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
      we_initialised = true;
      if (provided < MPI_THREAD_SERIALIZED)
        PT_THROW(CommError, "the MPI library offers no thread support (MPI_THREAD_SERIALIZED needed)");
    } else {
      MPI_Query_thread(&provided);
    }
    multiple = provided >= MPI_THREAD_MULTIPLE;
  }
  ~MpiRuntime() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (we_initialised && !finalized) MPI_Finalize();
  }
};

MpiRuntime& runtime() {
  static MpiRuntime rt;
  return rt;
}

// Held around each MPI call where the library is not MPI_THREAD_MULTIPLE (the engines of
// several groups and the p2p pollers call it from their own threads).
std::unique_lock<std::mutex> lock() {
  MpiRuntime& rt = runtime();
  return rt.multiple ? std::unique_lock<std::mutex>() : std::unique_lock<std::mutex>(rt.mu);
}

// Completes the MPI_Isend / MPI_Irecv requests of one group in the background (the engine
// only starts them, in call order), so a large send waits for nothing but its own recv.
// Each request has the deadline of its call; one that passes it fails every pending one
// (TimeoutError naming the call: rank, op, sequence number, bytes, peer and tag) and breaks
// the group (on_failure). The thread starts with the first request and sleeps while none
// is pending; the destructor waits for the pending ones (each has its deadline).
class RequestPoller {
 public:
  RequestPoller(int rank, double timeout_s, std::function<void(const std::string&)> on_failure)
      : rank_(rank), timeout_s_(timeout_s), on_failure_(std::move(on_failure)) {}
  ~RequestPoller() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void add(MPI_Request req, const WorkPtr& work, const char* waiting_for) {
    std::lock_guard<std::mutex> l(mu_);
    inbox_.push_back({req, work, Deadline::after_seconds(timeout_s_), waiting_for});
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
    cv_.notify_all();
  }

 private:
  struct Pending {
    MPI_Request req;
    WorkPtr work;
    Deadline deadline;
    const char* waiting_for;
  };
  void loop() {
    std::vector<Pending> live;
    auto last_event = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (live.empty()) cv_.wait(l, [&] { return stop_ || !inbox_.empty(); });
        if (live.empty() && inbox_.empty() && stop_) return;
        if (!inbox_.empty()) last_event = Clock::now();
        for (auto& p : inbox_) live.push_back(std::move(p));
        inbox_.clear();
      }
      size_t keep = 0;
      for (size_t i = 0; i < live.size(); ++i) {
        int done = 0;
        {
          auto l = lock();
          MPI_Test(&live[i].req, &done, MPI_STATUS_IGNORE);
        }
        if (done) {
          live[i].work->finish();
          last_event = Clock::now();
        } else {
          live[keep++] = std::move(live[i]);
        }
      }
      live.resize(keep);
      for (auto& p : live)
        if (p.deadline.expired()) {
          std::string why = detail::concat("rank ", rank_, ": ", p.work->description(), " passed its deadline of ",
                                           timeout_s_, " s (PARATRAIN_COMM_TIMEOUT_S): ", p.waiting_for);
          for (auto& q : live)
            q.work->finish(&q == &p ? std::make_exception_ptr(TimeoutError(why))
                                    : std::make_exception_ptr(CommError(detail::concat(
                                          "rank ", rank_, ": ", q.work->description(),
                                          " failed: the group is unusable after an earlier failure: ", why))));
          live.clear();  // the requests are left to MPI (cancelling a send is not portable)
          if (on_failure_) on_failure_(why);
          break;
        }
      if (live.empty()) continue;
      // Poll hard while requests complete (MPI progresses inside MPI_Test), gently after
      // 50 ms without any event.
      if (Clock::now() - last_event < std::chrono::milliseconds(50)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  int rank_;
  double timeout_s_;
  std::function<void(const std::string&)> on_failure_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;
  bool stop_ = false;
  std::thread thread_;
};

template <typename Load, typename Store, int Kind>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    float x = Load()(a[i]), y = Load()(b[i]);
    float r = Kind == 0 ? x + y : Kind == 1 ? (x > y ? x : y) : (x < y ? x : y);
    b[i] = Store()(r);
  }
}
struct LBf { float operator()(uint16_t v) const { return bf16_to_f32(v); } };
struct SBf { uint16_t operator()(float v) const { return f32_to_bf16(v); } };
struct LHf { float operator()(uint16_t v) const { return f16_to_f32(v); } };
struct SHf { uint16_t operator()(float v) const { return f32_to_f16(v); } };

MPI_Datatype mpi_type(DType d) {
  switch (d) {
    case DType::F32: return MPI_FLOAT;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    default: PT_THROW(InputError, "mpi backend: dtype ", dtype_name(d), " is not supported");
  }
}

MPI_Op mpi_op(DType d, ReduceOp op) {
  static std::once_flag once;
  static MPI_Op ops[2][3];
  std::call_once(once, [] {
    MPI_Op_create(&half_op<LBf, SBf, 0>, 1, &ops[0][0]);
    MPI_Op_create(&half_op<LBf, SBf, 1>, 1, &ops[0][1]);
    MPI_Op_create(&half_op<LBf, SBf, 2>, 1, &ops[0][2]);
    MPI_Op_create(&half_op<LHf, SHf, 0>, 1, &ops[1][0]);
    MPI_Op_create(&half_op<LHf, SHf, 1>, 1, &ops[1][1]);
    MPI_Op_create(&half_op<LHf, SHf, 2>, 1, &ops[1][2]);
  });
  int k = (op == ReduceOp::kMax) ? 1 : (op == ReduceOp::kMin) ? 2 : 0;
  if (d == DType::BF16) return ops[0][k];
  if (d == DType::F16) return ops[1][k];
  return k == 0 ? MPI_SUM : k == 1 ? MPI_MAX : MPI_MIN;
}

int icount(size_t n) {
  if (n > static_cast<size_t>(INT_MAX)) PT_THROW(InputError, "mpi backend: count ", n, " exceeds INT_MAX");
  return static_cast<int>(n);
}

class MpiProcessGroup : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, const ProcessGroupOptions& options, std::string name = "")
      : comm_(comm), recorder_(&FlightRecorder::instance()) {
    options_ = options;
    if (options_.deterministic)
      PT_THROW(InputError, "the mpi backend has no rank-ordered (deterministic) mode; use --backend shm or tcp");
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (recorder_->enabled()) {
      // The group's ranks in MPI_COMM_WORLD, for the flight recorder.
      MPI_Group mine, world;
      MPI_Comm_group(comm_, &mine);
      MPI_Comm_group(MPI_COMM_WORLD, &world);
      std::vector<int> local(static_cast<size_t>(size_)), global(static_cast<size_t>(size_));
      for (int i = 0; i < size_; ++i) local[static_cast<size_t>(i)] = i;
      MPI_Group_translate_ranks(mine, size_, local.data(), world, global.data());
      MPI_Group_free(&mine);
      MPI_Group_free(&world);
      record_group_ = recorder_->add_group(name, "mpi", rank_, size_, global);
      if (const FlightGroup* g = recorder_->group(record_group_)) name_ = g->name;
    }
    engine_ = std::make_unique<Engine>();
    poller_ = std::make_unique<RequestPoller>(rank_, options_.timeout_s,
                                              [this](const std::string& why) { engine_->set_broken(why); });
  }
  ~MpiProcessGroup() override {
    // Run everything queued (so every send/recv is started), let the poller finish them
    // (each has its deadline; a failure marks the engine, which is still there), then stop.
    try {
      engine_->submit("drain", [] {})->wait();
    } catch (const std::exception&) {
    }
    poller_.reset();
    engine_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }
  std::string backend_name() const override { return "mpi"; }

  WorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override {
    return submit(OpType::kAllreduce, dtype, count, -1, op, [=, this](MPI_Request* r) {
      MPI_Iallreduce(MPI_IN_PLACE, buf, icount(count), mpi_type(dtype), mpi_op(dtype, op), comm_, r);
    }, [=, this] { if (op == ReduceOp::kAvg) kernels::scale_avg(buf, count, dtype, size_); });
  }
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override {
    return submit(OpType::kReduceScatter, dtype, count, -1, op, [=, this](MPI_Request* r) {
      MPI_Ireduce_scatter_block(in, out, icount(count), mpi_type(dtype), mpi_op(dtype, op), comm_, r);
    }, [=, this] { if (op == ReduceOp::kAvg) kernels::scale_avg(out, count, dtype, size_); });
  }
  WorkPtr allgather(const void* in, void* out, size_t count, DType dtype) override {
    return submit(OpType::kAllgather, dtype, count, -1, ReduceOp::kSum, [=, this](MPI_Request* r) {
      MPI_Iallgather(in, icount(count), mpi_type(dtype), out, icount(count), mpi_type(dtype), comm_, r);
    });
  }
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override {
    check_root(root);
    return submit(OpType::kBroadcast, dtype, count, root, ReduceOp::kSum, [=, this](MPI_Request* r) {
      MPI_Ibcast(buf, icount(count), mpi_type(dtype), root, comm_, r);
    });
  }
  WorkPtr reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) override {
    check_root(root);
    return submit(OpType::kReduce, dtype, count, root, op, [=, this](MPI_Request* r) {
      if (rank_ == root) MPI_Ireduce(MPI_IN_PLACE, buf, icount(count), mpi_type(dtype), mpi_op(dtype, op), root, comm_, r);
      else MPI_Ireduce(buf, nullptr, icount(count), mpi_type(dtype), mpi_op(dtype, op), root, comm_, r);
    }, [=, this] { if (op == ReduceOp::kAvg && rank_ == root) kernels::scale_avg(buf, count, dtype, size_); });
  }
  WorkPtr all_to_all(const void* in, void* out, size_t count, DType dtype) override {
    return submit(OpType::kAllToAll, dtype, count, -1, ReduceOp::kSum, [=, this](MPI_Request* r) {
      MPI_Ialltoall(in, icount(count), mpi_type(dtype), out, icount(count), mpi_type(dtype), comm_, r);
    });
  }
  // Started in call order on the engine (so after the calls before them), completed by the
  // poller: later calls do not wait for them.
  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag) override {
    check_root(dst);
    return submit_p2p(OpType::kSend, dtype, count, dst, tag, [=, this](MPI_Request* r) {
      MPI_Isend(buf, icount(count), mpi_type(dtype), dst, tag, comm_, r);
    });
  }
  WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag) override {
    check_root(src);
    return submit_p2p(OpType::kRecv, dtype, count, src, tag, [=, this](MPI_Request* r) {
      MPI_Irecv(buf, icount(count), mpi_type(dtype), src, tag, comm_, r);
    });
  }
  WorkPtr barrier() override {
    return submit(OpType::kBarrier, DType::U8, 0, -1, ReduceOp::kSum,
                  [=, this](MPI_Request* r) { MPI_Ibarrier(comm_, r); });
  }
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override {
    bool member = false;
    for (size_t i = 0; i < ranks.size(); ++i) {
      check_root(ranks[i]);
      if (i > 0 && ranks[i] <= ranks[i - 1]) PT_THROW(InputError, "new_group: ranks must be ascending and unique");
      member |= ranks[i] == rank_;
    }
    MPI_Comm sub;
    // Run on the engine so it is ordered with the other calls on this communicator.
    engine_->submit("new_group", [&] { MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, rank_, &sub); })->wait();
    const int id = next_group_id_++;
    if (!member) return nullptr;
    return std::make_shared<MpiProcessGroup>(sub, options_, name_.empty() ? "" : name_ + "/" + std::to_string(id));
  }

 private:
  void check_root(int r) const {
    if (r < 0 || r >= size_) PT_THROW(InputError, "rank ", r, " is outside the group of size ", size_);
  }
  WorkPtr submit_p2p(OpType op, DType dtype, size_t count, int peer, int tag, std::function<void(MPI_Request*)> start) {
    mpi_type(dtype);
    icount(count);
    uint64_t seq = seq_++;
    bool send = op == OpType::kSend;
    auto describe = [=] {
      return detail::concat(op_type_name(op), " #", seq, " (", dtype_name(dtype), " x ", count, ", ",
                            count * dtype_size(dtype), " bytes, ", send ? "to" : "from", " rank ", peer, ", tag ", tag,
                            ")");
    };
    auto work = std::make_shared<Work>(std::function<std::string()>(describe));
    const uint64_t rec = recorder_->record(record_group_, seq, op, dtype, count, ReduceOp::kSum, peer, tag);
    if (rec) work->set_record(recorder_, rec);
    return engine_->submit_deferred(std::move(work), [=, this](const WorkPtr& w) {
      recorder_->started(rec);
      MPI_Request r;
      {
        auto l = lock();
        start(&r);
      }
      poller_->add(r, w,
                   send ? "the matching recv was not posted (or did not take the data)"
                        : "no matching send (this tag, this count) arrived");
    });
  }
  void wait_request(MPI_Request* req, const Deadline& deadline, const std::string& desc) {
    int done = 0;
    for (int i = 0;; ++i) {
      {
        auto l = lock();
        MPI_Test(req, &done, MPI_STATUS_IGNORE);
      }
      if (done) return;
      if (i < 20000) {
        _mm_pause();
        continue;
      }
      if ((i & 63) == 0 && deadline.expired())
        PT_THROW(TimeoutError, "rank ", rank_, ": ", desc, " passed its deadline of ", options_.timeout_s,
                 " s (PARATRAIN_COMM_TIMEOUT_S); the MPI library does not say which ranks are missing");
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  WorkPtr submit(OpType op, DType dtype, size_t count, int root, ReduceOp rop, std::function<void(MPI_Request*)> start,
                 std::function<void()> after = nullptr) {
    mpi_type(dtype);
    uint64_t seq = seq_++;
    std::string desc = detail::concat(op_type_name(op), " #", seq, " (", dtype_name(dtype), " x ", count, ")");
    bool collective = op != OpType::kSend && op != OpType::kRecv;
    auto work = std::make_shared<Work>(desc);
    const uint64_t rec = recorder_->record(record_group_, seq, op, dtype, count, rop, root, 0);
    if (rec) work->set_record(recorder_, rec);
    return engine_->submit(std::move(work), [=, this] {
      recorder_->started(rec);
      Deadline deadline = Deadline::after_seconds(options_.timeout_s);
      if (collective && *options_.debug_fingerprint && size_ > 1) {
        int64_t mine[4] = {int64_t(op), int64_t(dtype), int64_t(count), int64_t(root) * 16 + int64_t(rop)};
        std::vector<int64_t> all(4 * size_);
        MPI_Request r;
        {
          auto l = lock();
          MPI_Iallgather(mine, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, comm_, &r);
        }
        wait_request(&r, deadline, desc);
        for (int p = 0; p < size_; ++p)
          if (std::memcmp(&all[4 * p], mine, sizeof(mine)) != 0)
            PT_THROW(CommError, "collective mismatch (PARATRAIN_DEBUG=detail): rank ", rank_, " called ", desc,
                     " but rank ", p, " called ", op_type_name(OpType(all[4 * p])), " (",
                     dtype_name(DType(all[4 * p + 1])), " x ", all[4 * p + 2], ")");
      }
      MPI_Request r;
      {
        auto l = lock();
        start(&r);
      }
      wait_request(&r, deadline, desc);
      if (after) after();
    }, Engine::Size::kLarge);
  }

  MPI_Comm comm_;
  uint64_t seq_ = 0;
  FlightRecorder* recorder_;
  int next_group_id_ = 0;
  std::string name_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<RequestPoller> poller_;
};

}  // namespace

std::shared_ptr<ProcessGroup> create_mpi_process_group(const ProcessGroupOptions& options) {
  runtime();
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  return std::make_shared<MpiProcessGroup>(comm, resolve_options(options));
}

}  // namespace paratrain::comm::mpi
