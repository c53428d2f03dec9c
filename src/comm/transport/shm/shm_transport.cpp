#include "comm/transport/shm/shm_transport.h"

#include <dirent.h>
#include <fcntl.h>
#include <immintrin.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

namespace paratrain::comm::shm {
namespace {

constexpr uint64_t kMagic = 0x7061726174726e31ull;  // "paratrn1"
constexpr size_t kPage = 4096;

struct alignas(64) SegmentHeader {
  uint64_t magic;
  int32_t pid;
  int32_t rank;
  std::atomic<uint64_t> heartbeat;
  // Set by the owner when its group ends cleanly, after everything it sent: from then on
  // its channels get no more data and no more freed slots, and its process may exit.
  std::atomic<uint32_t> closed;
  uint32_t slots;
  uint64_t slot_bytes;
  uint64_t channel_stride;
};

struct ChannelControl {
  alignas(64) std::atomic<uint32_t> head;  // slots published by the sender
  alignas(64) std::atomic<uint32_t> tail;  // slots freed by the receiver
  alignas(64) std::atomic<uint32_t> recv_sleeping;
  alignas(64) std::atomic<uint32_t> send_sleeping;
  alignas(64) uint64_t sizes[1];  // [slots], bytes in each slot
};

size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

size_t control_bytes(uint32_t slots) { return round_up(256 + 8 * size_t(slots), kPage); }

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* addr) { futex(addr, FUTEX_WAKE, INT32_MAX, nullptr); }
void futex_wait(std::atomic<uint32_t>* addr, uint32_t expected, int ms) {
  timespec ts{ms / 1000, (ms % 1000) * 1000000L};
  futex(addr, FUTEX_WAIT, expected, &ts);
}

std::string pid_namespace() {
  char buf[128] = {0};
  ssize_t n = ::readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

// 1 alive, 0 dead (gone or zombie).
bool pid_alive(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return false;
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 >= line.size()) return true;
  char state = line[close + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace

void remove_stale_segments() {
  DIR* d = ::opendir("/dev/shm");
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name.rfind("paratrain-", 0) != 0) continue;
    int pid = std::atoi(name.c_str() + 10);
    if (pid > 0 && !pid_alive(pid)) ::shm_unlink(("/" + name).c_str());
  }
  ::closedir(d);
}

class ShmPair;

struct ShmDomain::Impl {
  int rank = 0;
  ShmConfig config;
  uint32_t slots = 0;
  size_t stride = 0;
  std::string name;
  size_t seg_bytes = 0;
  char* mine = nullptr;
  struct Peer {
    int rank = -1;
    int pid = 0;
    bool check_pid = true;
    char* base = nullptr;
    size_t bytes = 0;
    uint64_t last_beat = 0;
    Clock::time_point last_change;
  };
  std::vector<Peer> peers;
  std::vector<std::unique_ptr<ShmPair>> pairs;  // indexed by global rank
  std::atomic<int> failed_peer{-1};
  std::mutex failure_mu;
  std::string failure;
  std::atomic<bool> stop{false};
  std::thread monitor;

  SegmentHeader* header(char* base) { return reinterpret_cast<SegmentHeader*>(base); }
  ChannelControl* channel(char* base, int sender) {
    return reinterpret_cast<ChannelControl*>(base + kPage + size_t(sender) * stride);
  }
  char* slot_data(char* base, int sender) {
    return base + kPage + size_t(sender) * stride + control_bytes(slots);
  }
  void fail(int peer, const std::string& why) {
    {
      std::lock_guard<std::mutex> l(failure_mu);
      if (failed_peer.load() >= 0) return;
      failure = why;
      failed_peer.store(peer);
    }
    wake_everyone();
  }
  void wake_everyone();
  [[noreturn]] void throw_failure() {
    std::lock_guard<std::mutex> l(failure_mu);
    throw PeerFailure(failed_peer.load(), failure);
  }
  bool closed(const Peer& p) { return header(p.base)->closed.load(std::memory_order_seq_cst) != 0; }
  // A peer whose process is gone (or a zombie) without having closed its group. The pid is
  // read before the flag: a peer that closed and then exited is seen closed, not dead.
  const Peer* dead_peer() {
    for (auto& p : peers)
      if (p.check_pid && !pid_alive(p.pid) && !closed(p)) return &p;
    return nullptr;
  }
  void fail_dead(const Peer& p) { fail(p.rank, detail::concat("rank ", p.rank, " (pid ", p.pid, ") died")); }
  // A wait on `peer`'s channel that can never complete because the peer closed its group.
  // A rank that died first is named instead (a neighbour may have left because of it).
  [[noreturn]] void fail_left(int peer) {
    if (const Peer* dead = dead_peer()) {
      fail_dead(*dead);
    } else {
      for (auto& p : peers)
        if (p.rank == peer)
          fail(peer, detail::concat("rank ", peer, " (pid ", p.pid, ") left the group (its process group was destroyed)"));
    }
    throw_failure();
  }
  void monitor_loop();
};

// One direction pair to a local peer.
class ShmPair : public Pair {
 public:
  ShmPair(ShmDomain::Impl* d, int peer, const SegmentHeader* peer_header, ChannelControl* send_ch, char* send_data,
          ChannelControl* recv_ch, char* recv_data)
      : d_(d), peer_(peer), peer_header_(peer_header), send_(send_ch), send_data_(send_data), recv_(recv_ch),
        recv_data_(recv_data) {
    send_head_ = send_->head.load();
    recv_tail_ = recv_->tail.load();
  }
  int peer() const override { return peer_; }
  size_t slot_bytes() const override { return d_->config.slot_bytes; }

