// split_backward_bench: what the split backward (autograd/split_backward.h) costs and saves,
// the figures a zero-bubble pipeline schedule (zb1p) relies on: the time (best of 5) of the
// whole backward, of its input part I (backward_input) and of its weight part W (run()), of a
// GPT stage of two blocks and of its c_fc Linear alone, with I and W as shares of the whole.
// The peer is our own whole backward in the same run; I + W over the whole is the split's
// overhead. Usage: split_backward_bench [threads]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/autograd/split_backward.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;

namespace {

Tensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  fill_normal(t, g, 0.0f, 1.0f);
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// t[0] the whole backward, t[1] I, t[2] W: each the best of `reps`.
void measure(const std::function<Tensor()>& forward, const Tensor& g, const Tensor& input, int reps, double t[3]) {
  t[0] = t[1] = t[2] = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    Tensor out = forward();
    auto t0 = std::chrono::steady_clock::now();
    autograd::backward(out, g);
    t[0] = std::min(t[0], seconds_since(t0));
    out = forward();
    t0 = std::chrono::steady_clock::now();
    autograd::DeferredWeightGradients w = autograd::backward_input(out, g, {input});
    t[1] = std::min(t[1], seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    w.run();
    t[2] = std::min(t[2], seconds_since(t0));
  }
}

void print(const char* what, const double t[3]) {
  std::printf("%-44s %10.2f %8.2f %6.0f%% %8.2f %6.0f%% %8.2fx\n", what, t[0] * 1e3, t[1] * 1e3, 100 * t[1] / t[0],
              t[2] * 1e3, 100 * t[2] / t[0], (t[1] + t[2]) / t[0]);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 1;
  kernels::cpu::set_num_threads(std::max(1, threads));
  const nn::GPTConfig cfg{4, 4, 256, 128, 256, 0.0f};
  const int64_t B = 4, T = 128, C = cfg.n_embd;
  nn::GPT m(cfg, 5);
  Tensor in = randn({B, T, C}, 11), seed = randn({B, T, C}, 12);
  in.set_requires_grad(true);
  std::printf("# split backward: GPT C %lld, B %lld, T %lld, %d thread(s); times in ms, best of 5\n",
              static_cast<long long>(C), static_cast<long long>(B), static_cast<long long>(T), threads);
  std::printf("%-44s %10s %8s %7s %8s %7s %9s\n", "part", "whole", "I", "I/whole", "W", "W/whole", "(I+W)/whole");
  double stage_t[3], linear_t[3];
  measure([&] { return m.stage_forward(in, 1, 3); }, seed, in, 5, stage_t);
  const auto& fc = *m.h[1]->mlp->c_fc;  // C -> 4C
  measure([&] { return ops::linear(in, fc.weight, fc.bias, true); }, randn({B, T, 4 * C}, 13), in, 5, linear_t);
  print("GPT stage [1,3) (two blocks)", stage_t);
  print("its c_fc Linear alone (C -> 4C)", linear_t);
  return 0;
}
