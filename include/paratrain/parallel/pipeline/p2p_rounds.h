// A pipeline schedule's point-to-point messages in rounds that every rank computes alike from
// the schedule, for groups that match a peer's messages in posting order and start them only
// in batches, one batch after another (P2pMatching::InPostingOrder: nccl).
//
// Rounds: in round k every rank runs its actions in order as far as the data it has allows
// (its own stages' outputs, and the messages of rounds before k), and the messages it sends in
// round k are delivered at the round's end. Rank r's batch k holds its sends of round k and
// the receives of the messages sent to it in round k, so every operation of it has its
// counterpart in a peer's batch k: the batches k of all ranks run together and none waits for
// a batch the peer starts only later. (Posting each message as a rank's own order reaches it
// deadlocks the interleaved schedule, whose two directions between a pair cross: each rank
// starts a batch with a send whose receive the other posts in a later batch.) The executor
// posts a round's receives and sends together at the round's end, after the round's compute,
// so a batch is whole rounds, never split between two sends of one round.
//
// Used by the pipeline executor (executor.h); plain values and a pure function, thread-safe.
#pragma once

#include <cstddef>
#include <vector>

#include "paratrain/parallel/pipeline/schedule.h"

namespace paratrain::parallel::pipeline {

// One message: activations (gradient false) or a gradient for model stage `to_stage` of
// micro-batch `micro_batch`, from pipeline rank `from`.
struct P2pMessage {
  int from = 0;
  int micro_batch = 0;
  int to_stage = 0;
  bool gradient = false;
  bool operator==(const P2pMessage&) const = default;
};

struct P2pRound {
  size_t end_action = 0;               // the rank's actions [previous round's end, end_action)
  std::vector<P2pMessage> receives;    // sent to the rank in this round, each sender's in its order
};

// Per rank, its rounds (the same count for every rank; a rank may have nothing in some).
// Error naming every waiting rank and its action when the schedule cannot complete (a rank
// waits for a message no rank sends).
std::vector<std::vector<P2pRound>> plan_p2p_rounds(const Schedule& schedule);

}  // namespace paratrain::parallel::pipeline