  void* send_begin(const Deadline& deadline) override {
    // Wait while the ring is full: head - tail == slots.
    uint32_t slots = d_->slots;
    if (send_head_ - send_->tail.load(std::memory_order_acquire) >= slots)
      wait_until([&] { return send_head_ - send_->tail.load(std::memory_order_acquire) < slots; }, &send_->tail,
                 &send_->send_sleeping, [&] { return send_head_ - slots; }, deadline, "send slot to");
    return send_data_ + size_t(send_head_ % slots) * d_->config.slot_bytes;
  }
  void send_end(size_t bytes) override {
    send_->sizes[send_head_ % d_->slots] = bytes;
    ++send_head_;
    send_->head.store(send_head_, std::memory_order_seq_cst);
    if (send_->recv_sleeping.load(std::memory_order_seq_cst)) futex_wake(&send_->head);
  }
  const void* recv_begin(size_t* bytes, const Deadline& deadline) override {
    if (recv_->head.load(std::memory_order_acquire) == recv_tail_)
      wait_until([&] { return recv_->head.load(std::memory_order_acquire) != recv_tail_; }, &recv_->head,
                 &recv_->recv_sleeping, [&] { return recv_tail_; }, deadline, "data from");
    *bytes = recv_->sizes[recv_tail_ % d_->slots];
    return recv_data_ + size_t(recv_tail_ % d_->slots) * d_->config.slot_bytes;
  }
  void* try_send_begin() override {
    uint32_t slots = d_->slots;
    if (send_head_ - send_->tail.load(std::memory_order_acquire) < slots)
      return send_data_ + size_t(send_head_ % slots) * d_->config.slot_bytes;
    if (d_->failed_peer.load() >= 0) d_->throw_failure();
    return nullptr;
  }
  const void* try_recv_begin(size_t* bytes) override {
    if (recv_->head.load(std::memory_order_acquire) != recv_tail_) {
      *bytes = recv_->sizes[recv_tail_ % d_->slots];
      return recv_data_ + size_t(recv_tail_ % d_->slots) * d_->config.slot_bytes;
    }
    if (d_->failed_peer.load() >= 0) d_->throw_failure();
    return nullptr;
  }
  bool peer_left() override { return peer_header_->closed.load(std::memory_order_seq_cst) != 0; }
  void recv_end() override {
    ++recv_tail_;
    recv_->tail.store(recv_tail_, std::memory_order_seq_cst);
    if (recv_->send_sleeping.load(std::memory_order_seq_cst)) futex_wake(&recv_->tail);
  }

  // Wakes this rank's waiters on the pair (after a failure).
  void wake() {
    futex_wake(&send_->tail);
    futex_wake(&recv_->head);
  }
  // Wakes the peer's waiters on the pair (this rank closed: they re-check its flag).
  void wake_peer() {
    futex_wake(&send_->head);
    futex_wake(&recv_->tail);
  }

