// Work: the handle of one asynchronous communication call (like c10d's Work).
//
// Every ProcessGroup call returns a Work at once; the operations run in the order the calls
// were made (a send/recv starts in that order and then completes in the background, while
// later calls run: process_group.h). wait() blocks until it has finished and rethrows its failure (CommError,
// TimeoutError, ...); is_completed() polls. A Work whose wait() is called before the
// group's background thread picked it up runs on the waiting thread itself (in the same
// order), which saves a thread hand-off for small messages; the background thread runs
// large operations at once and small ones nobody waits for shortly after (about 1 ms).
//
// Thread-safety: all methods may be called from any thread. Lifetime: the buffers passed to
// the call must stay valid and untouched until the Work is completed; the Work keeps no
// reference to its group, and a group's destructor completes (or fails) all its Works.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace paratrain::comm {

class FlightRecorder;

class Work {
 public:
  explicit Work(std::string description) : description_(std::move(description)), described_(true) {}
  // The description is made on first use (saves formatting it for every small call).
  explicit Work(std::function<std::string()> describe) : describe_(std::move(describe)) {}
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;
  virtual ~Work() = default;

  // True once the operation finished, successfully or not.
  bool is_completed() const { return done_.load(std::memory_order_acquire); }
  // Waits until the operation finished and rethrows its failure. A positive timeout bounds
  // the wait itself (TimeoutError naming the operation); zero waits for the operation's own
  // deadline, which every operation has.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));
  // Orders later work on the compute stream of the call's GPU after this call without blocking
  // the host, where the backend can (nccl: NcclWork::stream_wait()); every other backend's
  // buffers are host memory and this is wait(timeout). A failure that happens after it
  // returned shows at a later wait() or error() (and fails the group's later calls).
  virtual void wait_on_device(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) { wait(timeout); }
  // wait(timeout) for a clean-up path whose caller does not report the failure (the Work's
  // owner does, through wait() or error()): never throws.
  void wait_ignoring_failure(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) noexcept;
  // The failure, or nullptr (also nullptr while running).
  std::exception_ptr error() const;
  // The failure's message, or "".
  std::string error_message() const;
  // "allreduce #12 f32 x 1024 (4096 bytes)".
  const std::string& description() const;
  // When the operation finished (steady clock; meaningful once is_completed()): how overlap
  // is measured (the caller knows when it issued the call and when it began to wait).
  std::chrono::steady_clock::time_point finished_at() const {
    std::lock_guard<std::mutex> l(mu_);
    return finished_at_;
  }

  // ---- for backends ----
  void finish(std::exception_ptr error = nullptr);
  // Called by wait() before blocking: lets the backend run queued work on this thread.
  void set_helper(std::function<void(Work*)> helper) { helper_ = std::move(helper); }
  // Runs `f` once the Work has finished: at once on this thread if it has, else on the thread
  // that finishes it, right after (so `f` must be short and must not wait: it runs on a
  // backend's progress thread). For layers over a backend (comm/device_staging.h).
  void on_finished(std::function<void()> f);
  // finish() tells `recorder` (flight_recorder.h) that call `id` completed or failed. Set
  // before the Work is handed out; the recorder outlives the Work.
  void set_record(FlightRecorder* recorder, uint64_t id) {
    recorder_ = recorder;
    record_id_ = id;
  }
  uint64_t record_id() const { return record_id_; }

 private:
  mutable std::string description_;
  mutable std::function<std::string()> describe_;
  mutable std::atomic<bool> described_{false};
  mutable std::mutex describe_mu_;
  std::atomic<bool> done_{false};
  std::exception_ptr error_;
  std::chrono::steady_clock::time_point finished_at_{};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::function<void(Work*)> helper_;
  std::vector<std::function<void()>> on_finished_;  // mu_
  FlightRecorder* recorder_ = nullptr;
  uint64_t record_id_ = 0;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace paratrain::comm
