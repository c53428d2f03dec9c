#include "comm/p2p.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "paratrain/base/error.h"

namespace paratrain::comm {
namespace {

constexpr size_t kEagerBytes = 64u << 10;

enum Kind : uint8_t { kEager = 1, kRts = 2, kCts = 3, kNack = 4, kData = 5 };

struct Frame {
  uint8_t kind;
  uint8_t dtype;
  uint16_t pad;
  int32_t tag;
  uint64_t id;      // the sender's message number on this pair
  uint64_t count;   // elements of the message (NACK: of the receiver's recv)
  uint64_t offset;  // DATA: byte offset of the payload
};
static_assert(sizeof(Frame) == 32);

enum class State { kAnnounce, kAwaitCts, kStreaming, kPosted, kReceiving };

struct Op {
  WorkPtr work;
  bool send = false;
  char* buf = nullptr;
  DType dtype = DType::F32;
  uint64_t count = 0, bytes = 0;
  int peer = 0, tag = 0;
  uint64_t id = 0;  // send: its message number; recv: the matched send's number
  Deadline deadline;
  uint64_t done = 0;  // bytes moved
  State state = State::kAnnounce;
  bool finished = false;
};
using OpPtr = std::shared_ptr<Op>;

struct Unexpected {
  Frame frame;
  std::vector<char> data;  // EAGER payload
};

struct PeerState {
  Pair* pair = nullptr;
  bool wakes = false;  // the pair rings the doorbell (set_wakeup): no need to poll it
  bool active = false;
  size_t pending = 0;                    // unfinished ops with this peer
  uint64_t next_id = 0;                  // of this rank's sends to the peer
  std::deque<OpPtr> announce;            // sends to announce, in posting order
  std::deque<Frame> control;             // CTS / NACK frames to send
  std::unordered_map<uint64_t, OpPtr> await_cts;
  std::deque<OpPtr> streaming;           // sends cleared by the receiver, in CTS order
  std::map<int, std::deque<OpPtr>> posted;          // recvs not matched yet, by tag
  std::map<int, std::deque<Unexpected>> unexpected;  // announcements no recv matched yet, by tag
  std::unordered_map<uint64_t, OpPtr> receiving;    // matched rendezvous recvs, by sender's id
};

// A failure that ends the engine: the message every pending op quotes.
struct Fatal {
  std::string why;
  OpPtr culprit;  // the op that passed its deadline, or null
};

}  // namespace

struct P2pEngine::Impl {
  Transport* transport = nullptr;
  int rank = 0;
  double timeout_s = 0;
  std::function<void(const std::string&)> on_failure;

  std::mutex mu;  // guards inbox, stop, sleeping, failed, thread start
  std::condition_variable cv;
  std::vector<OpPtr> inbox;
  std::atomic<bool> inbox_nonempty{false};
  std::atomic<uint64_t> bell{0};  // rung by pairs that can (set_wakeup)
  bool stop = false;
  bool sleeping = false;
  std::string failed;  // set once; later posts fail at once
  std::thread thread;

  // Thread-owned.
  std::vector<PeerState> peers;
  std::vector<int> active;  // peers with any op so far
  std::vector<OpPtr> live;  // unfinished ops (finished ones are dropped on the next scan)
  size_t unfinished = 0;

  void post(OpPtr op) {
    std::unique_lock<std::mutex> l(mu);
    if (!failed.empty()) {
      std::string why = failed;
      l.unlock();
      op->work->finish(std::make_exception_ptr(CommError(detail::concat(
          "rank ", rank, ": ", op->work->description(), " not run: the group is unusable after an earlier failure: ", why))));
      return;
    }
    inbox.push_back(std::move(op));
    inbox_nonempty.store(true, std::memory_order_release);
    if (!thread.joinable()) thread = std::thread([this] { loop(); });
    if (sleeping) cv.notify_all();
  }

