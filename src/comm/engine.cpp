#include "comm/engine.h"

#include "paratrain/base/error.h"

namespace paratrain::comm {
namespace {
using SteadyClock = std::chrono::steady_clock;
constexpr auto kPoll = std::chrono::microseconds(500);
constexpr auto kLargeGrace = std::chrono::microseconds(50);
constexpr auto kIdle = std::chrono::milliseconds(200);
}  // namespace

Engine::Engine() { thread_ = std::thread([this] { loop(); }); }

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr Engine::submit(std::string description, std::function<void()> fn, Size size) {
  return enqueue(std::make_shared<Work>(std::move(description)), std::move(fn), size);
}

WorkPtr Engine::submit(std::function<std::string()> describe, std::function<void()> fn, Size size) {
  return enqueue(std::make_shared<Work>(std::move(describe)), std::move(fn), size);
}

WorkPtr Engine::enqueue(WorkPtr work, std::function<void()> fn, Size size) {
  work->set_helper([this](Work* w) { help(w); });
  auto now = SteadyClock::now();
  auto take_after = size == Size::kSmall ? now + kPoll : now + kLargeGrace;
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Task{work, std::move(fn), take_after, size == Size::kSmall});
    ++submitted_;
    wake = thread_idle_ && (!polling_ || size != Size::kSmall);
  }
  if (wake) cv_.notify_all();
  return work;
}

WorkPtr Engine::submit(WorkPtr work, std::function<void()> fn, Size size) {
  return enqueue(std::move(work), std::move(fn), size);
}

WorkPtr Engine::submit_deferred(std::function<std::string()> describe, std::function<void(const WorkPtr&)> start) {
  return submit_deferred(std::make_shared<Work>(std::move(describe)), std::move(start));
}

WorkPtr Engine::submit_deferred(WorkPtr work, std::function<void(const WorkPtr&)> start) {
  work->set_helper([this](Work* w) { help_start(w); });
  std::unique_lock<std::mutex> l(mu_);
  Task t{work, nullptr, SteadyClock::now() + kLargeGrace, false};
  t.start = std::move(start);
  ++submitted_;
  if (queue_.empty() && !executing_) {
    run(t, l);  // nothing before it: start it here and now (it does not block)
    if (thread_idle_ && !queue_.empty()) cv_.notify_all();  // what came meanwhile
    return work;
  }
  queue_.push_back(std::move(t));
  bool wake = thread_idle_;
  l.unlock();
  if (wake) cv_.notify_all();
  return work;
}

void Engine::set_broken(const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  if (broken_.empty()) broken_ = why;
}

void Engine::run(Task& t, std::unique_lock<std::mutex>& l) {
  executing_ = true;
  std::string broken = broken_;
  l.unlock();
  std::exception_ptr error;
  if (!broken.empty()) {
    error = std::make_exception_ptr(
        CommError(t.work->description() + " not run: the group is unusable after an earlier failure: " + broken));
  } else {
    try {
      if (t.start) {
        t.start(t.work);
        t.start = nullptr;
        l.lock();
        executing_ = false;
        return;  // its new owner finishes the Work
      }
      t.fn();
    } catch (const std::exception& e) {
      error = std::current_exception();
      set_broken(e.what());
    } catch (...) {
      error = std::current_exception();
      set_broken("unknown error");
    }
  }
  t.work->finish(error);
  t.fn = nullptr;
  t.start = nullptr;
  l.lock();
  executing_ = false;
}

void Engine::loop() {
  std::unique_lock<std::mutex> l(mu_);
  auto last_task = SteadyClock::now();
  uint64_t seen = submitted_;
  for (;;) {
    if (stop_ && queue_.empty() && !executing_) return;
    auto now = SteadyClock::now();
    if (!queue_.empty() && !executing_ && (stop_ || queue_.front().take_after <= now)) {
      // Nobody waited for it within its grace period (or we are stopping): run it here.
      Task t = std::move(queue_.front());
      queue_.pop_front();
      run(t, l);
      last_task = SteadyClock::now();
      continue;
    }
    if (!queue_.empty() || executing_ || seen != submitted_) last_task = now;
    seen = submitted_;
    if (!polling_) {
      thread_idle_ = true;
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      thread_idle_ = false;
      polling_ = true;  // tasks are coming: poll for a while (small ones need no wake-up)
      continue;
    }
    auto until = now + kPoll;
    if (!queue_.empty() && !executing_ && queue_.front().take_after < until) until = queue_.front().take_after;
    thread_idle_ = true;
    cv_.wait_until(l, until);
    thread_idle_ = false;
    if (queue_.empty() && !executing_ && !stop_ && SteadyClock::now() - last_task > kIdle) polling_ = false;
  }
}

void Engine::help(Work* w) {
  std::unique_lock<std::mutex> l(mu_);
  while (!w->is_completed() && !executing_ && !queue_.empty()) {
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
    // The background thread needs a wake-up to finish stopping, or for a waiting task that
    // is not small (it may sleep past that task's grace period otherwise).
    if (thread_idle_ && (stop_ || (!queue_.empty() && (!polling_ || !queue_.front().small)))) cv_.notify_all();
  }
}

void Engine::help_start(Work* w) {
  std::unique_lock<std::mutex> l(mu_);
  auto queued = [&] {
    for (const Task& t : queue_)
      if (t.work.get() == w) return true;
    return false;
  };
  while (!executing_ && !queue_.empty() && queued()) {
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
  }
  if (thread_idle_ && (stop_ || (!queue_.empty() && (!polling_ || !queue_.front().small)))) cv_.notify_all();
}

}  // namespace paratrain::comm
