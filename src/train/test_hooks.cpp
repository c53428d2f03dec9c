// The environment hooks tests use to make a run fail or slow down on purpose.
#include "test_hooks.h"

#include <chrono>
#include <csignal>
#include <limits>
#include <stdexcept>
#include <thread>

#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"

namespace paratrain::train {

namespace {

// A test hook's value RANK:STEP from variable `var` (unset: nullopt). InputError when it is
// malformed or STEP is below `min_step`.
std::optional<std::pair<int64_t, int64_t>> rank_and_step(const char* var, int64_t min_step) {
  const std::string v = env::get_string(var);
  if (v.empty()) return std::nullopt;
  const auto colon = v.find(':');
  int64_t r = -1, n = -1;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    r = std::stoll(v.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    n = std::stoll(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    PT_THROW(InputError, var, "='", v, "' is not RANK:STEP (e.g. 0:2)");
  }
  if (r < 0 || n < min_step) PT_THROW(InputError, var, "='", v, "': RANK must be >= 0 and STEP >= ", min_step);
  return std::make_pair(r, n);
}

// PARATRAIN_TEST_KILL_IN_SAVE=R:N, a test hook: the step N whose save rank R dies in (it
// SIGKILLs itself once its files of step_N are written, before the manifest), or -1 on
// other ranks, when unset, and in a group restarted by the launcher (restart_count > 0), so
// that the restarted run gets past it.
}  // namespace

int64_t test_kill_in_save_step(int rank, int64_t restart_count) {
  const auto rs = rank_and_step("PARATRAIN_TEST_KILL_IN_SAVE", 1);
  return rs && rs->first == rank && restart_count == 0 ? rs->second : -1;
}

// PARATRAIN_TEST_INJECT_INF=R:N, a test hook: rank R puts an inf into its gradient after the
// reduction of step N (0-based), so that the loss scaler must skip that step on every rank;
// -1 on other ranks and when unset.
int64_t test_inject_inf_step(int rank) {
  const auto rs = rank_and_step("PARATRAIN_TEST_INJECT_INF", 0);
  return rs && rs->first == rank ? rs->second : -1;
}

void inject_inf(const optim::NamedParams& params, int rank, int64_t step) {
  for (const auto& [name, p] : params) {
    Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0 || g.dtype() != DType::F32) continue;
    g.flatten().narrow(0, 0, 1).fill_(std::numeric_limits<double>::infinity());  // on the gradient's device
    PT_LOG_WARN(kTrain, "PARATRAIN_TEST_INJECT_INF: inf in the gradient of ", name, " at step ", step, " (rank ",
                rank, ")");
    return;
  }
}

// PARATRAIN_TEST_STOP_AT_STEP=R:N, a test hook: rank R stops itself (SIGSTOP) at the start
// of step N (0-based), before any collective of that step, so the other ranks wait in that
// step's first collective (a hung rank that is alive); -1 on other ranks, when unset, and in
// a group restarted by the launcher (restart_count > 0), so that the restarted run gets past it.
int64_t test_stop_at_step(int rank, int64_t restart_count) {
  const auto rs = rank_and_step("PARATRAIN_TEST_STOP_AT_STEP", 0);
  return rs && rs->first == rank && restart_count == 0 ? rs->second : -1;
}

void stop_this_rank(int rank, int64_t step) {
  PT_LOG_WARN(kTrain, "PARATRAIN_TEST_STOP_AT_STEP: rank ", rank, " stops itself (SIGSTOP) at step ", step);
  // A completed call may still have bytes for the peers in the transport's progress thread
  // (tcp: the last step's all-gather once this rank had the others' parts), and SIGSTOP stops
  // that thread too; the peers must wait in this step's first collective, not the last one's,
  // so those few bytes (microseconds) get 300 ms to leave first.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::raise(SIGSTOP);
}

// PARATRAIN_TEST_SKIP_ALLREDUCE=R:N, a test hook: rank R's DDP does not launch its first
// bucket's all-reduce at step N (DdpOptions::test_skip_allreduce_at); -1 elsewhere and unset.
int64_t test_skip_allreduce_step(int rank) {
  const auto rs = rank_and_step("PARATRAIN_TEST_SKIP_ALLREDUCE", 0);
  return rs && rs->first == rank ? rs->second : -1;
}

// PARATRAIN_SIMULATE_SLOWDOWN=R:F -> F on rank R (1 elsewhere): the rank idles (F-1) x its
// compute time after each micro-step, like a device F times slower.
double simulated_slowdown(int rank) {
  const std::string v = env::get_string("PARATRAIN_SIMULATE_SLOWDOWN");
  if (v.empty()) return 1.0;
  const auto colon = v.find(':');
  int r = -1;
  double f = 0;
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    size_t used = 0;
    r = std::stoi(v.substr(0, colon), &used);
    if (used != colon) throw std::invalid_argument("rank");
    f = std::stod(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1) throw std::invalid_argument("factor");
  } catch (const std::exception&) {
    PT_THROW(InputError, "PARATRAIN_SIMULATE_SLOWDOWN='", v, "' is not RANK:FACTOR (e.g. 1:2.5)");
  }
  if (!(f >= 1.0)) PT_THROW(InputError, "PARATRAIN_SIMULATE_SLOWDOWN factor must be at least 1, got ", f);
  return r == rank ? f : 1.0;
}

}  // namespace paratrain::train
