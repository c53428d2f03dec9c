// TcpStoreServer and TcpStore: the store over TCP.
//
// Wire protocol (all integers little-endian):
//   handshake  server -> client  "PTSTORE1" nonce_s[32]
//              client -> server  "PTSTORE1" HMAC(token, "client" nonce_s)[32] nonce_c[32]
//              server -> client  1 HMAC(token, "server" nonce_c)[32]     (accepted)
//                             or 0 u32 len, message                       (refused, then closed)
//   request    u8 op, arguments (strings as u32 length + bytes, integers as i64)
//   response   u8 status (0 ok, 1 timed out), results
// One thread per connection on the server; waits are served by the server with the
// client's timeout so a timed-out wait never leaves a stray reply on the connection.
#include <sys/random.h>

#include <atomic>
#include <cstring>
#include <list>
#include <mutex>
#include <thread>

#include "comm/net/socket.h"
#include "comm/store/kv_map.h"
#include "comm/store/sha256.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm {
namespace {

constexpr char kMagic[8] = {'P', 'T', 'S', 'T', 'O', 'R', 'E', '1'};
constexpr uint32_t kMaxString = 256u << 20;
enum Op : uint8_t { kSet = 1, kGet, kAdd, kCas, kCheck, kWait, kDelete, kNumKeys };

store::Digest random_nonce() {
  store::Digest d;
  size_t got = 0;
  while (got < d.size()) {
    ssize_t r = ::getrandom(d.data() + got, d.size() - got, 0);
    if (r > 0) got += static_cast<size_t>(r);
  }
  return d;
}

std::string tagged(const char* tag, const store::Digest& nonce) {
  return std::string(tag) + std::string(reinterpret_cast<const char*>(nonce.data()), nonce.size());
}

// A buffered request/response codec over a socket.
struct Wire {
  int fd;
  std::string what;
  Deadline deadline;
  std::string out;

  void put_u8(uint8_t v) { out.push_back(static_cast<char>(v)); }
  void put_i64(int64_t v) { out.append(reinterpret_cast<const char*>(&v), 8); }
  void put_str(const std::string& s) {
    uint32_t n = static_cast<uint32_t>(s.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out.append(s);
  }
  void flush() {
    net::write_full(fd, out.data(), out.size(), deadline, what);
    out.clear();
  }
  uint8_t u8() { uint8_t v; net::read_full(fd, &v, 1, deadline, what); return v; }
  int64_t i64() { int64_t v; net::read_full(fd, &v, 8, deadline, what); return v; }
  std::string str() {
    uint32_t n;
    net::read_full(fd, &n, 4, deadline, what);
    if (n > kMaxString) PT_THROW(CommError, "store: oversized string (", n, " bytes) from ", what);
    std::string s(n, '\0');
    if (n) net::read_full(fd, s.data(), n, deadline, what);
    return s;
  }
};

std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < 8; ++i) s += (i ? ", " : "") + keys[i];
  if (keys.size() > 8) s += ", ...";
  return s;
}

}  // namespace

// ------------------------------------------------------------------ server
struct TcpStoreServer::Impl {
  std::string token;
  net::Socket listener;
  int port = 0;
  store::KvMap map;
  bool stop = false;  // guarded by the map's waits via wake_all
  std::atomic<bool> stopping{false};
  std::atomic<int64_t> refused{0};
  std::thread accept_thread;
  std::mutex conns_mu;
  std::list<std::pair<std::shared_ptr<net::Socket>, std::thread>> conns;

  void accept_loop() {
    while (!stopping.load()) {
      net::Socket s;
      try {
        s = net::accept_tcp(listener, Deadline::after_ms(200));
      } catch (const TimeoutError&) {
        continue;
      } catch (const Error&) {
        if (stopping.load()) return;
        continue;
      }
      net::tune_socket(s.fd());
      auto sock = std::make_shared<net::Socket>(std::move(s));
      std::lock_guard<std::mutex> l(conns_mu);
      if (stopping.load()) return;
      conns.emplace_back(sock, std::thread([this, sock] { serve(sock); }));
    }
  }

