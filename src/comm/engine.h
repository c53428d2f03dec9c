// Engine: a group's ordered work queue and its background thread.
//
// Tasks run one at a time in submission order. The background thread takes them as they
// come; a thread blocked in Work::wait() may instead run queued tasks itself (in order,
// only while the background thread is idle), which saves a thread hand-off for short
// operations. After a task fails, the engine is broken: later tasks fail at once with a
// CommError that quotes the first failure. Thread-safe.
#pragma once

#include <condition_variable>
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
  WorkPtr submit(std::string description, std::function<void()> fn);
  // Marks the engine broken (used by a backend that learned of a failure).
  void set_broken(const std::string& why);

 private:
  struct Task {
    WorkPtr work;
    std::function<void()> fn;
  };
  void loop();
  void help(Work* w);
  void run(Task& t, std::unique_lock<std::mutex>& l);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool executing_ = false;
  bool stop_ = false;
  bool thread_idle_ = false;
  std::string broken_;
  std::thread thread_;
};

}  // namespace paratrain::comm
