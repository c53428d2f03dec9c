#include "paratrain/data/prefetcher.h"

#include <chrono>

#include "paratrain/base/error.h"
#include "paratrain/base/trace.h"

namespace paratrain::data {

std::string BatchRequest::str() const {
  return detail::concat("step ", step, ", micro-step ", micro_step, ", items [", first, ", ", first + count, ")");
}

BatchPrefetcher::BatchPrefetcher(FillFn fill, double timeout_s) : fill_(std::move(fill)), timeout_s_(timeout_s) {
  PT_CHECK(fill_, "BatchPrefetcher needs a fill function");
  PT_CHECK(timeout_s_ > 0, "BatchPrefetcher timeout must be positive");
  worker_ = std::thread([this] { worker_loop(); });
}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void BatchPrefetcher::worker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    std::shared_ptr<Slot> slot;
    cv_.wait(lock, [&] {
      if (stop_) return true;
      for (auto& s : queue_)
        if (s->state == Slot::State::Queued) {
          slot = s;
          return true;
        }
      return false;
    });
    if (stop_) return;
    slot->state = Slot::State::Filling;
    const BatchRequest req = slot->batch.request;
    lock.unlock();
    std::exception_ptr error;
    try {
      if (trace::enabled()) trace::set_thread_name("data loader");
      trace::Span span("load batch", "data");
      span.num("step", static_cast<double>(req.step)).num("micro_step", static_cast<double>(req.micro_step));
      fill_(req, slot->batch.inputs, slot->batch.targets);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    slot->error = error;
    slot->state = Slot::State::Ready;
    cv_.notify_all();
  }
}

std::shared_ptr<BatchPrefetcher::Slot> BatchPrefetcher::take_free_slot() {
  if (free_.empty()) return std::make_shared<Slot>();
  auto s = std::move(free_.back());
  free_.pop_back();
  s->state = Slot::State::Queued;
  s->error = nullptr;
  return s;
}

void BatchPrefetcher::enqueue(const BatchRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto slot = take_free_slot();
    slot->batch.request = request;
    queue_.push_back(std::move(slot));
  }
  cv_.notify_all();
}

void BatchPrefetcher::drop_announced(std::unique_lock<std::mutex>& lock) {
  // The worker may be filling one of them: wait for it (it owns that slot's tensors).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s_);
  const bool idle = cv_.wait_until(lock, deadline, [&] {
    for (auto& s : queue_)
      if (s->state == Slot::State::Filling) return false;
    return true;
  });
  if (!idle)
    PT_THROW(TimeoutError, "data loader: the background worker did not finish a batch within ", timeout_s_, " s");
  for (auto& s : queue_) free_.push_back(std::move(s));
  queue_.clear();
}

const Batch& BatchPrefetcher::next(const BatchRequest& request) {
  std::unique_lock<std::mutex> lock(mu_);
  if (in_use_) free_.push_back(std::move(in_use_));
  if (queue_.empty() || !(queue_.front()->batch.request == request)) {
    // Not what was announced (or nothing was): the plan changed; prepare exactly this one.
    drop_announced(lock);
    auto slot = take_free_slot();
    slot->batch.request = request;
    queue_.push_back(std::move(slot));
    cv_.notify_all();
  }
  auto& front = queue_.front();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t t0_ns = trace::enabled() ? trace::now_ns() : 0;
  const bool ready = cv_.wait_until(lock, t0 + std::chrono::duration<double>(timeout_s_),
                                    [&] { return front->state == Slot::State::Ready; });
  wait_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (trace::enabled())  // the wait for this batch (near zero when the worker was ahead)
    trace::complete("data wait", "data", trace::this_thread_track(), t0_ns, trace::now_ns(),
                    trace::Args()
                        .num("step", static_cast<double>(request.step))
                        .num("micro_step", static_cast<double>(request.micro_step)));
  if (!ready)
    PT_THROW(TimeoutError, "data loader: the batch of ", request.str(), " was not ready within ", timeout_s_,
             " s (the background worker is stuck)");
  in_use_ = std::move(front);
  queue_.pop_front();
  if (in_use_->error) {
    auto e = in_use_->error;
    in_use_->error = nullptr;
    std::rethrow_exception(e);
  }
  return in_use_->batch;
}

double BatchPrefetcher::take_wait_seconds() {
  std::lock_guard<std::mutex> lock(mu_);
  const double w = wait_s_;
  wait_s_ = 0;
  return w;
}

size_t BatchPrefetcher::announced() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace paratrain::data
