// The rounds of a schedule's messages (p2p_rounds.h): the schedule simulated round by round.
#include "paratrain/parallel/pipeline/p2p_rounds.h"

#include <set>
#include <string>
#include <tuple>

#include "paratrain/base/error.h"

namespace paratrain::parallel::pipeline {

std::vector<std::vector<P2pRound>> plan_p2p_rounds(const Schedule& schedule) {
  const int p = schedule.spec.stages, S = schedule.num_model_stages();
  using Key = std::tuple<int, int, bool>;  // (receiving stage, micro-batch, gradient)
  std::vector<std::set<Key>> delivered(static_cast<size_t>(p));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<std::vector<P2pRound>> plan(static_cast<size_t>(p));
  // The remote message an action needs before it runs, if any.
  const auto needs = [&](int r, const Action& a, Key& key) {
    const int stage = a.chunk * p + r;
    if (a.kind == ActionKind::Forward && stage > 0 && (stage - 1) % p != r) {
      key = {stage, a.micro_batch, false};
      return true;
    }
    if ((a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput) && stage + 1 < S &&
        (stage + 1) % p != r) {
      key = {stage, a.micro_batch, true};
      return true;
    }
    return false;
  };
  for (;;) {
    bool all_done = true, progressed = false;
    std::vector<std::vector<P2pMessage>> arriving(static_cast<size_t>(p));
    for (int r = 0; r < p; ++r) {
      const auto& actions = schedule.ranks[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      for (; i < actions.size(); ++i) {
        const Action& a = actions[i];
        Key key;
        if (needs(r, a, key) && !delivered[static_cast<size_t>(r)].count(key)) break;
        const int stage = a.chunk * p + r;
        if (a.kind == ActionKind::SendF)
          arriving[static_cast<size_t>(a.peer)].push_back({r, a.micro_batch, stage + 1, false});
        if (a.kind == ActionKind::SendB)
          arriving[static_cast<size_t>(a.peer)].push_back({r, a.micro_batch, stage - 1, true});
        progressed = true;
      }
      all_done = all_done && i == actions.size();
      plan[static_cast<size_t>(r)].push_back({i, {}});
    }
    // Delivered at the round's end: each rank receives them in this round's batch.
    for (int r = 0; r < p; ++r)
      for (const P2pMessage& m : arriving[static_cast<size_t>(r)]) {
        delivered[static_cast<size_t>(r)].insert({m.to_stage, m.micro_batch, m.gradient});
        plan[static_cast<size_t>(r)].back().receives.push_back(m);
        progressed = true;
      }
    if (all_done) return plan;
    if (!progressed) {  // every unfinished rank waits: name them all (one of them is the cause)
      std::string stuck;
      for (int r = 0; r < p; ++r) {
        const auto& actions = schedule.ranks[static_cast<size_t>(r)];
        const size_t i = next[static_cast<size_t>(r)];
        if (i == actions.size()) continue;
        const Action& a = actions[i];
        stuck += (stuck.empty() ? "" : ", ") + std::string("rank ") + std::to_string(r) + "'s " + action_name(a.kind) +
                 " of micro-batch " + std::to_string(a.micro_batch) + " (stage " + std::to_string(a.chunk * p + r) + ")";
      }
      PT_THROW(Error, "pipeline schedule ", schedule_name(schedule.spec.kind), ": ", stuck,
               " wait for messages no rank sends");
    }
  }
}

}  // namespace paratrain::parallel::pipeline
