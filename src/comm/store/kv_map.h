// The key space shared by HashStore and TcpStoreServer: a map under a mutex with a condition
// variable that wakes waiters whenever a key is written. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace paratrain::comm::store {

class KvMap {
 public:
  void set(const std::string& key, const std::string& value) {
    { std::lock_guard<std::mutex> l(mu_); map_[key] = value; }
    cv_.notify_all();
  }
  int64_t add(const std::string& key, int64_t delta) {
    int64_t v = 0;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = map_.find(key);
      if (it != map_.end() && !it->second.empty()) v = std::stoll(it->second);
      v += delta;
      map_[key] = std::to_string(v);
    }
    cv_.notify_all();
    return v;
  }
  std::string compare_set(const std::string& key, const std::string& expected, const std::string& desired) {
    std::string result;
    bool changed = false;
    {
      std::lock_guard<std::mutex> l(mu_);
      auto it = map_.find(key);
      if (it == map_.end()) {
        if (expected.empty()) { map_[key] = desired; result = desired; changed = true; }
        else result = expected;  // c10d semantics: a missing key returns `expected`
      } else if (it->second == expected) {
        it->second = desired; result = desired; changed = true;
      } else {
        result = it->second;
      }
    }
    if (changed) cv_.notify_all();
    return result;
  }
  bool check(const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> l(mu_);
    return has_all(keys);
  }
  // True if all keys appeared before the deadline; `stop` aborts early (returns false).
  bool wait(const std::vector<std::string>& keys, std::chrono::steady_clock::time_point deadline,
            const bool* stop = nullptr) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_until(l, deadline, [&] { return (stop && *stop) || has_all(keys); }) && !(stop && *stop);
  }
  bool get(const std::string& key, std::string* out) {
    std::lock_guard<std::mutex> l(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return false;
    *out = it->second;
    return true;
  }
  bool erase(const std::string& key) {
    std::lock_guard<std::mutex> l(mu_);
    return map_.erase(key) > 0;
  }
  int64_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return static_cast<int64_t>(map_.size());
  }
  void wake_all() { { std::lock_guard<std::mutex> l(mu_); } cv_.notify_all(); }

 private:
  bool has_all(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (!map_.count(k)) return false;
    return true;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
};

}  // namespace paratrain::comm::store
