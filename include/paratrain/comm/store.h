// Key-value stores where the ranks of a job meet (rendezvous), modelled on PyTorch c10d.
//
// Store is the interface: string keys, byte-string values. set() overwrites; get() waits
// until the key exists (up to the store's timeout); add() treats the value as a decimal
// integer (a missing key counts as 0) and returns the new value; compare_set() writes
// `desired` only if the current value equals `expected` (a missing key matches an empty
// `expected`) and returns the value after the call; wait() blocks until every key exists.
// Every blocking call has a deadline and throws TimeoutError naming the keys it waited for.
//
// TcpStoreServer hosts the keys over TCP, in a thread of rank 0 or in the launcher. Every
// connection first proves it holds the job's token (PARATRAIN_TOKEN): the server sends a
// random nonce, the client answers HMAC-SHA256(token, nonce) and challenges the server the
// same way, so the token never crosses the wire and a client never talks to an impostor. A
// client with the wrong token is refused (CommError on that client, naming the cause);
// the server keeps serving everyone else.
//
// Thread-safety: every Store in this file may be used from several threads at once (a
// TcpStore serialises its requests on one connection). Lifetimes: a PrefixStore keeps its
// base alive (shared_ptr). Destroying a TcpStoreServer closes every client connection;
// clients then get CommError.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace paratrain::comm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Waits for the key up to timeout() (TimeoutError).
  virtual std::string get(const std::string& key) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  virtual std::string compare_set(const std::string& key, const std::string& expected,
                                  const std::string& desired) = 0;
  // True if every key exists now (no waiting).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until every key exists; TimeoutError after `timeout`.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  // Removes a key; true if it existed.
  virtual bool delete_key(const std::string& key) = 0;
  virtual int64_t num_keys() = 0;

  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

 protected:
  std::chrono::milliseconds timeout_{300000};
};

// Serves a key space over TCP until destroyed. Binds host:port (port 0 picks a free one).
class TcpStoreServer {
 public:
  TcpStoreServer(const std::string& host, int port, std::string token);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;
  // Connections refused so far for a bad token (for tests and diagnostics).
  int64_t refused_connections() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A client of a TcpStoreServer. Connects (retrying until connect_timeout while the server
// starts) and authenticates in the constructor; CommError if the token is refused.
class TcpStore : public Store {
 public:
  TcpStore(const std::string& host, int port, std::string token,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(300000),
           std::chrono::milliseconds connect_timeout = std::chrono::milliseconds(60000));
  ~TcpStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// An in-process store (threads of one process meeting, e.g. in tests).
class HashStore : public Store {
 public:
  HashStore();
  ~HashStore() override;
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Prepends "<prefix>/" to every key of a base store (separate key spaces per group).
class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  std::string compare_set(const std::string& key, const std::string& expected,
                          const std::string& desired) override;
  bool check(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  using Store::wait;
  bool delete_key(const std::string& key) override;
  int64_t num_keys() override;
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string k(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> k(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace paratrain::comm
