#include "comm/transport/tcp/tcp_transport.h"

#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "comm/net/socket.h"
#include "paratrain/base/env.h"

namespace paratrain::comm::tcp {
namespace {

constexpr uint32_t kHelloMagic = 0x50544350;  // "PTCP"
// In place of a segment's length: the sender closed its group cleanly after everything it
// sent on this stream (a plain EOF without it means the peer died or its connection broke).
constexpr uint32_t kGoodbye = 0xffffffffu;
// In place of a segment's length: nothing to send lately, but alive (no segment follows).
constexpr uint32_t kHeartbeat = 0xfffffffeu;

struct Hello {
  uint32_t magic;
  int32_t rank;
  int32_t stream;
  char cookie[16];
};

bool send_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t w = ::send(fd, c, n, MSG_NOSIGNAL);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return false;
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

enum class RecvResult { kOk, kClosed, kSilent, kStopped };

// Reads n bytes; kSilent when nothing at all arrived for `silence_s` (> 0) in a row, kStopped
// once stop() says so (checked every 100 ms while waiting).
template <typename Stop>
RecvResult recv_all(int fd, void* p, size_t n, double silence_s, Stop stop) {
  char* c = static_cast<char*>(p);
  auto last = std::chrono::steady_clock::now();
  while (n > 0) {
    pollfd pf{fd, POLLIN, 0};
    int pr = ::poll(&pf, 1, 100);
    if (pr == 0 || (pr < 0 && errno == EINTR)) {
      if (stop()) return RecvResult::kStopped;
      if (silence_s > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count() > silence_s)
        return RecvResult::kSilent;
      continue;
    }
    ssize_t r = ::recv(fd, c, n, MSG_DONTWAIT);
    if (r <= 0) {
      if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return RecvResult::kClosed;
    }
    c += r;
    n -= static_cast<size_t>(r);
    last = std::chrono::steady_clock::now();
  }
  return RecvResult::kOk;
}

}  // namespace

// The first broken connection of a domain: every pair reports it, so survivors name the
// rank that died rather than a neighbour that left after noticing.
struct FirstFailure {
  std::mutex mu;
  int peer = -1;
  std::string what;
  // A peer fell silent (stopped): every wait of the domain fails, not only its pair's, as
  // with shm (a collective may wait on a rank that waits on the silent one).
  std::atomic<bool> fatal{false};
  void record(int p, const std::string& w) {
    std::lock_guard<std::mutex> l(mu);
    if (peer < 0) { peer = p; what = w; }
  }
  bool get(int* p, std::string* w) {
    std::lock_guard<std::mutex> l(mu);
    if (peer < 0) return false;
    *p = peer; *w = what;
    return true;
  }
};

class TcpPair : public Pair {
 public:
  TcpPair(int peer, const TcpConfig& cfg, std::vector<net::Socket> socks, FirstFailure* first)
      : peer_(peer), cfg_(cfg), socks_(std::move(socks)), first_(first) {
    K_ = cfg.slots;
    send_buf_.resize(K_ * cfg.slot_bytes);
    recv_buf_.resize(K_ * cfg.slot_bytes);
    send_len_.assign(K_, 0);
    send_done_.assign(K_, 0);
    recv_len_.assign(K_, 0);
    recv_ready_.assign(K_, 0);
    for (size_t s = 0; s < socks_.size(); ++s) {
      senders_.emplace_back([this, s] { sender(s); });
      receivers_.emplace_back([this, s] { receiver(s); });
    }
  }
  ~TcpPair() override {
    bool clean;
    {
      // Let the sender threads put everything already published on the wire (bounded): every
      // stream's last segment, not just the newest one (the streams run independently).
      std::unique_lock<std::mutex> l(mu_);
      clean = cv_.wait_for(l, std::chrono::seconds(10), [&] { return !failure_.empty() || all_sent(); }) &&
              failure_.empty();
      stop_ = true;
    }
    cv_.notify_all();
    if (clean) {
      // Everything published is on the wire, so the senders only wait for more: they return.
      for (auto& t : senders_) t.join();
      // Tell the peer this end closed cleanly, after its data on every stream. Never blocks:
      // where the 4 bytes do not fit (a peer that stopped reading) it sees a plain EOF.
      for (auto& s : socks_) {
        uint32_t bye = kGoodbye;
        (void)::send(s.fd(), &bye, sizeof(bye), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
    }
    for (auto& s : socks_) s.shutdown();  // wakes a sender still blocked in a write
    for (auto& t : senders_)
      if (t.joinable()) t.join();
    for (auto& t : receivers_) t.join();
  }
  int peer() const override { return peer_; }
  size_t slot_bytes() const override { return cfg_.slot_bytes; }

  void* send_begin(const Deadline& deadline) override {
    std::unique_lock<std::mutex> l(mu_);
    size_t slot = head_ % K_;
    wait(l, deadline, "send slot to", [&] { return head_ < K_ || send_done_[slot] >= head_ - K_ + 1; });
    return send_buf_.data() + slot * cfg_.slot_bytes;
  }
  void send_end(size_t bytes) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      send_len_[head_ % K_] = bytes;
      ++head_;
    }
    cv_.notify_all();
  }
  const void* recv_begin(size_t* bytes, const Deadline& deadline) override {
    std::unique_lock<std::mutex> l(mu_);
    size_t slot = tail_ % K_;
    wait(l, deadline, "data from", [&] { return recv_ready_[slot] == tail_ + 1; }, true);
    *bytes = recv_len_[slot];
    return recv_buf_.data() + slot * cfg_.slot_bytes;
  }
  void recv_end() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      ++tail_;
    }
    cv_.notify_all();
  }
  void* try_send_begin() override {
    std::unique_lock<std::mutex> l(mu_);
    size_t slot = head_ % K_;
    if (head_ < K_ || send_done_[slot] >= head_ - K_ + 1) return send_buf_.data() + slot * cfg_.slot_bytes;
    if (!failure_.empty() || stop_) throw_broken();
    if (first_->fatal.load(std::memory_order_relaxed)) throw_fatal();
    return nullptr;
  }
  const void* try_recv_begin(size_t* bytes) override {
    std::unique_lock<std::mutex> l(mu_);
    size_t slot = tail_ % K_;
    if (recv_ready_[slot] == tail_ + 1) {
      *bytes = recv_len_[slot];
      return recv_buf_.data() + slot * cfg_.slot_bytes;
    }
    const size_t stream = tail_ % socks_.size();
    if (!failure_.empty() || stop_ || (eof_[stream] && !goodbye_[stream])) throw_broken();
    if (first_->fatal.load(std::memory_order_relaxed)) throw_fatal();
    return nullptr;
  }
  bool set_wakeup(std::function<void()> fn) override {
    std::lock_guard<std::mutex> l(mu_);
    wakeup_ = std::move(fn);
    return true;
  }
  bool peer_left() override {
    std::unique_lock<std::mutex> l(mu_);
    const size_t stream = tail_ % socks_.size();
    return eof_[stream] && goodbye_[stream];
  }

 private:
  // Every published segment is on the wire. Older ones than the last K_ are: their slots
  // were reused (send_begin waits for that).
  bool all_sent() const {
    for (size_t seq = head_ - std::min(head_, K_); seq < head_; ++seq)
      if (send_done_[seq % K_] < seq + 1) return false;
    return true;
  }
  // for_recv: the wait needs segment tail_, which travels on stream tail_ % S; only that
  // stream's end (or a broken write) fails it, so data already on its way is never lost.
  // A stream that ended with the peer's goodbye (it closed its group) fails only the waits
  // that need it, and names the peer as having left; only other ends count as failures of
  // the domain (FirstFailure), so a rank that left never takes the blame for a later one.
  template <typename Pred>
  void wait(std::unique_lock<std::mutex>& l, const Deadline& deadline, const char* what, Pred ready,
            bool for_recv = false) {
    for (;;) {
      if (ready()) return;
      const size_t stream = tail_ % socks_.size();
      if (!failure_.empty() || (for_recv && eof_[stream])) throw_broken();
      if (stop_) throw PeerFailure(peer_, "transport closed");
      if (first_->fatal.load(std::memory_order_relaxed)) throw_fatal();
      if (deadline.expired()) throw PeerTimeout(peer_, detail::concat("timed out waiting for ", what, " rank ", peer_));
      cv_.wait_for(l, std::chrono::milliseconds(std::min<int64_t>(50, deadline.remaining_ms() + 1)));
    }
  }
  // Throws the pair's failure (mu_ held): a broken write, or the end of the stream that
  // carries segment tail_ (the peer's goodbye: it left; a plain EOF: it died).
  [[noreturn]] void throw_broken() {
    const size_t stream = tail_ % socks_.size();
    if (failure_.empty() && !eof_[stream] && stop_) throw PeerFailure(peer_, "transport closed");
    int p = peer_;
    std::string w = !failure_.empty() ? failure_
                    : goodbye_[stream]
                        ? detail::concat("rank ", peer_, " left the group (its process group was destroyed)")
                        : detail::concat("connection to rank ", peer_, " closed (rank ", peer_,
                                         " died or left the group)");
    first_->record(p, w);
    first_->get(&p, &w);  // name the first rank whose connection broke
    throw PeerFailure(p, w);
  }
  [[noreturn]] void throw_fatal() {
    int p = peer_;
    std::string w;
    first_->get(&p, &w);
    throw PeerFailure(p, w);
  }
  void fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (failure_.empty() && !stop_) {
        failure_ = why;
        first_->record(peer_, why);
      }
      if (wakeup_) wakeup_();
    }
    cv_.notify_all();
  }
  void stream_ended(size_t s, bool goodbye) {
    {
      std::lock_guard<std::mutex> l(mu_);
      eof_[s] = true;
      goodbye_[s] = goodbye;
      if (!stop_ && !goodbye)
        first_->record(peer_, detail::concat("connection to rank ", peer_, " closed (rank ", peer_,
                                             " died or left the group)"));
      if (wakeup_) wakeup_();
    }
    cv_.notify_all();
  }
  void sender(size_t s) {
    size_t S = socks_.size();
    const auto beat_every = std::chrono::milliseconds(
        cfg_.peer_timeout_s > 0 ? std::clamp<int64_t>(int64_t(cfg_.peer_timeout_s * 200), 20, 1000) : 1000);
    for (size_t seq = s;; seq += S) {
      size_t slot = seq % K_;
      uint32_t len;
      for (;;) {
        bool ready;
        {
          std::unique_lock<std::mutex> l(mu_);
          ready = cv_.wait_for(l, beat_every, [&] { return stop_ || !failure_.empty() || head_ > seq; });
          if (stop_ || !failure_.empty()) return;
          if (ready) {
            len = static_cast<uint32_t>(send_len_[slot]);
            break;
          }
        }
        // Idle: tell the peer this rank is alive (a stopped rank sends none).
        if (cfg_.peer_timeout_s > 0 && !send_all(socks_[s].fd(), &kHeartbeat, 4)) {
          fail(detail::concat("connection to rank ", peer_, " lost while sending (rank ", peer_, " died or left)"));
          return;
        }
      }
      if (!send_all(socks_[s].fd(), &len, 4) || !send_all(socks_[s].fd(), send_buf_.data() + slot * cfg_.slot_bytes, len)) {
        fail(detail::concat("connection to rank ", peer_, " lost while sending (rank ", peer_, " died or left)"));
        return;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        send_done_[slot] = seq + 1;
        if (wakeup_) wakeup_();
      }
      cv_.notify_all();
    }
  }
  // Silence on a stream for the peer timeout: the peer is stopped, hung in its kernel or
  // its host is gone (a live rank's sender beats while idle).
  void silent() {
    fail(detail::concat("rank ", peer_, " stopped responding for ", cfg_.peer_timeout_s,
                        " s (PARATRAIN_PEER_TIMEOUT_S; no data or heartbeat on its tcp connection: the process is "
                        "stopped, e.g. SIGSTOP, or its host is unreachable)"));
    first_->fatal.store(true);
  }
  void receiver(size_t s) {
    size_t S = socks_.size();
    auto stopped = [this] {
      std::lock_guard<std::mutex> l(mu_);
      return stop_;
    };
    for (size_t seq = s;; seq += S) {
      size_t slot = seq % K_;
      uint32_t len = 0;
      RecvResult got = recv_all(socks_[s].fd(), &len, 4, cfg_.peer_timeout_s, stopped);
      while (got == RecvResult::kOk && len == kHeartbeat)
        got = recv_all(socks_[s].fd(), &len, 4, cfg_.peer_timeout_s, stopped);
      if (got == RecvResult::kStopped) return;
      if (got == RecvResult::kSilent) {
        silent();
        return;
      }
      if (got == RecvResult::kClosed || len == kGoodbye) {
        stream_ended(s, got == RecvResult::kOk);
        return;
      }
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || seq < tail_ + K_; });
        if (stop_) return;
      }
      got = len > cfg_.slot_bytes ? RecvResult::kClosed
                                  : recv_all(socks_[s].fd(), recv_buf_.data() + slot * cfg_.slot_bytes, len,
                                             cfg_.peer_timeout_s, stopped);
      if (got == RecvResult::kStopped) return;
      if (got == RecvResult::kSilent) {
        silent();
        return;
      }
      if (got != RecvResult::kOk) {
        fail(detail::concat("connection to rank ", peer_, " closed mid-message (rank ", peer_, " died?)"));
        return;
      }
      {
        std::lock_guard<std::mutex> l(mu_);
        recv_len_[slot] = len;
        recv_ready_[slot] = seq + 1;
        if (wakeup_) wakeup_();
      }
      cv_.notify_all();
    }
  }

  int peer_;
  TcpConfig cfg_;
  std::vector<net::Socket> socks_;
  size_t K_;
  std::vector<char> send_buf_, recv_buf_;
  std::vector<size_t> send_len_, send_done_, recv_len_, recv_ready_;
  size_t head_ = 0, tail_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string failure_;
  FirstFailure* first_;
  std::vector<char> eof_ = std::vector<char>(16, 0);
  std::vector<char> goodbye_ = std::vector<char>(16, 0);  // eof_ came after the peer's goodbye
  std::vector<std::thread> senders_, receivers_;
  std::function<void()> wakeup_;  // set_wakeup (called under mu_)
};

