// measured_costs (stage_model.h): the blocks' forward and backward timed where the model is.
#include <algorithm>
#include <chrono>
#include <functional>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/parallel/pipeline/stage_model.h"
#include "paratrain/tensor/random.h"

namespace paratrain::parallel::pipeline {

StageCosts measured_costs(nn::GPT& model, int64_t micro_batch, comm::ProcessGroup* world) {
  const nn::GPTConfig& cfg = model.config();
  const int64_t B = micro_batch, T = cfg.block_size, C = cfg.n_embd;
  // The probes run where the parameters are (a GPU's compute stream included).
  const DeviceSpec device = model.named_parameters().front().second.device_spec();
  Generator gen(1234);
  std::vector<float> values(static_cast<size_t>(B * T * C));
  for (float& v : values) v = static_cast<float>(gen.normal());
  const Tensor hidden = Tensor::from_vector(values, {B, T, C}).to(device);
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % static_cast<size_t>(cfg.vocab_size));
  const Tensor tokens = Tensor::from_vector_i32(ids, {B, T}).to(device);
  // The fastest of three forward + backward runs of `f`, in ms (the first run warms up). The
  // read-back of the summed output waits for the run's queued work (on a GPU: its kernels,
  // backward included, in stream order).
  const auto time_ms = [](const std::function<Tensor()>& f) {
    double best = 1e300;
    for (int run = 0; run < 4; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      Tensor total = ops::sum(f());
      autograd::backward(total);
      Tensor done = Tensor::empty({}, DType::F32);
      done.copy_(total.detach());  // after the backward's kernels on the same stream
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (run > 0) best = std::min(best, ms);
    }
    return best;
  };
  std::vector<double> costs;
  for (auto& block : model.h) {
    costs.push_back(time_ms([&] {
      Tensor x = hidden.clone();
      x.set_requires_grad(true);
      return block->forward(x);
    }));
  }
  costs.push_back(time_ms([&] { return model.wte->forward_with_positions(tokens, *model.wpe); }));
  costs.push_back(time_ms([&] {
    Tensor x = hidden.clone();
    x.set_requires_grad(true);
    return model.wte->tied_loss(model.ln_f->forward(x), tokens);
  }));
  model.zero_grad();
  std::vector<float> all(costs.begin(), costs.end());
  if (world) world->broadcast(all.data(), all.size(), DType::F32, 0)->wait();
  StageCosts c;
  c.blocks.assign(all.begin(), all.end() - 2);
  c.first_extra = all[all.size() - 2];
  c.last_extra = all[all.size() - 1];
  return c;
}

}  // namespace paratrain::parallel::pipeline
