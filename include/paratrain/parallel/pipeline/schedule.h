// Pipeline schedules as data: for p ranks (pipeline stages), m micro-batches and v model
// chunks per rank, the ordered list of actions each rank runs in one optimizer step
// (../shared/REFERENCE.md, "Pipeline schedules"; torch.distributed.pipelining's action
// names). A schedule can be printed, and checked on its own before anything runs it.
//
// Model stages. The model is cut into S = p x v stages of consecutive layers; rank r holds
// the stages r, r + p, ..., r + (v - 1) p (chunk c of rank r is stage c p + r). With v = 1
// stage s is rank s. A micro-batch's forward goes through the stages 0..S-1, its backward
// back through S-1..0; each hop between two ranks is a send on one and a receive on the other.
//
// Actions: F (forward of one micro-batch on one chunk), B (its whole backward), I and W (the
// backward split into the input gradient, on the critical path, and the weight gradient,
// which zb1p defers into the bubbles), and the point-to-point actions around them: RECV_F
// before an F whose input comes from another rank, SEND_F after an F whose output goes to
// one, RECV_B / SEND_B likewise for the gradients (around B or I). Sends do not block (the
// executor's send/recv must buffer), receives wait for their matching send.
//
// Schedules (`--pp-schedule`):
//   gpipe        all m forwards, then all m backwards; holds m micro-batches of activations.
//   1f1b         stage s runs p - s - 1 warm-up forwards, then one forward and one backward in
//                turn, then the remaining backwards; holds at most p - s.
//   interleaved  1F1B over the v chunks of each rank (Megatron-LM's order); needs m a multiple
//                of p; bubble (p - 1) / (v m + p - 1).
//   zb1p         1F1B with the backward split into I and W (arXiv 2401.10241, ZB-H1): the
//                gradient goes upstream after I, and each W runs later, where the rank would
//                otherwise wait; memory as 1F1B's.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::parallel::pipeline {

enum class ScheduleKind { GPipe, OneFOneB, Interleaved, ZeroBubble };

// "gpipe" | "1f1b" | "interleaved" | "zb1p"; InputError naming the choices otherwise.
ScheduleKind parse_schedule(const std::string& name);
const char* schedule_name(ScheduleKind kind);

enum class ActionKind { Forward, Backward, BackwardInput, BackwardWeight, SendF, RecvF, SendB, RecvB };
const char* action_name(ActionKind kind);  // "F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"

struct Action {
  ActionKind kind;
  int micro_batch = 0;
  int chunk = 0;  // which of the rank's v chunks (stage chunk * p + rank)
  int peer = -1;  // the other rank of a send or receive
  bool operator==(const Action&) const = default;
};

struct ScheduleSpec {
  ScheduleKind kind = ScheduleKind::OneFOneB;
  int stages = 1;         // p: pipeline ranks
  int micro_batches = 1;  // m
  int virtual_chunks = 1; // v: chunks per rank (interleaved only; 1 otherwise)
};

struct Schedule {
  ScheduleSpec spec;
  std::vector<std::vector<Action>> ranks;  // per rank, in execution order
  int num_model_stages() const { return spec.stages * spec.virtual_chunks; }
};

// InputError (one line naming the flag) for p < 1, m < 1, v < 1, v > 1 with a schedule other
// than interleaved, interleaved with m not a multiple of p.
Schedule build_schedule(const ScheduleSpec& spec);

// What running a schedule would do, found by simulating it: every rank executes its actions
// in order, a compute action takes its cost and starts once its inputs exist (the previous
// stage's forward, the next stage's backward, this stage's forward of the micro-batch), a
// receive waits for its send.
struct ScheduleCost {
  double forward = 1, backward_input = 1, backward_weight = 1;  // B costs I + W
  // Per rank, a factor on its compute actions' costs (stages of unequal work, e.g. the last
  // one also running the LM head); empty = 1 for every rank. InputError unless empty or one
  // positive factor per rank.
  std::vector<double> rank_scale;
};
struct ScheduleCheck {
  bool ok = false;
  std::string problem;  // when not ok: the rank, the action and what it waits for or lacks
  double makespan = 0;  // wall time of the step in cost units
  double bubble_fraction = 0;  // 1 - busy / (p x makespan), over all ranks
  // Per rank: the most micro-batch chunks whose forward ran and whose backward (B, or W for
  // the split backward) had not yet -- the activations it holds at its peak.
  std::vector<int> peak_activations;
};
// Checks the schedule: every (micro-batch, stage) has exactly one F and one B (or one I and
// one W), on the rank that holds the stage; each F after the F of the stage before, each
// backward after the backward of the stage after and after its own F; W after its I; every
// receive matched by a send of the same kind, micro-batch and stage on the peer; and no
// deadlock. The first violation is reported in `problem`.
ScheduleCheck check_schedule(const Schedule& schedule, const ScheduleCost& cost = {});

// The bubble fraction the theory gives: (p - 1) / (v m + p - 1) for gpipe, 1f1b and
// interleaved with B = 2 F; zb1p's is the simulated one.
double theoretical_bubble(const ScheduleSpec& spec);

// One line per rank: "rank 0: F0 SEND_F0>1 F1 ..." (chunk shown as F0.c1 when v > 1).
std::string format_schedule(const Schedule& schedule);

}  // namespace paratrain::parallel::pipeline
