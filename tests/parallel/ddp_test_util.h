// Shared by the data-parallel tests (ddp, zero, compression): ranks as threads of this
// process, each with its own shm process group over one in-memory store, a tiny GPT, and
// batch rows fixed by (step, row) so every split of a global batch sees the same rows.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/random.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::testing {

// Runs fn(pg) on n threads, each rank its own group (30 s deadline per call), then a barrier
// before the group is destroyed; returns each rank's error ("" = none).
template <typename Fn>
std::vector<std::string> run_ranks(int n, bool deterministic, Fn fn) {
  auto store = std::make_shared<comm::HashStore>();
  store->set_timeout(std::chrono::milliseconds(30000));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions o;
        o.backend = "shm";
        o.timeout_s = 30;
        o.deterministic = deterministic;
        auto pg = comm::create_process_group(store, r, n, o);
        fn(pg);
        // Leave together, as a program ending its last collective may (the transports let a
        // rank leave while its peers still wait for each other's data in that collective:
        // tests/comm/shm_shutdown_test.cpp). Errors here change nothing: a rank that failed
        // above is already reported.
        try {
          pg->barrier()->wait();
        } catch (const std::exception&) {
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

inline nn::GPTConfig tiny_gpt() { return nn::GPTConfig{2, 2, 32, 16, 64, 0.0f}; }

// Rows [first_row, first_row + rows) of step `step`'s global batch: random tokens, fixed by
// (step, row) only.
inline void make_rows(int64_t step, int64_t first_row, int64_t rows, int64_t T, int64_t V, Tensor& x, Tensor& y) {
  std::vector<int32_t> xs, ys;
  for (int64_t r = first_row; r < first_row + rows; ++r) {
    Generator g(static_cast<uint64_t>(step * 100003 + r + 17));
    std::vector<int32_t> w(T + 1);
    for (auto& t : w) t = static_cast<int32_t>(g.below(static_cast<uint64_t>(V)));
    xs.insert(xs.end(), w.begin(), w.end() - 1);
    ys.insert(ys.end(), w.begin() + 1, w.end());
  }
  x = Tensor::from_vector_i32(xs, {rows, T});
  y = Tensor::from_vector_i32(ys, {rows, T});
}

}  // namespace paratrain::testing