 private:
  template <typename Ready, typename Expected>
  void wait_until(Ready ready, std::atomic<uint32_t>* word, std::atomic<uint32_t>* sleeping, Expected expected,
                  const Deadline& deadline, const char* what) {
    // Spin ~100 us (the peer is usually on another core and a few hundred ns away), then
    // yield for ~2 ms (oversubscribed hosts), then sleep on the futex.
    auto start = Clock::now();
    for (;;) {
      for (int i = 0; i < 256; ++i) {
        if (ready()) return;
        _mm_pause();
      }
      if (Clock::now() - start > std::chrono::microseconds(100)) break;
    }
    while (Clock::now() - start < std::chrono::milliseconds(2)) {
      if (ready()) return;
      ::sched_yield();
    }
    for (;;) {
      if (ready()) return;
      if (d_->failed_peer.load() >= 0) d_->throw_failure();
      // A peer that closed its group published everything before its flag: if the wait is
      // still not satisfied after reading the flag, it never will be (its channel is drained,
      // or it will never free a slot). Waits on other pairs go on.
      if (peer_header_->closed.load(std::memory_order_seq_cst)) {
        if (ready()) return;
        d_->fail_left(peer_);
      }
      if (deadline.expired())
        throw PeerTimeout(peer_, detail::concat("timed out waiting for ", what, " rank ", peer_));
      sleeping->store(1, std::memory_order_seq_cst);
      if (!ready()) futex_wait(word, expected(), static_cast<int>(std::min<int64_t>(20, deadline.remaining_ms() + 1)));
      sleeping->store(0, std::memory_order_relaxed);
    }
  }

  ShmDomain::Impl* d_;
  int peer_;
  const SegmentHeader* peer_header_;
  ChannelControl* send_;
  char* send_data_;
  ChannelControl* recv_;
  char* recv_data_;
  uint32_t send_head_ = 0;
  uint32_t recv_tail_ = 0;
};

void ShmDomain::Impl::wake_everyone() {
  for (auto& p : pairs)
    if (p) p->wake();
}

void ShmDomain::Impl::monitor_loop() {
  const auto period = std::chrono::milliseconds(20);
  while (!stop.load()) {
    std::this_thread::sleep_for(period);
    header(mine)->heartbeat.fetch_add(1, std::memory_order_relaxed);
    if (failed_peer.load() >= 0) continue;
    auto now = Clock::now();
    // Deaths first, so a survivor names the rank that died, not a neighbour that left
    // after noticing it. A death fails every wait of the group. A peer that closed its group
    // is not dead when its process exits or its heartbeat stops: only the waits on its own
    // pair fail, once drained (ShmPair::wait_until).
    if (const Peer* dead = dead_peer()) {
      fail_dead(*dead);
      continue;
    }
    for (auto& p : peers) {
      uint64_t beat = header(p.base)->heartbeat.load(std::memory_order_relaxed);
      if (beat != p.last_beat) {
        p.last_beat = beat;
        p.last_change = now;
      } else if (std::chrono::duration<double>(now - p.last_change).count() > config.peer_timeout_s && !closed(p)) {
        fail(p.rank, detail::concat("rank ", p.rank, " (pid ", p.pid, ") stopped responding for ",
                                    config.peer_timeout_s, " s"));
        break;
      }
    }
  }
}

ShmDomain::ShmDomain(Store& store, int rank, int size, const std::vector<int>& peers, const ShmConfig& config,
                     const Deadline& deadline)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.rank = rank;
  d.config = config;
  d.config.slot_bytes = round_up(std::max<size_t>(config.slot_bytes, 4096), 64);
  d.slots = static_cast<uint32_t>(std::max<size_t>(2, config.staging_bytes / d.config.slot_bytes));
  d.stride = control_bytes(d.slots) + round_up(size_t(d.slots) * d.config.slot_bytes, kPage);
  d.seg_bytes = kPage + d.stride * size_t(size);
  d.pairs.resize(size);
  if (peers.empty()) return;