struct TcpDomain::Impl {
  FirstFailure first;
  std::vector<std::unique_ptr<TcpPair>> pairs;
};

TcpDomain::TcpDomain(Store& store, int rank, int size, const std::vector<int>& peers, const TcpConfig& config,
                     const Deadline& deadline)
    : impl_(std::make_unique<Impl>()) {
  impl_->pairs.resize(size);
  if (peers.empty()) return;
  TcpConfig cfg = config;
  cfg.streams = std::max(1, std::min(cfg.streams, 16));
  net::Socket listener = net::listen_tcp("", 0);
  char cookie[16];
  while (::getrandom(cookie, sizeof(cookie), 0) != sizeof(cookie)) {}
  std::string cookie_hex;
  for (char c : cookie) {
    static const char* kHex = "0123456789abcdef";
    cookie_hex += kHex[uint8_t(c) >> 4];
    cookie_hex += kHex[uint8_t(c) & 15];
  }
  std::string addr = env::get_string("PARATRAIN_TCP_ADDR");
  if (addr.empty()) addr = net::host_address();
  store.set("tcp/" + std::to_string(rank),
            detail::concat(addr, " ", net::local_port(listener), " ", cookie_hex));
  std::vector<std::vector<net::Socket>> socks(size);
  // Connect to lower ranks.
  for (int p : peers) {
    if (p > rank) continue;
    std::istringstream is(store.get("tcp/" + std::to_string(p)));
    std::string host, phex;
    int port;
    is >> host >> port >> phex;
    for (int s = 0; s < cfg.streams; ++s) {
      net::Socket sock = net::connect_tcp(host, port, deadline);
      net::tune_socket(sock.fd(), true, 4 << 20);
      Hello h{kHelloMagic, rank, s, {}};
      for (int i = 0; i < 16; ++i) h.cookie[i] = static_cast<char>(std::stoi(phex.substr(2 * i, 2), nullptr, 16));
      net::write_full(sock.fd(), &h, sizeof(h), deadline, detail::concat("rank ", p));
      socks[p].push_back(std::move(sock));
    }
  }
  // Accept from higher ranks.
  size_t expected = 0;
  for (int p : peers)
    if (p > rank) expected += static_cast<size_t>(cfg.streams);
  std::vector<std::vector<net::Socket>> by_stream(size);
  for (int p : peers)
    if (p > rank) by_stream[p].resize(cfg.streams);
  size_t got = 0;
  while (got < expected) {
    net::Socket sock = net::accept_tcp(listener, deadline);
    Hello h{};
    try {
      net::read_full(sock.fd(), &h, sizeof(h), Deadline::after_seconds(10).earlier(deadline), "connecting peer");
    } catch (const Error&) {
      continue;
    }
    if (h.magic != kHelloMagic || std::memcmp(h.cookie, cookie, 16) != 0 || h.rank <= rank || h.rank >= size ||
        h.stream < 0 || h.stream >= cfg.streams || by_stream[h.rank][h.stream].valid())
      continue;  // not one of ours: drop it
    net::tune_socket(sock.fd(), true, 4 << 20);
    by_stream[h.rank][h.stream] = std::move(sock);
    ++got;
  }
  for (int p : peers)
    if (p > rank) socks[p] = std::move(by_stream[p]);
  for (int p : peers) impl_->pairs[p] = std::make_unique<TcpPair>(p, cfg, std::move(socks[p]), &impl_->first);
}

TcpDomain::~TcpDomain() = default;

Pair* TcpDomain::pair(int peer) { return impl_->pairs[peer].get(); }

}  // namespace paratrain::comm::tcp
