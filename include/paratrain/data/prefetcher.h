// Background batch preparation: a worker thread fills (gathers and collates) the batches the
// training loop will ask for next, so reading data never stalls a step.
//
// The caller announces requests in the order it will consume them (enqueue) and takes them
// with next(request). A request names a range of one micro-step's items (DataOrder::
// items_range), so what a batch holds depends only on the request, never on timing: a
// prefetched batch is bit-identical to one filled on the spot. If next() asks for something
// other than the oldest announced request (the plan changed, e.g. --balance moved items
// between ranks), everything announced is dropped and the batch is filled synchronously.
//
// Buffers are recycled: a batch stays valid until the following next() call (the backward
// pass still reads its inputs), then its tensors are reused for a later request, so steady
// state takes no fresh memory. wait_seconds() accumulates the time next() was blocked on
// the worker (the data-wait time the trainer reports).
//
// Every wait has a deadline: a batch not ready within `timeout_s` is a TimeoutError naming
// the request. An exception thrown by the fill function is rethrown by next() for the
// request that failed. Thread-safety: one consumer thread calls enqueue/next; the fill
// function runs on the worker thread only (so it needs no locking against itself, but must
// not touch state the consumer mutates).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::data {

// Items [first, first + count) of micro-step `micro_step` of optimizer step `step`.
struct BatchRequest {
  int64_t step = 0, micro_step = 0, first = 0, count = 0;
  bool operator==(const BatchRequest&) const = default;
  std::string str() const;
};

struct Batch {
  BatchRequest request;
  Tensor inputs, targets;
};

class BatchPrefetcher {
 public:
  using FillFn = std::function<void(const BatchRequest&, Tensor& inputs, Tensor& targets)>;

  // `fill` writes a request's batch into the given tensors (reallocating them when their
  // shape differs). timeout_s: deadline of one next() call.
  explicit BatchPrefetcher(FillFn fill, double timeout_s = 300);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Announces the next request to prepare (FIFO).
  void enqueue(const BatchRequest& request);
  // The batch of `request`, valid until the next call. Blocks (with the deadline) until the
  // worker has filled it.
  const Batch& next(const BatchRequest& request);

  // Seconds next() spent blocked since the last take_wait_seconds() call, and reset.
  double take_wait_seconds();
  size_t announced() const;

 private:
  struct Slot {
    Batch batch;
    enum class State { Queued, Filling, Ready } state = State::Queued;
    std::exception_ptr error;
  };
  void worker_loop();
  std::shared_ptr<Slot> take_free_slot();
  void drop_announced(std::unique_lock<std::mutex>& lock);

  FillFn fill_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Slot>> queue_;  // announced, in order
  std::vector<std::shared_ptr<Slot>> free_;  // recycled buffers
  std::shared_ptr<Slot> in_use_;             // returned by the last next()
  bool stop_ = false;
  double wait_s_ = 0;
  std::thread worker_;
};

}  // namespace paratrain::data