  size_t payload_cap(PeerState& ps) const { return ps.pair->slot_bytes() - sizeof(Frame); }
  size_t eager_limit(PeerState& ps) const { return std::min(kEagerBytes, payload_cap(ps)); }

  void finish(const OpPtr& op) {
    op->finished = true;
    --unfinished;
    --peers[op->peer].pending;
    op->work->finish();
  }

  void take_inbox() {
    std::vector<OpPtr> got;
    {
      std::lock_guard<std::mutex> l(mu);
      got.swap(inbox);
      inbox_nonempty.store(false, std::memory_order_relaxed);
    }
    for (auto& op : got) {  // all count as pending before any can fail
      PeerState& ps = peers[op->peer];
      if (!ps.active) {
        ps.active = true;
        active.push_back(op->peer);
      }
      ++ps.pending;
      ++unfinished;
      live.push_back(op);
    }
    for (auto& op : got) {
      PeerState& ps = peers[op->peer];
      if (op->send) {
        op->id = ps.next_id++;
        op->state = State::kAnnounce;
        ps.announce.push_back(op);
      } else {
        op->state = State::kPosted;
        auto it = ps.unexpected.find(op->tag);
        if (it != ps.unexpected.end()) {
          Unexpected u = std::move(it->second.front());
          it->second.pop_front();
          if (it->second.empty()) ps.unexpected.erase(it);
          match(ps, op, u.frame, u.data.data(), u.data.size());
        } else {
          ps.posted[op->tag].push_back(op);
        }
      }
    }
  }

  [[noreturn]] void mismatch(PeerState& ps, const OpPtr& r, const Frame& f) {
    if (f.kind == kRts) {  // best effort: tell the sender, so it fails too instead of waiting
      if (void* slot = ps.pair->try_send_begin()) {
        Frame n{kNack, uint8_t(r->dtype), 0, r->tag, f.id, r->count, 0};
        std::memcpy(slot, &n, sizeof(n));
        ps.pair->send_end(sizeof(n));
      }
    }
    throw Fatal{detail::concat("rank ", rank, ": ", r->work->description(), " failed: rank ", r->peer,
                               " sent a message with tag ", r->tag, " of ", dtype_name(DType(f.dtype)), " x ", f.count,
                               " (", f.count * dtype_size(DType(f.dtype)),
                               " bytes): send and recv must agree on dtype and count"),
                nullptr};
  }

  // A recv meets its send's announcement (EAGER with its data, or RTS).
  void match(PeerState& ps, const OpPtr& r, const Frame& f, const char* payload, size_t len) {
    if (DType(f.dtype) != r->dtype || f.count != r->count) mismatch(ps, r, f);
    r->id = f.id;
    if (f.kind == kEager) {
      if (len != r->bytes) protocol(ps, "an eager message of the wrong length");
      if (len) std::memcpy(r->buf, payload, len);
      r->done = len;
      finish(r);
      return;
    }
    r->state = State::kReceiving;
    ps.receiving[f.id] = r;
    ps.control.push_back(Frame{kCts, 0, 0, r->tag, f.id, 0, 0});
  }

  [[noreturn]] void protocol(PeerState& ps, const char* what) {
    throw Fatal{detail::concat("rank ", rank, ": point-to-point protocol error on the pair with rank ", ps.pair->peer(),
                               ": ", what, " (are both ranks running the same paratrain build?)"),
                nullptr};
  }

