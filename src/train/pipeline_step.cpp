#include "pipeline_step.h"

#include <chrono>

#include "device_placement.h"
#include "paratrain/base/error.h"

namespace paratrain::train {

using namespace parallel;

PipelineStep::PipelineStep(nn::GPT& gpt, ParallelModel& model, const DeviceMesh& mesh, MicroBatches batches,
                           const pipeline::ScheduleSpec& spec, DType compute_dtype,
                           autograd::WeightCastCache* half_copies, int64_t micro_batch, DeviceSpec device)
    : gpt_(gpt),
      model_(model),
      mesh_(mesh),
      batches_(std::move(batches)),
      compute_dtype_(compute_dtype),
      device_(device),
      half_copies_(half_copies),
      executor_(pipeline::build_schedule(spec), mesh.pp(), mesh.coord().pp,
                Shape{micro_batch, gpt.config().block_size, gpt.config().n_embd}, device) {
  const pipeline::ScheduleCheck check = pipeline::check_schedule(executor_.schedule());
  if (!check.ok) PT_THROW(Error, "pipeline schedule ", pipeline::schedule_name(spec.kind), " does not check: ", check.problem);
}

Tensor PipelineStep::forward(int chunk, const Tensor& input, const Tensor& targets) {
  const auto& range = model_.chunks()[static_cast<size_t>(chunk)];
  const bool last = range.end_block == gpt_.config().n_layer;
  autograd::AutocastGuard autocast(compute_dtype_, half_copies_);
  return gpt_.stage_forward(input, range.first_block, range.end_block, last ? targets : Tensor());
}

StepOutcome PipelineStep::run(int64_t step, const Tensor& seed) {
  const int m = executor_.schedule().spec.micro_batches;
  const auto t0 = std::chrono::steady_clock::now();
  // Every stage of a replica reads the same micro-batches (the first needs the tokens, the
  // last the targets), copied (the prefetcher reuses its buffers): on a GPU by the upload.
  const auto own_copy = [this](const Tensor& t) { return device_.kind == Device::CPU ? t.clone() : upload(t, device_); };
  tokens_.clear(), targets_.clear();
  for (int k = 0; k < m; ++k) {
    if (k == 0) batches_.announce(step + 1);
    const data::Batch& b = batches_.next(step, k);
    tokens_.push_back(own_copy(b.inputs));
    targets_.push_back(own_copy(b.targets));
  }
  pipeline::StageFunctions fns;
  fns.tokens = [this](int mb) { return tokens_[static_cast<size_t>(mb)]; };
  fns.forward = [this](int mb, int chunk, const Tensor& x) { return forward(chunk, x, targets_[static_cast<size_t>(mb)]); };
  fns.loss_seed = seed;
  pipeline::PipelineStepStats st;
  {
    auto no_sync = model_.no_sync();  // finish() reduces what every micro-batch accumulated
    st = executor_.run_step(fns);
  }
  StepOutcome out;
  out.loss_sum = st.loss_sum;
  out.computes_loss = model_.holds_last_stage();
  out.activation_bytes = st.peak_activation_bytes;
  out.compute_s = seconds_since(t0);
  out.busy_ms = st.compute_ms;
  out.wall_ms = st.wall_ms;
  out.p2p_ms = st.p2p_wait_ms;
  out.p2p_bytes = st.p2p_bytes;
  return out;
}

Tensor PipelineStep::evaluation_loss(const Tensor& host_inputs, const Tensor& host_targets) {
  const Tensor inputs = host_inputs.to(device_), targets = host_targets.to(device_);
  pipeline::StageFunctions fns;
  fns.tokens = [&inputs](int) { return inputs; };
  fns.forward = [&](int, int chunk, const Tensor& x) { return forward(chunk, x, targets); };
  const Tensor loss = executor_.forward_only(fns);
  // A host figure: nccl stages it through the device
  float value = loss.defined() ? static_cast<float>(loss.item()) : 0.0f;
  mesh_.pp()->broadcast(&value, 1, DType::F32, mesh_.shape().pp - 1)->wait();
  return Tensor::full({}, value);
}

}  // namespace paratrain::train
