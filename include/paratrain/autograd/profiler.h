// Per-op time accounting (PARATRAIN_PROFILE=1): how much of a step each op takes, forward
// and backward. Ops open an OpScope; the engine opens one per backward node. report()
// prints a table sorted by total time. Near-free when disabled (one branch per op).
// Where this process has a GPU, a scope waits for the current GPU's compute stream when it
// opens and when it closes, so an op's time is its kernels' time on the GPU, not the moment
// it took to enqueue them (profiling then serialises the host with the GPU: a profiled run
// is slower, and its table is for finding where a step's time goes).
// Scopes nest only at op granularity; thread-safe for one training thread.
#pragma once

#include <chrono>
#include <string>

namespace paratrain::autograd::profiler {

bool enabled();
void record(const char* name, bool backward, double seconds);
// Waits for the current GPU's compute stream where this process has a GPU; nothing otherwise.
void wait_for_device();
// The table of accumulated times; "" when disabled or nothing was recorded.
std::string report();
void reset();

class OpScope {
 public:
  OpScope(const char* name, bool backward) : name_(name), backward_(backward), on_(enabled()) {
    if (on_) {
      wait_for_device();
      t0_ = std::chrono::steady_clock::now();
    }
  }
  ~OpScope() {
    if (!on_) return;
    wait_for_device();
    record(name_, backward_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  const char* name_;
  bool backward_;
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace paratrain::autograd::profiler