  bool pump_in(PeerState& ps) {
    bool any = false;
    for (int i = 0; i < 64; ++i) {
      size_t n = 0;
      const char* slot = static_cast<const char*>(ps.pair->try_recv_begin(&n));
      if (!slot) break;
      any = true;
      if (n < sizeof(Frame)) protocol(ps, "a frame shorter than its header");
      Frame f;
      std::memcpy(&f, slot, sizeof(f));
      const char* payload = slot + sizeof(Frame);
      const size_t len = n - sizeof(Frame);
      switch (f.kind) {
        case kEager:
        case kRts: {
          auto it = ps.posted.find(f.tag);
          if (it != ps.posted.end()) {
            OpPtr r = it->second.front();
            it->second.pop_front();
            if (it->second.empty()) ps.posted.erase(it);
            match(ps, r, f, payload, len);
          } else {
            Unexpected u{f, {}};
            if (f.kind == kEager) u.data.assign(payload, payload + len);
            ps.unexpected[f.tag].push_back(std::move(u));
          }
          break;
        }
        case kCts: {
          auto it = ps.await_cts.find(f.id);
          if (it == ps.await_cts.end()) protocol(ps, "a clear-to-send for no pending send");
          it->second->state = State::kStreaming;
          ps.streaming.push_back(it->second);
          ps.await_cts.erase(it);
          break;
        }
        case kNack: {
          auto it = ps.await_cts.find(f.id);
          if (it == ps.await_cts.end()) protocol(ps, "a refusal for no pending send");
          throw Fatal{detail::concat("rank ", rank, ": ", it->second->work->description(), " failed: the matching recv on rank ",
                                     ps.pair->peer(), " (tag ", f.tag, ") expects ", dtype_name(DType(f.dtype)), " x ",
                                     f.count, ": send and recv must agree on dtype and count"),
                      nullptr};
        }
        case kData: {
          auto it = ps.receiving.find(f.id);
          if (it == ps.receiving.end()) protocol(ps, "data for no pending recv");
          const OpPtr& r = it->second;
          if (f.offset != r->done || r->done + len > r->bytes) protocol(ps, "data out of place");
          std::memcpy(r->buf + f.offset, payload, len);
          r->done += len;
          if (r->done == r->bytes) {
            OpPtr done = r;
            ps.receiving.erase(it);
            finish(done);
          }
          break;
        }
        default:
          protocol(ps, "an unknown frame");
      }
      ps.pair->recv_end();
    }
    return any;
  }

  bool pump_out(PeerState& ps) {
    bool any = false;
    while (!ps.control.empty()) {
      void* slot = ps.pair->try_send_begin();
      if (!slot) return any;
      std::memcpy(slot, &ps.control.front(), sizeof(Frame));
      ps.pair->send_end(sizeof(Frame));
      ps.control.pop_front();
      any = true;
    }
    while (!ps.announce.empty()) {
      void* slot = ps.pair->try_send_begin();
      if (!slot) return any;
      OpPtr s = ps.announce.front();
      ps.announce.pop_front();
      const bool eager = s->bytes <= eager_limit(ps);
      Frame f{eager ? kEager : kRts, uint8_t(s->dtype), 0, s->tag, s->id, s->count, 0};
      std::memcpy(slot, &f, sizeof(f));
      if (eager && s->bytes) std::memcpy(static_cast<char*>(slot) + sizeof(Frame), s->buf, s->bytes);
      ps.pair->send_end(sizeof(Frame) + (eager ? s->bytes : 0));
      any = true;
      if (eager) {
        s->done = s->bytes;
        finish(s);
      } else {
        s->state = State::kAwaitCts;
        ps.await_cts[s->id] = s;
      }
    }
    const size_t cap = payload_cap(ps);
    while (!ps.streaming.empty()) {
      void* slot = ps.pair->try_send_begin();
      if (!slot) return any;
      const OpPtr& s = ps.streaming.front();
      const size_t len = std::min<uint64_t>(cap, s->bytes - s->done);
      Frame f{kData, uint8_t(s->dtype), 0, s->tag, s->id, s->count, s->done};
      std::memcpy(slot, &f, sizeof(f));
      std::memcpy(static_cast<char*>(slot) + sizeof(Frame), s->buf + s->done, len);
      ps.pair->send_end(sizeof(Frame) + len);
      s->done += len;
      any = true;
      if (s->done == s->bytes) {
        OpPtr done = s;
        ps.streaming.pop_front();
        finish(done);
      }
    }
    return any;
  }

