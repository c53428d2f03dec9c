// A point in time after which a blocking wait gives up. Every blocking call in comm takes one.
#pragma once

#include <chrono>
#include <cstdint>

namespace paratrain::comm {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  Deadline() : at_(Clock::time_point::max()) {}
  explicit Deadline(Clock::time_point at) : at_(at) {}
  static Deadline after_seconds(double s) {
    if (s <= 0 || s > 1e8) return Deadline();
    return Deadline(Clock::now() + std::chrono::microseconds(int64_t(s * 1e6)));
  }
  static Deadline after_ms(int64_t ms) { return Deadline(Clock::now() + std::chrono::milliseconds(ms)); }
  bool expired() const { return Clock::now() >= at_; }
  bool infinite() const { return at_ == Clock::time_point::max(); }
  // Milliseconds left, clamped to [0, cap].
  int64_t remaining_ms(int64_t cap = INT32_MAX) const {
    if (infinite()) return cap;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    if (ms < 0) return 0;
    return ms > cap ? cap : ms;
  }
  Clock::time_point at() const { return at_; }
  Deadline earlier(const Deadline& o) const { return at_ < o.at_ ? *this : o; }

 private:
  Clock::time_point at_;
};

}  // namespace paratrain::comm
