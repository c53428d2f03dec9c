// Pipeline schedules as data (pipeline/schedule.h): the compute order of each schedule, the
// point-to-point actions around it, and the simulation that checks a schedule.
#include "paratrain/parallel/pipeline/schedule.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "paratrain/base/error.h"

namespace paratrain::parallel::pipeline {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  if (name == "zb1p") return ScheduleKind::ZeroBubble;
  PT_THROW(InputError, "unknown --pp-schedule '", name, "' (expected gpipe, 1f1b, interleaved or zb1p)");
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved: return "interleaved";
    case ScheduleKind::ZeroBubble: return "zb1p";
  }
  return "?";
}

const char* action_name(ActionKind kind) {
  switch (kind) {
    case ActionKind::Forward: return "F";
    case ActionKind::Backward: return "B";
    case ActionKind::BackwardInput: return "I";
    case ActionKind::BackwardWeight: return "W";
    case ActionKind::SendF: return "SEND_F";
    case ActionKind::RecvF: return "RECV_F";
    case ActionKind::SendB: return "SEND_B";
    case ActionKind::RecvB: return "RECV_B";
  }
  return "?";
}

namespace {

bool is_backward(ActionKind k) { return k == ActionKind::Backward || k == ActionKind::BackwardInput; }

// The compute actions of rank r, in order.
std::vector<Action> compute_order(const ScheduleSpec& s, int r) {
  const int p = s.stages, m = s.micro_batches, v = s.virtual_chunks;
  std::vector<Action> out;
  auto F = [&](int j, int c = 0) { out.push_back({ActionKind::Forward, j, c}); };
  auto B = [&](int j, int c = 0) { out.push_back({ActionKind::Backward, j, c}); };
  switch (s.kind) {
    case ScheduleKind::GPipe:
      for (int j = 0; j < m; ++j) F(j);
      for (int j = 0; j < m; ++j) B(j);
      break;
    case ScheduleKind::OneFOneB:
    case ScheduleKind::ZeroBubble: {
      const int warmup = std::min(p - r - 1, m);
      for (int j = 0; j < warmup; ++j) F(j);
      for (int i = 0; i < m - warmup; ++i) F(warmup + i), B(i);
      for (int j = m - warmup; j < m; ++j) B(j);
      if (s.kind == ScheduleKind::ZeroBubble) {
        // Each B becomes I (the gradient goes upstream at once) and W, which runs next: in
        // the drain it fills the time the rank would wait for the next gradient.
        std::vector<Action> split;
        for (const Action& a : out) {
          if (a.kind != ActionKind::Backward) {
            split.push_back(a);
            continue;
          }
          split.push_back({ActionKind::BackwardInput, a.micro_batch, a.chunk});
          split.push_back({ActionKind::BackwardWeight, a.micro_batch, a.chunk});
        }
        out = std::move(split);
      }
      break;
    }
    case ScheduleKind::Interleaved: {
      // Megatron-LM's order: micro-batches in groups of p, each group through chunk 0..v-1
      // forwards and v-1..0 backwards.
      const int total = m * v;
      auto mb = [&](int k) { return (k / (p * v)) * p + k % p; };
      auto chunk_f = [&](int k) { return (k / p) % v; };
      auto chunk_b = [&](int k) { return v - 1 - (k / p) % v; };
      const int warmup = v == 1 ? std::min(p - r - 1, m) : std::min((p - r - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) F(mb(k), chunk_f(k));
      for (int i = 0; i < total - warmup; ++i) F(mb(warmup + i), chunk_f(warmup + i)), B(mb(i), chunk_b(i));
      for (int k = total - warmup; k < total; ++k) B(mb(k), chunk_b(k));
      break;
    }
  }
  return out;
}

}  // namespace

Schedule build_schedule(const ScheduleSpec& spec) {
  if (spec.stages < 1) PT_THROW(InputError, "--pp must be at least 1, got ", spec.stages);
  if (spec.micro_batches < 1) PT_THROW(InputError, "pipeline micro-batches (--grad-accum) must be at least 1, got ", spec.micro_batches);
  if (spec.virtual_chunks < 1) PT_THROW(InputError, "--pp-virtual must be at least 1, got ", spec.virtual_chunks);
  if (spec.virtual_chunks > 1 && spec.kind != ScheduleKind::Interleaved)
    PT_THROW(InputError, "--pp-virtual ", spec.virtual_chunks, " needs --pp-schedule interleaved (", schedule_name(spec.kind),
             " runs one chunk per rank)");
  if (spec.kind == ScheduleKind::Interleaved && spec.micro_batches % spec.stages != 0)
    PT_THROW(InputError, "--pp-schedule interleaved needs the micro-batches (--grad-accum ", spec.micro_batches,
             ") to be a multiple of --pp ", spec.stages);
  Schedule sched;
  sched.spec = spec;
  const int p = spec.stages, S = p * spec.virtual_chunks;
  sched.ranks.resize(static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    auto& list = sched.ranks[static_cast<size_t>(r)];
    for (const Action& a : compute_order(spec, r)) {
      const int stage = a.chunk * p + r;
      const bool fwd = a.kind == ActionKind::Forward, bwd = is_backward(a.kind);
      const int from = fwd ? stage - 1 : stage + 1, to = fwd ? stage + 1 : stage - 1;
      if ((fwd || bwd) && from >= 0 && from < S && from % p != r)
        list.push_back({fwd ? ActionKind::RecvF : ActionKind::RecvB, a.micro_batch, a.chunk, from % p});
      list.push_back(a);
      if ((fwd || bwd) && to >= 0 && to < S && to % p != r)
        list.push_back({fwd ? ActionKind::SendF : ActionKind::SendB, a.micro_batch, a.chunk, to % p});
    }
  }
  return sched;
}

ScheduleCheck check_schedule(const Schedule& sc, const ScheduleCost& cost) {
  const int p = sc.spec.stages, m = sc.spec.micro_batches, S = sc.num_model_stages();
  ScheduleCheck out;
  out.peak_activations.assign(static_cast<size_t>(p), 0);
  auto fail = [&](int r, const Action& a, const std::string& why) {
    std::ostringstream o;
    o << "rank " << r << ": " << action_name(a.kind) << " of micro-batch " << a.micro_batch << " (stage "
      << a.chunk * p + r << ") " << why;
    out.ok = false;
    out.problem = o.str();
    return out;
  };
  if (!cost.rank_scale.empty()) {
    if (static_cast<int>(cost.rank_scale.size()) != p)
      PT_THROW(InputError, "schedule cost: ", cost.rank_scale.size(), " rank factors for ", p, " ranks");
    for (double f : cost.rank_scale)
      if (!(f > 0)) PT_THROW(InputError, "schedule cost: a rank factor must be positive, got ", f);
  }
  if (static_cast<int>(sc.ranks.size()) != p) {
    out.problem = "the schedule has " + std::to_string(sc.ranks.size()) + " ranks for " + std::to_string(p) + " stages";
    return out;
  }
  // Finish times of what happened: (kind, micro-batch, model stage) -> time.
  using Key = std::tuple<ActionKind, int, int>;
  std::map<Key, double> done;
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0), busy(static_cast<size_t>(p), 0.0);
  std::vector<int> held(static_cast<size_t>(p), 0);
  auto at = [&](ActionKind k, int j, int s) -> const double* {
    auto it = done.find({k, j, s});
    return it == done.end() ? nullptr : &it->second;
  };
  size_t left = 0;
  for (const auto& l : sc.ranks) left += l.size();
  while (left > 0) {
    bool progressed = false;
    for (int r = 0; r < p; ++r) {
      auto& list = sc.ranks[static_cast<size_t>(r)];
      while (next[r] < list.size()) {
        const Action& a = list[next[r]];
        const int s = a.chunk * p + r, j = a.micro_batch;
        if (a.chunk < 0 || a.chunk >= sc.spec.virtual_chunks || j < 0 || j >= m) return fail(r, a, "is out of range");
        const Key self{a.kind, j, s};
        if (done.count(self)) return fail(r, a, "appears twice");
        double ready = clock[r], dur = 0;
        bool wait = false;
        auto need = [&](ActionKind k, int jj, int ss) {
          const double* t = at(k, jj, ss);
          if (!t) return wait = true, false;
          ready = std::max(ready, *t);
          return true;
        };
        auto upstream_backward = [&](int ss) {  // the stage after ss finished its input gradient
          return at(ActionKind::Backward, j, ss) ? need(ActionKind::Backward, j, ss)
                                                 : need(ActionKind::BackwardInput, j, ss);
        };
        switch (a.kind) {
          case ActionKind::Forward:
            if (s > 0) {
              if ((s - 1) % p == r) {
                if (!at(ActionKind::Forward, j, s - 1)) return fail(r, a, "runs before the forward of the stage before it");
                need(ActionKind::Forward, j, s - 1);
              } else if (!at(ActionKind::RecvF, j, s)) {
                return fail(r, a, "has no RECV_F before it");
              } else {
                need(ActionKind::RecvF, j, s);
              }
            }
            dur = cost.forward;
            break;
          case ActionKind::Backward:
          case ActionKind::BackwardInput:
            if (!at(ActionKind::Forward, j, s)) return fail(r, a, "runs before its forward");
            need(ActionKind::Forward, j, s);
            if (s < S - 1) {
              if ((s + 1) % p == r) {
                if (!at(ActionKind::Backward, j, s + 1) && !at(ActionKind::BackwardInput, j, s + 1))
                  return fail(r, a, "runs before the backward of the stage after it");
                upstream_backward(s + 1);
              } else if (!at(ActionKind::RecvB, j, s)) {
                return fail(r, a, "has no RECV_B before it");
              } else {
                need(ActionKind::RecvB, j, s);
              }
            }
            dur = a.kind == ActionKind::Backward ? cost.backward_input + cost.backward_weight : cost.backward_input;
            break;
          case ActionKind::BackwardWeight:
            if (!at(ActionKind::BackwardInput, j, s)) return fail(r, a, "runs before its I");
            need(ActionKind::BackwardInput, j, s);
            dur = cost.backward_weight;
            break;
          case ActionKind::SendF:
          case ActionKind::SendB: {
            const bool f = a.kind == ActionKind::SendF;
            const int to = f ? s + 1 : s - 1;
            if (to < 0 || to >= S || to % p != a.peer) return fail(r, a, "sends to a rank that does not hold the next stage");
            if (f ? !at(ActionKind::Forward, j, s) : !(at(ActionKind::Backward, j, s) || at(ActionKind::BackwardInput, j, s)))
              return fail(r, a, "sends before it computed what it sends");
            f ? need(ActionKind::Forward, j, s) : upstream_backward(s);
            break;
          }
          case ActionKind::RecvF:
          case ActionKind::RecvB: {
            const bool f = a.kind == ActionKind::RecvF;
            const int from = f ? s - 1 : s + 1;
            if (from < 0 || from >= S || from % p != a.peer) return fail(r, a, "receives from a rank that does not hold the stage");
            need(f ? ActionKind::SendF : ActionKind::SendB, j, from);  // waits (never: a deadlock)
            break;
          }
        }
        if (wait) break;
        if (!cost.rank_scale.empty()) dur *= cost.rank_scale[static_cast<size_t>(r)];
        const double end = ready + dur;
        done[self] = end;
        clock[r] = end;
        busy[r] += dur;
        if (a.kind == ActionKind::Forward) out.peak_activations[r] = std::max(out.peak_activations[r], ++held[r]);
        if (a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardWeight) --held[r];
        ++next[r];
        --left;
        progressed = true;
      }
    }
    if (!progressed) {
      for (int r = 0; r < p; ++r)
        if (next[r] < sc.ranks[r].size())
          return fail(r, sc.ranks[r][next[r]], "waits forever: the schedule deadlocks");
    }
  }
  // Every micro-batch through every stage, forward and backward, once.
  for (int j = 0; j < m; ++j)
    for (int s = 0; s < S; ++s) {
      const Action probe{ActionKind::Forward, j, s / p};
      if (!at(ActionKind::Forward, j, s)) return fail(s % p, probe, "never runs");
      const bool whole = at(ActionKind::Backward, j, s), split = at(ActionKind::BackwardInput, j, s);
      if (whole == split || (split && !at(ActionKind::BackwardWeight, j, s)))
        return fail(s % p, {ActionKind::Backward, j, s / p}, "needs exactly one B, or one I and one W");
    }
  double total_busy = 0;
  for (int r = 0; r < p; ++r) out.makespan = std::max(out.makespan, clock[r]), total_busy += busy[r];
  out.bubble_fraction = out.makespan > 0 ? 1.0 - total_busy / (p * out.makespan) : 0.0;
  out.ok = true;
  return out;
}

double theoretical_bubble(const ScheduleSpec& s) {
  const double p = s.stages, m = s.micro_batches, v = s.virtual_chunks;
  if (s.kind == ScheduleKind::ZeroBubble)  // idle (p-1)(F + I) per rank of m(F + I + W) work, unit costs
    return 2 * (p - 1) / (3 * m + 2 * (p - 1));
  return (p - 1) / (v * m + p - 1);
}

std::string format_schedule(const Schedule& sc) {
  std::ostringstream o;
  for (size_t r = 0; r < sc.ranks.size(); ++r) {
    o << "rank " << r << ":";
    for (const Action& a : sc.ranks[r]) {
      o << " " << action_name(a.kind) << a.micro_batch;
      if (sc.spec.virtual_chunks > 1) o << ".c" << a.chunk;
      if (a.kind == ActionKind::SendF || a.kind == ActionKind::SendB) o << ">" << a.peer;
      if (a.kind == ActionKind::RecvF || a.kind == ActionKind::RecvB) o << "<" << a.peer;
    }
    o << "\n";
  }
  return o.str();
}

}  // namespace paratrain::parallel::pipeline
