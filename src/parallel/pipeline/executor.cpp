#include "paratrain/parallel/pipeline/executor.h"

#include <chrono>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/split_backward.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/tensor_reduce.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/parallel/pipeline/p2p_rounds.h"

namespace paratrain::parallel::pipeline {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// One tag per message: the direction, the micro-batch and the model stage that receives it.
int message_tag(int mb, int to_stage, int num_stages, bool gradient) {
  return ((mb * num_stages + to_stage) << 1) | (gradient ? 1 : 0);
}

// Sends posted and not yet waited for, with the f32 copies they read (kept alive until then).
struct Outbox {
  std::vector<comm::WorkPtr> works;
  std::vector<Tensor> data;
  // Posts `t` (as contiguous f32, detached) to `peer`; returns the bytes sent.
  int64_t post(comm::ProcessGroup& pp, const Tensor& t, int peer, int tag) {
    Tensor c = t.detach().contiguous();
    if (c.dtype() != DType::F32) c = c.to(DType::F32);
    works.push_back(pp.send(c.data<float>(), static_cast<size_t>(c.numel()), DType::F32, peer, tag));
    data.push_back(std::move(c));
    return static_cast<int64_t>(data.back().numel()) * 4;
  }
};

// What one (micro-batch, model stage) holds between its forward and its backward.
struct Slot {
  Tensor input;       // tokens, or a leaf requiring grad (hidden states)
  Tensor output;      // hidden states, or the loss on the last stage
  Tensor incoming;    // received (or handed over) activations, before the forward
  comm::WorkPtr incoming_work;
  Tensor grad;        // received (or handed over) gradient of `output`, before the backward
  comm::WorkPtr grad_work;
  std::optional<autograd::DeferredWeightGradients> deferred;  // zb1p: W after I
  bool backward_done = false;
};

}  // namespace

PipelineExecutor::PipelineExecutor(Schedule schedule, std::shared_ptr<comm::ProcessGroup> pp, int pp_rank,
                                   Shape hidden_shape, DeviceSpec device)
    : schedule_(std::move(schedule)),
      pp_(std::move(pp)),
      pp_rank_(pp_rank),
      hidden_shape_(std::move(hidden_shape)),
      device_(device) {
  if (schedule_.spec.stages > 1 && !pp_)
    PT_THROW(InputError, "PipelineExecutor: ", schedule_.spec.stages, " stages need a pipeline process group");
  if (pp_rank_ < 0 || pp_rank_ >= schedule_.spec.stages)
    PT_THROW(InputError, "PipelineExecutor: pipeline rank ", pp_rank_, " is not in [0, ", schedule_.spec.stages, ")");
  in_posting_order_ = pp_ && pp_->p2p_matching() == comm::P2pMatching::InPostingOrder;
  if (in_posting_order_) rounds_ = plan_p2p_rounds(schedule_)[static_cast<size_t>(pp_rank_)];
}

