#include "paratrain/comm/work.h"

#include <immintrin.h>

#include "paratrain/base/error.h"
#include "paratrain/comm/flight_recorder.h"

namespace paratrain::comm {

const std::string& Work::description() const {
  if (!described_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> l(describe_mu_);
    if (!described_.load(std::memory_order_relaxed)) {
      if (describe_) description_ = describe_();
      describe_ = nullptr;
      described_.store(true, std::memory_order_release);
    }
  }
  return description_;
}

void Work::finish(std::exception_ptr error) {
  if (recorder_) recorder_->finished(record_id_, error);
  std::vector<std::function<void()>> then;
  {
    std::lock_guard<std::mutex> l(mu_);
    error_ = error;
    finished_at_ = std::chrono::steady_clock::now();
    done_.store(true, std::memory_order_release);
    then.swap(on_finished_);
  }
  cv_.notify_all();
  for (auto& f : then) f();
}

void Work::on_finished(std::function<void()> f) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!is_completed()) {
      on_finished_.push_back(std::move(f));
      return;
    }
  }
  f();
}

void Work::wait_ignoring_failure(std::chrono::milliseconds timeout) noexcept {
  try {
    wait(timeout);
  } catch (...) {  // the Work's owner reports it
  }
}

void Work::wait(std::chrono::milliseconds timeout) {
  if (!is_completed() && helper_) helper_(this);
  for (int i = 0; i < 2000 && !is_completed(); ++i) _mm_pause();
  if (!is_completed()) {
    std::unique_lock<std::mutex> l(mu_);
    if (timeout.count() > 0) {
      if (!cv_.wait_for(l, timeout, [&] { return is_completed(); })) {
        l.unlock();  // description() may format a lazy description (its own lock)
        PT_THROW(TimeoutError, description(), " did not complete within ", timeout.count(), " ms");
      }
    } else {
      // The operation has its own deadline; it always finishes.
      cv_.wait(l, [&] { return is_completed(); });
    }
  }
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> l(mu_);
    e = error_;
  }
  if (e) std::rethrow_exception(e);
}

std::exception_ptr Work::error() const {
  std::lock_guard<std::mutex> l(mu_);
  return error_;
}

std::string Work::error_message() const {
  std::exception_ptr e = error();
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace paratrain::comm
