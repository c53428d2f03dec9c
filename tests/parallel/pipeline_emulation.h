// Test support: the pipeline executor on PostingOrderWorld (posting_order_group.h, nccl's
// send/recv rules with ranks as threads) against the same micro-batches run one after another
// on one CPU rank. A toy model of S stages, x -> tanh(x * w_s) (the last also takes the mean:
// the loss), whose values are fixed functions of a salt, so every rank builds the same one.
//
// expect_matches_one_rank(spec, device, tol): one optimizer step of the schedule on p rank
// threads with the stages' weights, inputs and messages on `device` (cuda:N: every thread
// makes it current; the world's copies then go through cudaMemcpy, see
// tests/gpu/pipeline_gpu_test.cpp), expecting no error on any rank and the one-rank loss sum
// and every stage's weight gradient within `tol`. Used by
// tests/parallel/pipeline_posting_order_test.cpp (CPU) and tests/gpu/pipeline_gpu_test.cpp.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/parallel/pipeline/executor.h"
#include "paratrain/tensor/cuda.h"
#include "parallel/posting_order_group.h"

namespace paratrain::testing {

inline const Shape kHidden{2, 3, 4};

inline Tensor values(int salt, DeviceSpec device = {}) {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + salt)) * 0.9f;
  return Tensor::from_vector(v, kHidden).to(device);
}

// Model stage s: x -> tanh(x * w_s); the last one also takes the mean (the loss).
struct Stages {
  std::vector<Tensor> weights;
  explicit Stages(int count, DeviceSpec device = {}) {
    for (int s = 0; s < count; ++s) {
      weights.push_back(values(100 + s, device));
      weights.back().set_requires_grad(true);
    }
  }
  Tensor forward(int stage, const Tensor& x) const {
    Tensor y = ops::tanh(ops::mul(x, weights[static_cast<size_t>(stage)]));
    return stage + 1 == static_cast<int>(weights.size()) ? ops::mean(y) : y;
  }
};

struct PipelineRankResult {
  double loss_sum = 0;
  std::vector<std::vector<float>> grads;  // per model stage (empty: another rank's)
  std::exception_ptr error;
};

// The world's copy of a message between two buffers of `device`.
using MessageCopy = PostingOrderWorld::Copy;

inline void expect_matches_one_rank(const parallel::pipeline::ScheduleSpec& spec, DeviceSpec device = {},
                                    double tol = 1e-6, MessageCopy copy = nullptr) {
  using namespace parallel::pipeline;
  SCOPED_TRACE(std::string(schedule_name(spec.kind)) + " p " + std::to_string(spec.stages) + " m " +
               std::to_string(spec.micro_batches) + " v " + std::to_string(spec.virtual_chunks) + " on " +
               device.str());
  const Schedule schedule = build_schedule(spec);
  const int p = spec.stages, S = schedule.num_model_stages(), m = spec.micro_batches;

  // One CPU rank, the micro-batches one after another.
  const Tensor seed = Tensor::full({}, 1.0f / static_cast<float>(m));
  Stages one(S);
  double want_loss = 0;
  for (int mb = 0; mb < m; ++mb) {
    Tensor x = values(mb);
    for (int s = 0; s < S; ++s) x = one.forward(s, x);
    want_loss += x.item();
    autograd::backward(x, seed);
  }

  PostingOrderWorld world(p, std::chrono::seconds(20), copy);
  std::vector<PipelineRankResult> results(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      PipelineRankResult& res = results[static_cast<size_t>(r)];
      try {
        if (device.kind == Device::CUDA) cuda::set_device(device.index);
        Stages mine(S, device);
        PipelineExecutor ex(schedule, world.group(r), r, kHidden, device);
        StageFunctions fns;
        fns.tokens = [&](int mb) { return values(mb, device); };
        fns.forward = [&](int, int chunk, const Tensor& x) { return mine.forward(chunk * p + r, x); };
        fns.loss_seed = seed.to(device);
        res.loss_sum = ex.run_step(fns).loss_sum;
        res.grads.resize(static_cast<size_t>(S));
        for (int s = r; s < S; s += p)
          res.grads[static_cast<size_t>(s)] = mine.weights[static_cast<size_t>(s)].grad().to_vector();
      } catch (...) {
        res.error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < p; ++r) {
    const PipelineRankResult& res = results[static_cast<size_t>(r)];
    if (res.error) {
      try {
        std::rethrow_exception(res.error);
      } catch (const std::exception& e) {
        FAIL() << "rank " << r << ": " << e.what();
      }
    }
  }
  EXPECT_NEAR(results[static_cast<size_t>((S - 1) % p)].loss_sum, want_loss, tol);
  for (int s = 0; s < S; ++s) {
    const std::vector<float> want = one.weights[static_cast<size_t>(s)].grad().to_vector();
    const std::vector<float>& got = results[static_cast<size_t>(s % p)].grads[static_cast<size_t>(s)];
    ASSERT_EQ(got.size(), want.size()) << "stage " << s;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "stage " << s << " element " << i;
  }
}

}  // namespace paratrain::testing