PipelineStepStats PipelineExecutor::run_step(const StageFunctions& fns) {
  const int p = schedule_.spec.stages, S = schedule_.num_model_stages();
  Allocator& alloc = allocator_for(device_.kind, device_.index);
  const int64_t bytes_at_start = alloc.stats().bytes_in_use;
  PipelineStepStats st;
  const auto t_step = Clock::now();
  std::map<std::pair<int, int>, Slot> slots;  // (micro-batch, model stage)
  Outbox sends;
  int held = 0;
  std::vector<Tensor> losses;  // the last stage's, read back once at the end
  std::vector<std::tuple<Tensor, int, int>> round_sends;  // posting order: (data, peer, tag) at the round's end
  const auto stage_of = [&](const Action& a) { return a.chunk * p + pp_rank_; };
  // A receive's data is waited for where it is used (on a GPU, by the compute stream).
  const auto wait = [&](comm::WorkPtr& w, bool on_device) {
    if (!w) return;
    const auto t = Clock::now();
    if (on_device)
      w->wait_on_device();
    else
      w->wait();
    st.p2p_wait_ms += ms_since(t);
    w.reset();
  };
  const auto send = [&](const Tensor& t, int peer, int tag) {
    if (in_posting_order_)
      round_sends.emplace_back(t, peer, tag);
    else
      st.p2p_bytes += sends.post(*pp_, t, peer, tag);
  };
  const auto post_recv = [&](Tensor& buf, comm::WorkPtr& work, int peer, int tag) {
    buf = Tensor::empty(hidden_shape_, DType::F32, device_);
    work = pp_->recv(buf.data<float>(), static_cast<size_t>(buf.numel()), DType::F32, peer, tag);
  };
  // The gradient of a stage's output, as the backward seed (in the output's dtype).
  const auto seed_of = [&](Slot& s, int mb, int stage) -> Tensor {
    if (stage == S - 1) return fns.loss_seed;
    wait(s.grad_work, true);  // unless handed over on this rank
    if (!s.grad.defined())
      PT_THROW(Error, "pipeline rank ", pp_rank_, ": no gradient arrived for the output of stage ", stage);
    return s.output.dtype() == DType::F32 ? s.grad : s.grad.to(s.output.dtype());
  };
  // After a backward (B or I): the input's gradient goes to the stage before (sent, or
  // handed over on this rank).
  const auto pass_gradient_upstream = [&](Slot& s, int mb, int stage) {
    if (stage == 0) return;
    const Tensor g = s.input.grad();
    if (!g.defined()) PT_THROW(Error, "pipeline rank ", pp_rank_, ": stage ", stage, "'s input got no gradient");
    if ((stage - 1) % p == pp_rank_) slots[{mb, stage - 1}].grad = g.detach().contiguous();
  };
  const auto release = [&](Slot& s) {
    s.output = Tensor();
    s.input = Tensor();
    s.grad = Tensor();
    --held;
  };

  const auto run_action = [&](const Action& a) {
    const int stage = stage_of(a);
    Slot& s = slots[{a.micro_batch, stage}];
    switch (a.kind) {
      case ActionKind::RecvF:
        if (in_posting_order_) break;  // posted at the end of the round its send is in
        post_recv(s.incoming, s.incoming_work, a.peer, message_tag(a.micro_batch, stage, S, false));
        break;
      case ActionKind::RecvB:
        if (in_posting_order_) break;
        post_recv(s.grad, s.grad_work, a.peer, message_tag(a.micro_batch, stage, S, true));
        break;
      case ActionKind::SendF:
        send(s.output, a.peer, message_tag(a.micro_batch, stage + 1, S, false));
        break;
      case ActionKind::SendB:
        send(s.input.grad(), a.peer, message_tag(a.micro_batch, stage - 1, S, true));
        if (s.backward_done) release(s);  // after B; after I the W still needs the graph
        break;
      case ActionKind::Forward: {
        if (stage == 0) {
          s.input = fns.tokens(a.micro_batch);
        } else {
          wait(s.incoming_work, true);
          if (!s.incoming.defined())
            PT_THROW(Error, "pipeline rank ", pp_rank_, ": no activations arrived for stage ", stage, ", micro-batch ",
                     a.micro_batch);
          s.input = s.incoming.detach();
          s.input.set_requires_grad(true);
          s.incoming = Tensor();
        }
        const auto t = Clock::now();
        s.output = fns.forward(a.micro_batch, a.chunk, s.input);
        st.compute_ms += ms_since(t);
        if (stage == S - 1) losses.push_back(s.output.detach());
        // The next stage on this rank takes the output directly.
        if (stage + 1 < S && (stage + 1) % p == pp_rank_) slots[{a.micro_batch, stage + 1}].incoming = s.output.detach();
        st.peak_held = std::max(st.peak_held, ++held);
        st.peak_activation_bytes = std::max(st.peak_activation_bytes, alloc.stats().bytes_in_use - bytes_at_start);
        break;
      }
      case ActionKind::Backward: {
        const Tensor seed = seed_of(s, a.micro_batch, stage);
        const auto t = Clock::now();
        autograd::backward(s.output, seed);
        st.compute_ms += ms_since(t);
        pass_gradient_upstream(s, a.micro_batch, stage);
        s.backward_done = true;
        if (stage == 0 || (stage - 1) % p == pp_rank_) release(s);  // else after its SEND_B
        break;
      }
      case ActionKind::BackwardInput: {
        const Tensor seed = seed_of(s, a.micro_batch, stage);
        const auto t = Clock::now();
        std::vector<Tensor> inputs;
        if (stage > 0) inputs.push_back(s.input);
        s.deferred.emplace(autograd::backward_input(s.output, seed, inputs));
        st.compute_ms += ms_since(t);
        pass_gradient_upstream(s, a.micro_batch, stage);
        s.output = Tensor();
        break;
      }
      case ActionKind::BackwardWeight: {
        if (!s.deferred) PT_THROW(Error, "pipeline rank ", pp_rank_, ": W of micro-batch ", a.micro_batch, " before its I");
        const auto t = Clock::now();
        s.deferred->run();
        st.compute_ms += ms_since(t);
        s.deferred.reset();
        release(s);
        break;
      }
    }
  };

  const auto& actions = schedule_.ranks[static_cast<size_t>(pp_rank_)];
  if (!in_posting_order_) {
    for (const Action& a : actions) run_action(a);
  } else {
    // Round by round (p2p_rounds.h): the round's actions, then its receives and sends in one
    // batch, whose counterparts are in the peers' batches of the same round.
    size_t next = 0;
    for (const P2pRound& round : rounds_) {
      for (; next < round.end_action; ++next) run_action(actions[next]);
      for (const P2pMessage& m : round.receives) {
        Slot& t = slots[{m.micro_batch, m.to_stage}];
        const int tag = message_tag(m.micro_batch, m.to_stage, S, m.gradient);
        if (m.gradient)
          post_recv(t.grad, t.grad_work, m.from, tag);
        else
          post_recv(t.incoming, t.incoming_work, m.from, tag);
      }
      for (const auto& [data, peer, tag] : round_sends) st.p2p_bytes += sends.post(*pp_, data, peer, tag);
      round_sends.clear();
    }
    if (next != actions.size())
      PT_THROW(Error, "pipeline rank ", pp_rank_, ": the message rounds cover ", next, " of its ", actions.size(),
               " actions");
  }
  for (auto& w : sends.works) wait(w, false);
  // The host's one wait for the step's losses (on a GPU), summed in the order they were made.
  for (double l : kernels::values_of(losses)) st.loss_sum += l;
  st.wall_ms = ms_since(t_step);
  return st;
}

Tensor PipelineExecutor::forward_only(const StageFunctions& fns, int mb) {
  const int p = schedule_.spec.stages, S = schedule_.num_model_stages();
  Tensor x;
  Outbox sends;
  for (int stage = 0; stage < S; ++stage) {
    if (stage % p != pp_rank_) continue;  // another rank's stage
    const int prev = (stage - 1 + p) % p;
    Tensor input;
    if (stage == 0) {
      input = fns.tokens(mb);
    } else if (prev == pp_rank_) {
      input = x;
    } else {
      input = Tensor::empty(hidden_shape_, DType::F32, device_);
      pp_->recv(input.data<float>(), static_cast<size_t>(input.numel()), DType::F32, prev,
                message_tag(mb, stage, S, false))
          ->wait_on_device();
    }
    x = fns.forward(mb, stage / p, input);
    if (stage + 1 < S && (stage + 1) % p != pp_rank_)
      sends.post(*pp_, x, (stage + 1) % p, message_tag(mb, stage + 1, S, false));
  }
  for (auto& w : sends.works) w->wait();
  return holds_model_stage(S - 1) ? x : Tensor();
}

}  // namespace paratrain::parallel::pipeline