  bool handshake(Wire& w) {
    store::Digest nonce_s = random_nonce();
    w.out.append(kMagic, 8);
    w.out.append(reinterpret_cast<const char*>(nonce_s.data()), 32);
    w.flush();
    char magic[8];
    net::read_full(w.fd, magic, 8, w.deadline, w.what);
    store::Digest proof, nonce_c;
    net::read_full(w.fd, proof.data(), 32, w.deadline, w.what);
    net::read_full(w.fd, nonce_c.data(), 32, w.deadline, w.what);
    bool ok = std::memcmp(magic, kMagic, 8) == 0 &&
              store::constant_time_equal(proof, store::hmac_sha256(token, tagged("client", nonce_s)));
    if (!ok) {
      refused.fetch_add(1);
      w.put_u8(0);
      w.put_str(std::memcmp(magic, kMagic, 8) != 0
                    ? "not a paratrain store client (bad protocol magic)"
                    : "authentication failed: the client's PARATRAIN_TOKEN does not match the job's token");
      w.flush();
      return false;
    }
    store::Digest mine = store::hmac_sha256(token, tagged("server", nonce_c));
    w.put_u8(1);
    w.out.append(reinterpret_cast<const char*>(mine.data()), 32);
    w.flush();
    return true;
  }

  void serve(std::shared_ptr<net::Socket> sock) {
    Wire w{sock->fd(), "store client", Deadline::after_seconds(30), {}};
    try {
      if (!handshake(w)) return;
      w.deadline = Deadline();
      for (;;) {
        uint8_t op = w.u8();
        switch (op) {
          case kSet: {
            std::string k = w.str(), v = w.str();
            map.set(k, v);
            w.put_u8(0);
            break;
          }
          case kGet: {
            std::string k = w.str();
            int64_t ms = w.i64();
            bool ok = map.wait({k}, Clock::now() + std::chrono::milliseconds(ms), &stop);
            std::string v;
            if (ok) ok = map.get(k, &v);
            w.put_u8(ok ? 0 : 1);
            if (ok) w.put_str(v);
            break;
          }
          case kAdd: {
            std::string k = w.str();
            int64_t d = w.i64();
            int64_t v;
            try {
              v = map.add(k, d);
            } catch (const std::exception&) {
              w.put_u8(2);
              w.put_str("value of key '" + k + "' is not an integer");
              break;
            }
            w.put_u8(0);
            w.put_i64(v);
            break;
          }
          case kCas: {
            std::string k = w.str(), e = w.str(), d = w.str();
            w.put_u8(0);
            w.put_str(map.compare_set(k, e, d));
            break;
          }
          case kCheck:
          case kWait: {
            uint32_t n = static_cast<uint32_t>(w.i64());
            if (n > 1000000) PT_THROW(CommError, "store: too many keys");
            std::vector<std::string> keys(n);
            for (auto& k : keys) k = w.str();
            if (op == kCheck) {
              w.put_u8(0);
              w.put_u8(map.check(keys) ? 1 : 0);
            } else {
              int64_t ms = w.i64();
              bool ok = map.wait(keys, Clock::now() + std::chrono::milliseconds(ms), &stop);
              w.put_u8(ok ? 0 : 1);
            }
            break;
          }
          case kDelete: {
            std::string k = w.str();
            w.put_u8(0);
            w.put_u8(map.erase(k) ? 1 : 0);
            break;
          }
          case kNumKeys:
            w.put_u8(0);
            w.put_i64(map.size());
            break;
          default:
            return;  // protocol error: drop the connection
        }
        w.deadline = Deadline::after_seconds(30);
        w.flush();
        w.deadline = Deadline();
      }
    } catch (const std::exception&) {
      // The client went away or misbehaved; its connection ends, the server keeps serving.
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port, std::string token)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  impl_->listener = net::listen_tcp(host, port);
  impl_->port = net::local_port(impl_->listener);
  impl_->accept_thread = std::thread([this] { impl_->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  impl_->stopping.store(true);
  impl_->stop = true;
  impl_->map.wake_all();
  if (impl_->accept_thread.joinable()) impl_->accept_thread.join();
  std::list<std::pair<std::shared_ptr<net::Socket>, std::thread>> conns;
  {
    std::lock_guard<std::mutex> l(impl_->conns_mu);
    conns.swap(impl_->conns);
  }
  for (auto& c : conns) c.first->shutdown();
  impl_->map.wake_all();
  for (auto& c : conns)
    if (c.second.joinable()) c.second.join();
}

int TcpStoreServer::port() const { return impl_->port; }
int64_t TcpStoreServer::refused_connections() const { return impl_->refused.load(); }

// ------------------------------------------------------------------ client
struct TcpStore::Impl {
  std::string host;
  int port;
  std::string token;
  net::Socket sock;
  std::mutex mu;

  Wire wire(std::chrono::milliseconds timeout) {
    return Wire{sock.fd(), "store server " + host + ":" + std::to_string(port),
                Deadline(Clock::now() + timeout + std::chrono::seconds(30)), {}};
  }
};

TcpStore::TcpStore(const std::string& host, int port, std::string token, std::chrono::milliseconds timeout,
                   std::chrono::milliseconds connect_timeout)
    : impl_(std::make_unique<Impl>()) {
  timeout_ = timeout;
  impl_->host = host;
  impl_->port = port;
  impl_->token = std::move(token);
  Deadline dl(Clock::now() + connect_timeout);
  impl_->sock = net::connect_tcp(host, port, dl);
  std::string where = host + ":" + std::to_string(port);
  Wire w{impl_->sock.fd(), "store server " + where, Deadline(Clock::now() + connect_timeout), {}};
  try {
    char magic[8];
    net::read_full(w.fd, magic, 8, w.deadline, w.what);
    if (std::memcmp(magic, kMagic, 8) != 0)
      PT_THROW(CommError, "store at ", where, " is not a paratrain store (bad protocol magic)");
    store::Digest nonce_s;
    net::read_full(w.fd, nonce_s.data(), 32, w.deadline, w.what);
    store::Digest proof = store::hmac_sha256(impl_->token, tagged("client", nonce_s));
    store::Digest nonce_c = random_nonce();
    w.out.append(kMagic, 8);
    w.out.append(reinterpret_cast<const char*>(proof.data()), 32);
    w.out.append(reinterpret_cast<const char*>(nonce_c.data()), 32);
    w.flush();
    uint8_t ok = w.u8();
    if (ok != 1) {
      std::string why = w.str();
      PT_THROW(CommError, "store at ", where, " refused this client: ", why);
    }
    store::Digest server_proof;
    net::read_full(w.fd, server_proof.data(), 32, w.deadline, w.what);
    if (!store::constant_time_equal(server_proof, store::hmac_sha256(impl_->token, tagged("server", nonce_c))))
      PT_THROW(CommError, "store at ", where, " could not prove it holds the job's PARATRAIN_TOKEN; refusing it");
  } catch (const CommError& e) {
    std::string m = e.what();
    if (m.find("refused") == std::string::npos && m.find("prove") == std::string::npos)
      PT_THROW(CommError, "store at ", where, " closed the connection during authentication (", m,
               "); is PARATRAIN_TOKEN the job's token?");
    throw;
  }
}

TcpStore::~TcpStore() = default;

void TcpStore::set(const std::string& key, const std::string& value) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kSet); w.put_str(key); w.put_str(value); w.flush();
  w.u8();
}

std::string TcpStore::get(const std::string& key) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kGet); w.put_str(key); w.put_i64(timeout_.count()); w.flush();
  if (w.u8() != 0) PT_THROW(TimeoutError, "store: timed out after ", timeout_.count(), " ms waiting for key '", key, "'");
  return w.str();
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kAdd); w.put_str(key); w.put_i64(delta); w.flush();
  uint8_t st = w.u8();
  if (st != 0) PT_THROW(InputError, "store: add: ", w.str());
  return w.i64();
}

std::string TcpStore::compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kCas); w.put_str(key); w.put_str(expected); w.put_str(desired); w.flush();
  w.u8();
  return w.str();
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kCheck); w.put_i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.put_str(k);
  w.flush();
  w.u8();
  return w.u8() != 0;
}

void TcpStore::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout);
  w.put_u8(kWait); w.put_i64(static_cast<int64_t>(keys.size()));
  for (const auto& k : keys) w.put_str(k);
  w.put_i64(timeout.count());
  w.flush();
  if (w.u8() != 0)
    PT_THROW(TimeoutError, "store: timed out after ", timeout.count(), " ms waiting for keys [", join_keys(keys), "]");
}

bool TcpStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kDelete); w.put_str(key); w.flush();
  w.u8();
  return w.u8() != 0;
}

int64_t TcpStore::num_keys() {
  std::lock_guard<std::mutex> l(impl_->mu);
  Wire w = impl_->wire(timeout_);
  w.put_u8(kNumKeys); w.flush();
  w.u8();
  return w.i64();
}

}  // namespace paratrain::comm
