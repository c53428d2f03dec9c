#include "comm/engine.h"

#include <chrono>

#include "paratrain/base/error.h"

namespace paratrain::comm {
namespace {
constexpr auto kPoll = std::chrono::microseconds(500);
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

WorkPtr Engine::submit(std::string description, std::function<void()> fn, bool urgent) {
  return enqueue(std::make_shared<Work>(std::move(description)), std::move(fn), urgent);
}

WorkPtr Engine::submit(std::function<std::string()> describe, std::function<void()> fn, bool urgent) {
  return enqueue(std::make_shared<Work>(std::move(describe)), std::move(fn), urgent);
}

WorkPtr Engine::enqueue(WorkPtr work, std::function<void()> fn, bool urgent) {
  work->set_helper([this](Work* w) { help(w); });
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Task{work, std::move(fn), next_id_++, urgent});
    wake = thread_idle_ && (urgent || !polling_);
  }
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
  l.lock();
  executing_ = false;
}

void Engine::loop() {
  std::unique_lock<std::mutex> l(mu_);
  auto last_task = std::chrono::steady_clock::now();
  for (;;) {
    // Runnable by this thread: anything when stopping, an urgent task at once, any other
    // task once it was already queued at the previous poll (its waiter, if any, had its
    // chance to run it without a hand-off).
    auto takeable = [&] {
      if (queue_.empty() || executing_) return false;
      return stop_ || queue_.front().urgent || queue_.front().id < seen_id_;
    };
    thread_idle_ = true;
    if (stop_ && queue_.empty() && !executing_) {
      thread_idle_ = false;
      return;
    }
    if (!takeable()) {
      if (polling_) {
        seen_id_ = next_id_;
        cv_.wait_for(l, kPoll, [&] {
          return !executing_ && (stop_ || (!queue_.empty() && queue_.front().urgent));
        });
      } else {
        cv_.wait(l, [&] { return stop_ || (!queue_.empty() && !executing_); });
        polling_ = true;  // tasks are coming: poll for a while (no wake-ups needed)
        seen_id_ = next_id_;
        last_task = std::chrono::steady_clock::now();
        thread_idle_ = false;
        continue;
      }
    }
    thread_idle_ = false;
    auto now = std::chrono::steady_clock::now();
    if (next_id_ != seen_id_ || !queue_.empty()) last_task = now;
    if (!takeable()) {
      if (queue_.empty() && now - last_task > kIdle) polling_ = false;
      continue;
    }
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
  }
}

void Engine::help(Work* w) {
  std::unique_lock<std::mutex> l(mu_);
  while (!w->is_completed() && !executing_ && !queue_.empty()) {
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
    // The background thread needs a wake-up only if it does not poll, or for an urgent
    // task, or to finish stopping.
    if (thread_idle_ && (!polling_ || stop_ || (!queue_.empty() && queue_.front().urgent))) cv_.notify_all();
  }
}

}  // namespace paratrain::comm