  static const char* waiting_for(const Op& op) {
    switch (op.state) {
      case State::kAnnounce: return "is not taking this rank's messages (the pair's ring stayed full)";
      case State::kAwaitCts: return "has not posted the matching recv";
      case State::kStreaming: return "stopped reading the message";
      case State::kPosted: return "sent no message with this tag";
      case State::kReceiving: return "stopped sending the message";
    }
    return "?";
  }

  void check_deadlines() {
    size_t keep = 0;
    for (size_t i = 0; i < live.size(); ++i)
      if (!live[i]->finished) live[keep++] = live[i];
    live.resize(keep);
    for (auto& op : live)
      if (op->deadline.expired())
        throw Fatal{detail::concat("rank ", rank, ": ", op->work->description(), " passed its deadline of ", timeout_s,
                                   " s (PARATRAIN_COMM_TIMEOUT_S): rank ", op->peer, " ", waiting_for(*op), " (",
                                   op->done, " of ", op->bytes, " bytes moved)"),
                    op};
  }

  // A peer that closed its group cleanly can no longer take part in our pending ops.
  void check_left() {
    for (int p : active) {
      PeerState& ps = peers[p];
      if (ps.pending == 0 || !ps.pair->peer_left()) continue;
      size_t n;
      if (ps.pair->try_recv_begin(&n)) continue;  // still data to consume
      for (auto& op : live)
        if (!op->finished && op->peer == p)
          throw Fatal{detail::concat("rank ", rank, ": ", op->work->description(), " failed: rank ", p,
                                     " left the group (its process group was destroyed) before this completed"),
                      nullptr};
    }
  }

  void fail_all(const Fatal& f) {
    {
      std::lock_guard<std::mutex> l(mu);
      if (failed.empty()) failed = f.why;
    }
    for (auto& op : live) {
      if (op->finished) continue;
      std::exception_ptr e;
      if (op == f.culprit) {
        e = std::make_exception_ptr(TimeoutError(f.why));
      } else if (f.culprit || f.why.find(op->work->description()) == std::string::npos) {
        e = std::make_exception_ptr(CommError(detail::concat("rank ", rank, ": ", op->work->description(),
                                                             " failed: the group is unusable after an earlier failure: ", f.why)));
      } else {
        e = std::make_exception_ptr(CommError(f.why));
      }
      op->finished = true;
      op->work->finish(e);
    }
    live.clear();
    unfinished = 0;
    for (auto& ps : peers) {
      Pair* pair = ps.pair;
      bool wakes = ps.wakes;
      ps = PeerState{};
      ps.pair = pair;
      ps.wakes = wakes;
    }
    active.clear();
    if (on_failure) on_failure(f.why);
  }

