// Runs a pipeline schedule (schedule.h) on one pipeline rank: the forward and backward of each
// micro-batch on each of the rank's chunks, and the activations and their gradients sent to
// and received from the neighbouring ranks, in the order the schedule lists.
//
// What a stage computes is the caller's (StageFunctions): the executor only keeps, per
// (micro-batch, chunk), the chunk's input (a leaf requiring grad, unless it is token ids) and
// output until that micro-batch's backward has used them, and frees them then. Sends and
// receives are the pp group's non-blocking send/recv (comm), one tag per (direction,
// micro-batch, chunk); sends are waited for at the end of the step, receives when their data
// is needed, each under the group's deadline.
//
// Groups that match messages in posting order and start them in batches (P2pMatching::
// InPostingOrder: nccl) run the schedule in message rounds that every rank derives from the
// schedule alike (p2p_rounds.h): a round's actions, then, in one batch,
// its sends and the receives of the messages the peers send this rank in the same round. Each
// batch's counterparts are in the peers' batches of that round, so every schedule runs there
// without a deadlock, the interleaved one included, and each pair's messages are posted in the
// same order on both sides. Receives are waited for with Work::wait_on_device (a GPU's compute
// stream waits, not the host).
//
// Device: the activations received, the losses and the memory figures are on `device` (the
// stages' parameters'); the losses are read back once, at the end of the step.
//
// zb1p's split backward: I runs autograd::backward_input (the input gradient only), W later
// runs the deferred weight gradients (autograd/split_backward.h).
//
// Thread-safety: one thread drives an executor. Lifetime: the group must outlive it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/parallel/pipeline/p2p_rounds.h"
#include "paratrain/parallel/pipeline/schedule.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel::pipeline {

struct StageFunctions {
  // Forward of micro-batch `mb` through chunk `chunk`: `input` is the token ids on the first
  // model stage, else the hidden states received (a leaf requiring grad). Returns the hidden
  // states, or on the last model stage the micro-batch's mean loss (a scalar).
  std::function<Tensor(int mb, int chunk, const Tensor& input)> forward;
  // The first model stage's input of micro-batch `mb` (token ids).
  std::function<Tensor(int mb)> tokens;
  // The seed of the last stage's backward (the loss scale / micro-batch count, a scalar).
  Tensor loss_seed;
};

struct PipelineStepStats {
  double wall_ms = 0;      // the whole schedule on this rank
  double compute_ms = 0;   // F, B, I and W actions (the rest is waiting: the bubble)
  double p2p_wait_ms = 0;  // time blocked in receives and in the final send waits
  int64_t p2p_bytes = 0;   // bytes this rank sent
  double loss_sum = 0;     // sum of the micro-batch losses (ranks holding the last stage)
  int64_t peak_activation_bytes = 0;  // the most the held micro-batches kept allocated
  int peak_held = 0;                  // the most (micro-batch, chunk) forwards held at once
};

class PipelineExecutor {
 public:
  // `pp` is this rank's pipeline group (group rank = stage rank), null only with one stage.
  // `hidden_shape`: (B, T, C) of the activations that travel between stages.
  PipelineExecutor(Schedule schedule, std::shared_ptr<comm::ProcessGroup> pp, int pp_rank, Shape hidden_shape,
                   DeviceSpec device = {Device::CPU, -1});

  // One optimizer step's micro-batches: every action of this rank's list, in order.
  PipelineStepStats run_step(const StageFunctions& fns);

  // Forward only (evaluation), one batch through every stage in model order: returns the
  // last stage's output (the loss when `fns.forward` computes one) on the ranks holding the
  // last stage, an undefined tensor elsewhere.
  Tensor forward_only(const StageFunctions& fns, int mb = 0);

  const Schedule& schedule() const { return schedule_; }
  bool holds_model_stage(int model_stage) const { return model_stage % schedule_.spec.stages == pp_rank_; }

 private:
  Schedule schedule_;
  std::shared_ptr<comm::ProcessGroup> pp_;
  int pp_rank_;
  Shape hidden_shape_;
  DeviceSpec device_;
  // Posting-order groups: this rank's message rounds (p2p_rounds.h); empty for tag-matching ones.
  bool in_posting_order_ = false;
  std::vector<P2pRound> rounds_;
};

}  // namespace paratrain::parallel::pipeline
