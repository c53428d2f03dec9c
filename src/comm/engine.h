// Engine: a group's ordered work queue and its background thread.
//
// Tasks run one at a time in submission order. A thread blocked in Work::wait() runs
// queued tasks itself (in order, only while nothing else executes), which saves a thread
// hand-off for short operations. The background thread runs what nobody waits for, once
// the task's grace period has passed: kSmall tasks after one poll period (kPoll), kLarge
// ones after 50 us (the thread is woken for them). While tasks keep
// coming the thread polls (a timed sleep), so a small task costs no wake-up system call
// and no thread of the group competes for a core with the peers' spinning; after kIdle
// without tasks it sleeps until the next submission wakes it. After a task fails, the
// engine is broken: later tasks fail at once with a CommError that quotes the first
// failure. Thread-safe.
//
// Deferred tasks (submit_deferred) are operations that only start in the queue: their
// `start` runs in order like any task, hands the Work to someone else (the p2p engine, an
// MPI request poller) and returns; that one finishes the Work later, while later tasks run.
// A deferred task submitted while the engine is idle (nothing queued or executing) starts
// at once on the calling thread: it is non-blocking, and so a non-blocking send is on its
// way before the call returns.
#pragma once

#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "paratrain/comm/work.h"

namespace paratrain::comm {

class Engine {
 public:
  Engine();
  ~Engine();  // drains the queue (each task has its own deadline), then stops the thread
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  enum class Size { kSmall, kLarge };
  WorkPtr submit(std::string description, std::function<void()> fn, Size size = Size::kLarge);
  // Same, with the description made only if someone asks for it (errors, description()).
  WorkPtr submit(std::function<std::string()> describe, std::function<void()> fn, Size size = Size::kLarge);
  // A task whose Work `start` hands on (it must finish it, success or failure, within its
  // deadline); a throwing `start` fails the Work and breaks the engine.
  WorkPtr submit_deferred(std::function<std::string()> describe, std::function<void(const WorkPtr&)> start);
  // The same two with a Work made by the caller (e.g. with its flight record set first).
  WorkPtr submit(WorkPtr work, std::function<void()> fn, Size size);
  WorkPtr submit_deferred(WorkPtr work, std::function<void(const WorkPtr&)> start);
  // Marks the engine broken (used by a backend that learned of a failure).
  void set_broken(const std::string& why);

 private:
  struct Task {
    WorkPtr work;
    std::function<void()> fn;
    std::chrono::steady_clock::time_point take_after;  // the background thread's turn
    bool small = false;
    std::function<void(const WorkPtr&)> start = nullptr;  // a deferred task (fn is empty)
  };
  WorkPtr enqueue(WorkPtr work, std::function<void()> fn, Size size);
  void loop();
  void help(Work* w);
  // help() for a deferred task's Work: runs queued tasks only until its own has started.
  void help_start(Work* w);
  void run(Task& t, std::unique_lock<std::mutex>& l);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool executing_ = false;
  bool stop_ = false;
  bool thread_idle_ = false;
  bool polling_ = false;  // the thread sleeps with a timeout (small tasks need no wake-up)
  uint64_t submitted_ = 0;  // tasks submitted so far (activity keeps the thread polling)
  std::string broken_;
  std::thread thread_;
};

}  // namespace paratrain::comm