  void loop() {
    auto last_progress = Clock::now();
    auto last_check = last_progress;
    for (;;) {
      if (inbox_nonempty.load(std::memory_order_acquire)) {
        try {
          take_inbox();
        } catch (const Fatal& f) {
          fail_all(f);
        }
        last_progress = Clock::now();
      }
      if (unfinished == 0) {
        std::unique_lock<std::mutex> l(mu);
        if (!inbox.empty()) continue;
        if (stop) return;
        sleeping = true;
        cv.wait(l, [&] { return stop || !inbox.empty(); });
        sleeping = false;
        continue;
      }
      bool progressed = false;
      bool must_poll = false;  // a pending op waits on a pair that cannot ring the bell
      int first_peer = -1;
      const uint64_t rung = bell.load(std::memory_order_acquire);
      try {
        for (int p : active) {
          first_peer = p;
          PeerState& ps = peers[p];
          progressed |= pump_in(ps);
          progressed |= pump_out(ps);
          must_poll |= ps.pending > 0 && !ps.wakes;
        }
        auto now = Clock::now();
        if (progressed) last_progress = now;
        if (now - last_check > std::chrono::milliseconds(1)) {
          last_check = now;
          check_deadlines();
          if (!progressed) check_left();
        }
      } catch (const Fatal& f) {
        fail_all(f);
        continue;
      } catch (const std::exception& e) {  // PeerFailure, or a transport error
        std::string desc = "point-to-point";
        for (auto& op : live)
          if (!op->finished && op->peer == first_peer) {
            desc = op->work->description();
            break;
          }
        fail_all(Fatal{detail::concat("rank ", rank, ": ", desc, " failed: ", e.what()), nullptr});
        continue;
      }
      if (progressed) continue;
      if (!must_poll) {  // sleep until a pair rings, a post, or the next deadline check
        std::unique_lock<std::mutex> l(mu);
        sleeping = true;
        cv.wait_for(l, std::chrono::milliseconds(2), [&] {
          return bell.load(std::memory_order_acquire) != rung || !inbox.empty();
        });
        sleeping = false;
        continue;
      }
      auto idle = Clock::now() - last_progress;
      if (idle < std::chrono::microseconds(50)) {
        for (int i = 0; i < 64; ++i) _mm_pause();
      } else if (idle < std::chrono::milliseconds(2)) {
        ::sched_yield();
      } else {
        std::unique_lock<std::mutex> l(mu);
        if (!inbox.empty()) continue;
        sleeping = true;
        cv.wait_for(l, idle < std::chrono::milliseconds(20) ? std::chrono::microseconds(100)
                                                            : std::chrono::microseconds(1000));
        sleeping = false;
      }
    }
  }
};

P2pEngine::P2pEngine(Transport* transport, double timeout_s, std::function<void(const std::string&)> on_failure)
    : impl_(std::make_unique<Impl>()) {
  impl_->transport = transport;
  impl_->rank = transport->rank();
  impl_->timeout_s = timeout_s;
  impl_->on_failure = std::move(on_failure);
  impl_->peers.resize(transport->size());
  Impl* d = impl_.get();
  for (int p = 0; p < transport->size(); ++p)
    if (p != transport->rank()) {
      PeerState& ps = d->peers[p];
      ps.pair = &transport->pair(p);
      ps.wakes = ps.pair->set_wakeup([d] {
        d->bell.fetch_add(1, std::memory_order_release);
        std::lock_guard<std::mutex> l(d->mu);
        d->cv.notify_all();
      });
    }
}

P2pEngine::~P2pEngine() {
  {
    std::lock_guard<std::mutex> l(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  for (auto& ps : impl_->peers)  // the transport outlives this engine
    if (ps.pair && ps.wakes) ps.pair->set_wakeup(nullptr);
}

void P2pEngine::post_send(const WorkPtr& work, const void* buf, size_t count, DType dtype, int peer, int tag) {
  auto op = std::make_shared<Op>();
  op->work = work;
  op->send = true;
  op->buf = const_cast<char*>(static_cast<const char*>(buf));
  op->dtype = dtype;
  op->count = count;
  op->bytes = count * dtype_size(dtype);
  op->peer = peer;
  op->tag = tag;
  op->deadline = Deadline::after_seconds(impl_->timeout_s);
  impl_->post(std::move(op));
}

void P2pEngine::post_recv(const WorkPtr& work, void* buf, size_t count, DType dtype, int peer, int tag) {
  auto op = std::make_shared<Op>();
  op->work = work;
  op->buf = static_cast<char*>(buf);
  op->dtype = dtype;
  op->count = count;
  op->bytes = count * dtype_size(dtype);
  op->peer = peer;
  op->tag = tag;
  op->state = State::kPosted;
  op->deadline = Deadline::after_seconds(impl_->timeout_s);
  impl_->post(std::move(op));
}

}  // namespace paratrain::comm
