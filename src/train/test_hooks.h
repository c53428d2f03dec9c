// Test hooks read from the environment (each documented where it is read):
// PARATRAIN_TEST_KILL_IN_SAVE=R:N, PARATRAIN_TEST_INJECT_INF=R:N, PARATRAIN_SIMULATE_SLOWDOWN=R:F,
// PARATRAIN_TEST_STOP_AT_STEP=R:N, PARATRAIN_TEST_SKIP_ALLREDUCE=R:N.
// InputError when a value is malformed.
#pragma once

#include <cstdint>

#include "paratrain/optim/optimizer.h"

namespace paratrain::train {

int64_t test_kill_in_save_step(int rank, int64_t restart_count);
int64_t test_inject_inf_step(int rank);
void inject_inf(const optim::NamedParams& params, int rank, int64_t step);
double simulated_slowdown(int rank);
int64_t test_stop_at_step(int rank, int64_t restart_count);
void stop_this_rank(int rank, int64_t step);  // raise(SIGSTOP), said first
int64_t test_skip_allreduce_step(int rank);

}  // namespace paratrain::train
