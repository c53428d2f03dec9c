#include "comm/engine.h"

#include <chrono>

#include "paratrain/base/error.h"

namespace paratrain::comm {

Engine::Engine() { thread_ = std::thread([this] { loop(); }); }

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

WorkPtr Engine::submit(std::string description, std::function<void()> fn) {
  auto work = std::make_shared<Work>(std::move(description));
  work->set_helper([this](Work* w) { help(w); });
  bool wake;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(Task{work, std::move(fn)});
    wake = thread_idle_;
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
  for (;;) {
    thread_idle_ = true;
    cv_.wait(l, [&] { return (stop_ && queue_.empty() && !executing_) || (!queue_.empty() && !executing_); });
    thread_idle_ = false;
    if (queue_.empty()) return;  // stop_
    if (!stop_) {
      // Give the submitting thread a moment to call wait() and run the work itself (no
      // hand-off between threads); take the work only if nobody did.
      l.unlock();
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(50);
      while (std::chrono::steady_clock::now() < until) std::this_thread::yield();
      l.lock();
      if (queue_.empty() || executing_) continue;
    }
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
    cv_.notify_all();
  }
}

void Engine::help(Work* w) {
  std::unique_lock<std::mutex> l(mu_);
  while (!w->is_completed() && !executing_ && !queue_.empty()) {
    Task t = std::move(queue_.front());
    queue_.pop_front();
    run(t, l);
    cv_.notify_all();
  }
}

}  // namespace paratrain::comm