  remove_stale_segments();
  uint8_t rnd[8];
  while (::getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd)) {}
  std::ostringstream nm;
  nm << "/paratrain-" << ::getpid() << "-r" << rank << "-";
  for (uint8_t b : rnd) nm << std::hex << int(b >> 4) << int(b & 15);
  d.name = nm.str();
  int fd = ::shm_open(d.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) PT_THROW(IoError, "shm_open(", d.name, "): ", std::strerror(errno));
  if (::ftruncate(fd, static_cast<off_t>(d.seg_bytes)) != 0) {
    int e = errno;
    ::close(fd);
    ::shm_unlink(d.name.c_str());
    PT_THROW(IoError, "ftruncate of shared memory ", d.name, " to ", d.seg_bytes, " bytes: ", std::strerror(e));
  }
  void* m = ::mmap(nullptr, d.seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) {
    ::shm_unlink(d.name.c_str());
    PT_THROW(IoError, "mmap of shared memory: ", std::strerror(errno));
  }
  d.mine = static_cast<char*>(m);
  auto* h = new (d.mine) SegmentHeader();
  h->magic = kMagic;
  h->pid = ::getpid();
  h->rank = rank;
  h->slots = d.slots;
  h->slot_bytes = d.config.slot_bytes;
  h->channel_stride = d.stride;
  for (int p : peers) new (d.channel(d.mine, p)) ChannelControl();

  bool unlinked = false;
  try {
    store.set("shm/" + std::to_string(rank), detail::concat(d.name, " ", ::getpid(), " ", pid_namespace()));
    std::string my_ns = pid_namespace();
    for (int p : peers) {
      std::string v = store.get("shm/" + std::to_string(p));
      std::istringstream is(v);
      Impl::Peer peer;
      std::string pname, pns;
      is >> pname >> peer.pid >> pns;
      peer.rank = p;
      peer.check_pid = (pns == my_ns);
      int pfd = ::shm_open(pname.c_str(), O_RDWR, 0600);
      if (pfd < 0) PT_THROW(CommError, "cannot open rank ", p, "'s shared memory ", pname, ": ", std::strerror(errno));
      struct stat st;
      ::fstat(pfd, &st);
      peer.bytes = static_cast<size_t>(st.st_size);
      void* pm = ::mmap(nullptr, peer.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pfd, 0);
      ::close(pfd);
      if (pm == MAP_FAILED) PT_THROW(IoError, "mmap of rank ", p, "'s shared memory: ", std::strerror(errno));
      peer.base = static_cast<char*>(pm);
      auto* ph = d.header(peer.base);
      if (ph->magic != kMagic || ph->slots != d.slots || ph->slot_bytes != d.config.slot_bytes)
        PT_THROW(CommError, "rank ", p, " uses a different shared-memory layout (slots ", ph->slots, " x ",
                 ph->slot_bytes, " bytes vs ", d.slots, " x ", d.config.slot_bytes,
                 "); set PARATRAIN_SHM_STAGING_BYTES / PARATRAIN_SEGMENT_BYTES alike on all ranks");
      peer.last_beat = ph->heartbeat.load();
      peer.last_change = Clock::now();
      d.peers.push_back(peer);
    }
    store.set("shm_mapped/" + std::to_string(rank), "1");
    std::vector<std::string> keys;
    for (int p : peers) keys.push_back("shm_mapped/" + std::to_string(p));
    store.wait(keys, std::chrono::milliseconds(deadline.remaining_ms()));
    ::shm_unlink(d.name.c_str());
    unlinked = true;
  } catch (...) {
    if (!unlinked) ::shm_unlink(d.name.c_str());
    for (auto& p : d.peers) ::munmap(p.base, p.bytes);
    ::munmap(d.mine, d.seg_bytes);
    throw;
  }
  for (auto& p : d.peers) {
    d.pairs[p.rank] = std::make_unique<ShmPair>(&d, p.rank, d.header(p.base), d.channel(p.base, rank),
                                                d.slot_data(p.base, rank), d.channel(d.mine, p.rank),
                                                d.slot_data(d.mine, p.rank));
  }
  d.monitor = std::thread([&d] { d.monitor_loop(); });
}

ShmDomain::~ShmDomain() {
  Impl& d = *impl_;
  // The group's calls are over (the engine drained them), so everything this rank sends has
  // been published: peers may consume it after this point, even after this process exits.
  if (d.mine) d.header(d.mine)->closed.store(1, std::memory_order_seq_cst);
  for (auto& p : d.pairs)
    if (p) p->wake_peer();
  d.stop.store(true);
  if (d.monitor.joinable()) d.monitor.join();
  d.pairs.clear();
  for (auto& p : d.peers) ::munmap(p.base, p.bytes);
  if (d.mine) ::munmap(d.mine, d.seg_bytes);
}

Pair* ShmDomain::pair(int peer) { return impl_->pairs[peer].get(); }
size_t ShmDomain::slot_bytes() const { return impl_->config.slot_bytes; }

}  // namespace paratrain::comm::shm
