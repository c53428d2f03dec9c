// The planner's enumeration of layouts, its step-time model and its report (planner.h,
// docs/plan.md).
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <map>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"
#include "paratrain/parallel/planner.h"
#include "paratrain/parallel/tensor_parallel/gpt_plan.h"
#include "planner_internal.h"

namespace paratrain::parallel::planner {

namespace {

// Ring collectives (REFERENCE.md): an all-reduce sends 2 (n-1)/n of the buffer per rank, a
// reduce-scatter or an all-gather (n-1)/n of the whole.
double ring_allreduce(double bytes, int n) { return n > 1 ? 2.0 * (n - 1) / n * bytes : 0.0; }
double ring_half(double bytes, int n) { return n > 1 ? 1.0 * (n - 1) / n * bytes : 0.0; }

std::string gib(double bytes, int precision = 2) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << bytes / double(int64_t(1) << 30);
  return o.str();
}

std::string fixed(double x, int precision) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(precision) << x;
  return o.str();
}

}  // namespace

TimeEstimate estimate_time(const PlanInput& in, const Layout& L) {
  const nn::GPTConfig& c = in.model;
  TimeEstimate t;
  const int devices = L.dp * L.tp * L.pp;
  const double peak = in.device.peak_flops(in.bf16) * in.efficiency;
  const double tokens = static_cast<double>(in.global_batch) * static_cast<double>(c.block_size);
  const double C = static_cast<double>(c.n_embd), T = static_cast<double>(c.block_size),
               Ln = static_cast<double>(c.n_layer);
  t.compute_s = c.flops_per_token() * tokens / (devices * peak);
  // Recomputation: full repeats the forward (a third of 6N + 12LCT); selective the attention
  // core's forward (4 L C T per token).
  const double fwd = c.flops_per_token() / 3.0;
  if (L.recompute == Recompute::Full) t.recompute_s = fwd * tokens / (devices * peak);
  if (L.recompute == Recompute::Selective) t.recompute_s = 4.0 * Ln * C * T * tokens / (devices * peak);
  double imbalance = 1.0;
  if (L.pp > 1) {
    const auto stages = detail::stage_ranges(c, L.pp * L.virtual_chunks);
    std::vector<double> per_rank(static_cast<size_t>(L.pp), 0.0);
    double total = 0;
    for (size_t s = 0; s < stages.size(); ++s) per_rank[s % L.pp] += stages[s].cost, total += stages[s].cost;
    imbalance = *std::max_element(per_rank.begin(), per_rank.end()) * L.pp / total;
    t.bubble_fraction = detail::schedule_check(L.schedule, L.pp, static_cast<int>(L.grad_accum), L.virtual_chunks).bubble_fraction;
  }
  const double busy = (t.compute_s + t.recompute_s) * imbalance;
  const double pipelined = busy / (1.0 - t.bubble_fraction);
  t.bubble_s = pipelined - busy;

  // Links: a group inside one node runs at the intra-node bandwidth, else at the inter-node.
  const int per_node = std::max(1, in.device.devices_per_node);
  const double bw_tp = L.tp <= per_node ? in.device.intra_node_bw : in.device.inter_node_bw;
  const double bw_dp = L.tp * L.dp <= per_node ? in.device.intra_node_bw : in.device.inter_node_bw;
  const double bw_pp = devices <= per_node ? in.device.intra_node_bw : in.device.inter_node_bw;

  // Data parallel: the f32 gradients of this rank's parameters (the biggest stage's).
  double params_rank = 0;
  {
    const auto stages = detail::stage_ranges(c, L.pp * L.virtual_chunks);
    std::vector<double> per(static_cast<size_t>(L.pp), 0.0);
    for (size_t s = 0; s < stages.size(); ++s)
      for (const auto& p : rank_parameters(c, L.tp, stages[s].first_block, stages[s].end_block))
        per[s % L.pp] += static_cast<double>(p.numel);
    params_rank = *std::max_element(per.begin(), per.end());
  }
  const double grad_bytes = 4.0 * params_rank;
  const double micro_compute = (t.compute_s + t.recompute_s) / static_cast<double>(L.grad_accum);
  const double last_backward = micro_compute * 2.0 / 3.0;  // what the last micro-batch's backward can hide
  double dp_exposed = 0;
  if (L.dp > 1) {
    if (L.zero == 0) {
      t.dp_bytes = ring_allreduce(grad_bytes, L.dp);
      t.dp_comm_s = t.dp_bytes / bw_dp;
      dp_exposed = std::max(0.0, t.dp_comm_s - last_backward);
    } else if (L.zero < 3) {
      // reduce-scatter of the gradients (overlapping backward), all-gather of the updated
      // parameters after the step (exposed).
      const double rs = ring_half(grad_bytes, L.dp), ag = ring_half(grad_bytes, L.dp);
      t.dp_bytes = rs + ag;
      t.dp_comm_s = t.dp_bytes / bw_dp;
      dp_exposed = std::max(0.0, rs / bw_dp - last_backward) + ag / bw_dp;
    } else {
      // every micro-batch gathers each unit for its forward and again for its backward; one
      // reduce-scatter per step; prefetching hides the gathers behind the compute.
      const double ag = 2.0 * static_cast<double>(L.grad_accum) * ring_half(grad_bytes, L.dp);
      const double rs = ring_half(grad_bytes, L.dp);
      t.dp_bytes = ag + rs;
      t.dp_comm_s = t.dp_bytes / bw_dp;
      const double units = static_cast<double>(c.n_layer + 1);
      dp_exposed = std::max(0.0, t.dp_comm_s - busy) + ag / bw_dp / (units * 2.0 * L.grad_accum);
    }
  }
  // Tensor parallel: 4 all-reduces of [B T C] per block per micro-batch (2 forward, 2
  // backward; 2 more with full recomputation), the embedding's and the vocab-parallel loss's
  // (3 of [B T] f32); none hidden.
  if (L.tp > 1) {
    const double a = in.bf16 ? 2.0 : 4.0;
    const double BT = static_cast<double>(L.micro_batch) * T;
    const double blocks = Ln / L.pp;
    const double per_block = (L.recompute == Recompute::Full ? 6.0 : 4.0) * ring_allreduce(a * BT * C, L.tp);
    const double per_mb = blocks * per_block + ring_allreduce(4.0 * BT * C, L.tp) / L.pp +
                          3.0 * ring_allreduce(4.0 * BT, L.tp) / L.pp;
    t.tp_bytes = per_mb * static_cast<double>(L.grad_accum);
    t.tp_comm_s = t.tp_bytes / bw_tp;
  }
  // Pipeline: each micro-batch's [B T C] f32 activation forward and its gradient backward at
  // every stage boundary; the fill and drain (2 (S - 1) hops) are on the critical path.
  double pp_exposed = 0;
  if (L.pp > 1) {
    const double msg = 4.0 * static_cast<double>(L.micro_batch) * T * C;
    t.pp_bytes = 2.0 * static_cast<double>(L.grad_accum) * L.virtual_chunks * msg;
    t.pp_comm_s = t.pp_bytes / bw_pp;
    pp_exposed = 2.0 * (L.pp * L.virtual_chunks - 1) * msg / bw_pp;
  }
  t.exposed_comm_s = dp_exposed + t.tp_comm_s + pp_exposed;
  t.step_s = pipelined + t.exposed_comm_s;
  return t;
}

Plan plan_layouts(const PlanInput& in) {
  const nn::GPTConfig& c = in.model;
  c.validate();
  if (in.devices < 1) PT_THROW(InputError, "--devices must be at least 1, got ", in.devices);
  if (in.global_batch < 1) PT_THROW(InputError, "--global-batch must be at least 1, got ", in.global_batch);
  if (in.device.usable_bytes() <= 0 || !(in.device.peak_flops(in.bf16) > 0))
    PT_THROW(InputError, "the device needs positive memory and peak FLOP/s");
  for (int64_t mb : in.micro_batches)
    if (mb < 1) PT_THROW(InputError, "--micro-batch must be at least 1, got ", mb);
  Plan plan;
  const int64_t usable = in.device.usable_bytes();
  MemoryOptions mo;
  mo.bf16 = in.bf16;
  mo.bucket_mb = in.bucket_mb;
  bool any_shape = false;
  for (int tp = 1; tp <= in.devices; ++tp) {
    if (in.devices % tp) continue;
    for (int pp = 1; tp * pp <= in.devices; ++pp) {
      if ((in.devices / tp) % pp) continue;
      const int dp = in.devices / (tp * pp);
      const std::string shape = "dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp);
      if (tp > 1 && (c.n_head % tp || c.n_embd % tp)) {
        ++plan.dropped["tp does not divide n_head " + std::to_string(c.n_head) + " and n_embd " +
                       std::to_string(c.n_embd) + " (dp x tp x pp shapes)"];
        continue;
      }
      if (pp > c.n_layer) {
        ++plan.dropped["pp above n_layer " + std::to_string(c.n_layer) + " (dp x tp x pp shapes)"];
        continue;
      }
      if (in.global_batch % dp) {
        ++plan.dropped["global batch not a multiple of dp (dp x tp x pp shapes)"];
        continue;
      }
      any_shape = true;
      std::vector<int64_t> mbs = in.micro_batches;
      if (mbs.empty())
        for (int64_t mb = 1; mb <= in.global_batch / dp; mb *= 2) mbs.push_back(mb);
      struct Sched {
        pipeline::ScheduleKind kind;
        int v;
      };
      std::vector<Sched> scheds;
      if (pp == 1)
        scheds.push_back({pipeline::ScheduleKind::OneFOneB, 1});
      else
        scheds = {{pipeline::ScheduleKind::GPipe, 1},
                  {pipeline::ScheduleKind::OneFOneB, 1},
                  {pipeline::ScheduleKind::Interleaved, 2},
                  {pipeline::ScheduleKind::ZeroBubble, 1}};
      for (int64_t mb : mbs) {
        if ((in.global_batch / dp) % mb) continue;
        const int64_t accum = in.global_batch / dp / mb;
        for (const auto& sc : scheds) {
          if (sc.kind == pipeline::ScheduleKind::Interleaved && (accum % pp || 2 * pp > c.n_layer)) continue;
          for (int zero = 0; zero <= 3; ++zero) {
            if (zero > 0 && dp == 1) continue;
            if (zero == 3 && pp > 1) continue;
            for (Recompute r : {Recompute::None, Recompute::Full, Recompute::Selective}) {
              Layout L;
              L.dp = dp, L.tp = tp, L.pp = pp;
              L.schedule = sc.kind, L.virtual_chunks = sc.v;
              L.zero = zero, L.recompute = r, L.micro_batch = mb, L.grad_accum = accum;
              ++plan.considered;
              // The rank holding the most: every pp stage's first rank (dp index 0 holds the
              // biggest ZeRO pieces; the others differ by padding only).
              Candidate cand;
              cand.layout = L;
              int64_t worst = -1;
              for (int s = 0; s < pp; ++s) {
                const int rank = s * tp * dp;
                const MemoryEstimate m = estimate_rank_memory(c, L, mo, rank);
                if (m.total() > worst) worst = m.total(), cand.memory = m, cand.worst_rank = rank;
              }
              if (worst > usable) {
                ++plan.dropped["needs more memory than the device's " + gib(static_cast<double>(usable)) +
                               " GiB usable"];
                continue;
              }
              cand.time = estimate_time(in, L);
              cand.tokens_per_s =
                  static_cast<double>(in.global_batch) * static_cast<double>(c.block_size) / cand.time.step_s;
              plan.fits.push_back(cand);
            }
          }
        }
      }
    }
  }
  if (!any_shape)
    PT_THROW(InputError, "no dp x tp x pp layout of ", in.devices, " devices suits the model and --global-batch ",
             in.global_batch, " (tp must divide n_head ", c.n_head, ", pp at most n_layer ", c.n_layer,
             ", the global batch a multiple of dp)");
  // Sorted by step time; within 0.5% by less memory.
  std::stable_sort(plan.fits.begin(), plan.fits.end(), [](const Candidate& a, const Candidate& b) {
    const double ta = a.time.step_s, tb = b.time.step_s;
    if (std::fabs(ta - tb) > 0.005 * std::min(ta, tb)) return ta < tb;
    return a.memory.total() < b.memory.total();
  });
  if (!plan.fits.empty()) {
    plan.recommended = 0;
    const Candidate& r = plan.fits[0];
    std::ostringstream o;
    o << r.layout.str() << ": the fastest layout that fits (estimated " << fixed(r.time.step_s * 1e3, 1)
      << " ms per step, " << gib(static_cast<double>(r.memory.total())) << " GiB on its fullest rank of "
      << gib(static_cast<double>(usable)) << " GiB usable, a margin of "
      << gib(static_cast<double>(usable - r.memory.total())) << " GiB"
      << (plan.fits.size() > 1 && std::fabs(plan.fits[1].time.step_s - r.time.step_s) <= 0.005 * r.time.step_s
              ? "; as fast as the next but holding less memory"
              : "")
      << ")";
    plan.reason = o.str();
  } else {
    plan.reason = "nothing fits: every one of the " + std::to_string(plan.considered) + " layouts needs more than " +
                  gib(static_cast<double>(usable)) + " GiB on some rank";
  }
  return plan;
}

std::string format_plan(const PlanInput& in, const Plan& plan, int top) {
  std::ostringstream o;
  const nn::GPTConfig& c = in.model;
  o << "model: n_layer " << c.n_layer << ", n_head " << c.n_head << ", n_embd " << c.n_embd << ", block_size "
    << c.block_size << ", vocab_size " << c.vocab_size << " (" << fixed(parameter_count(c) / 1e6, 2)
    << "M parameters); global batch " << in.global_batch << " sequences; " << (in.bf16 ? "bf16" : "fp32") << "\n";
  o << "devices: " << in.devices << " x " << in.device.name << ", " << gib(static_cast<double>(in.device.memory_bytes))
    << " GiB (" << gib(static_cast<double>(in.device.usable_bytes())) << " usable), "
    << fixed(in.device.peak_flops(in.bf16) / 1e12, 2) << " TFLOP/s peak at " << fixed(in.efficiency * 100, 0)
    << "% (" << in.device.note << ")\n";
  o << "layouts: " << plan.considered << " considered, " << plan.fits.size() << " fit";
  int64_t dropped = 0;
  for (const auto& [why, n] : plan.dropped) dropped += n;
  o << "; dropped:";
  if (plan.dropped.empty()) o << " none";
  for (const auto& [why, n] : plan.dropped) o << " " << n << " " << why << ";";
  o << "\n";
  if (!plan.fits.empty()) {
    o << "memory per rank in GiB (the fullest rank); time per optimizer step; communication per rank per step in MB\n";
    o << std::left << std::setw(4) << "#" << std::setw(4) << "dp" << std::setw(4) << "tp" << std::setw(4) << "pp"
      << std::setw(14) << "schedule" << std::setw(5) << "zero" << std::setw(10) << "recompute" << std::setw(5) << "mb"
      << std::setw(6) << "accum" << std::right << std::setw(8) << "weights" << std::setw(8) << "grads"
      << std::setw(8) << "optim" << std::setw(8) << "activ" << std::setw(8) << "buffers" << std::setw(8) << "total"
      << std::setw(11) << "step_ms" << std::setw(8) << "bubble" << std::setw(10) << "dp_MB" << std::setw(10)
      << "tp_MB" << std::setw(9) << "pp_MB" << std::setw(12) << "tokens/s" << "\n";
    const size_t n = top > 0 ? std::min(plan.fits.size(), static_cast<size_t>(top)) : plan.fits.size();
    for (size_t i = 0; i < n; ++i) {
      const Candidate& k = plan.fits[i];
      const Layout& L = k.layout;
      std::string sched = L.pp > 1 ? std::string(pipeline::schedule_name(L.schedule)) : "-";
      if (L.pp > 1 && L.virtual_chunks > 1) sched += " v" + std::to_string(L.virtual_chunks);
      const auto g = [](int64_t b) { return gib(static_cast<double>(b)); };
      o << std::left << std::setw(4) << i + 1 << std::setw(4) << L.dp << std::setw(4) << L.tp << std::setw(4) << L.pp
        << std::setw(14) << sched << std::setw(5) << L.zero << std::setw(10) << recompute_name(L.recompute)
        << std::setw(5) << L.micro_batch << std::setw(6) << L.grad_accum << std::right << std::setw(8)
        << g(k.memory.weights) << std::setw(8) << g(k.memory.gradients) << std::setw(8) << g(k.memory.optimizer)
        << std::setw(8) << g(k.memory.activations) << std::setw(8) << g(k.memory.buffers) << std::setw(8)
        << g(k.memory.total()) << std::setw(11) << fixed(k.time.step_s * 1e3, 1) << std::setw(8)
        << fixed(k.time.bubble_fraction, 3) << std::setw(10) << fixed(k.time.dp_bytes / 1e6, 1) << std::setw(10)
        << fixed(k.time.tp_bytes / 1e6, 1) << std::setw(9) << fixed(k.time.pp_bytes / 1e6, 1) << std::setw(12)
        << fixed(k.tokens_per_s, 0) << "\n";
    }
    if (n < plan.fits.size()) o << "(" << plan.fits.size() - n << " more that fit; --top 0 prints all)\n";
    o << "recommended: " << plan.reason << "\n";
  } else {
    o << plan.reason << "\n";
  }
  return o.str();
}

std::string plan_json(const PlanInput& in, const Plan& plan, int top) {
  using nlohmann::json;
  json j;
  const nn::GPTConfig& c = in.model;
  j["model"] = {{"n_layer", c.n_layer},       {"n_head", c.n_head},         {"n_embd", c.n_embd},
                {"block_size", c.block_size}, {"vocab_size", c.vocab_size}, {"parameters", parameter_count(c)}};
  j["global_batch"] = in.global_batch;
  j["devices"] = in.devices;
  j["device"] = {{"name", in.device.name},
                 {"memory_bytes", in.device.memory_bytes},
                 {"usable_bytes", in.device.usable_bytes()},
                 {"peak_flops", in.device.peak_flops(in.bf16)},
                 {"efficiency", in.efficiency}};
  j["precision"] = in.bf16 ? "bf16" : "fp32";
  j["considered"] = plan.considered;
  j["dropped"] = plan.dropped;
  json rows = json::array();
  const size_t n = top > 0 ? std::min(plan.fits.size(), static_cast<size_t>(top)) : plan.fits.size();
  for (size_t i = 0; i < n; ++i) {
    const Candidate& k = plan.fits[i];
    const Layout& L = k.layout;
    rows.push_back({{"dp", L.dp},
                    {"tp", L.tp},
                    {"pp", L.pp},
                    {"schedule", L.pp > 1 ? pipeline::schedule_name(L.schedule) : "none"},
                    {"virtual_chunks", L.virtual_chunks},
                    {"zero", L.zero},
                    {"recompute", recompute_name(L.recompute)},
                    {"micro_batch", L.micro_batch},
                    {"grad_accum", L.grad_accum},
                    {"memory",
                     {{"weights", k.memory.weights},
                      {"gradients", k.memory.gradients},
                      {"optimizer", k.memory.optimizer},
                      {"activations", k.memory.activations},
                      {"buffers", k.memory.buffers},
                      {"total", k.memory.total()},
                      {"rank", k.worst_rank}}},
                    {"time",
                     {{"step_s", k.time.step_s},
                      {"compute_s", k.time.compute_s},
                      {"recompute_s", k.time.recompute_s},
                      {"bubble_fraction", k.time.bubble_fraction},
                      {"bubble_s", k.time.bubble_s},
                      {"dp_comm_s", k.time.dp_comm_s},
                      {"tp_comm_s", k.time.tp_comm_s},
                      {"pp_comm_s", k.time.pp_comm_s},
                      {"exposed_comm_s", k.time.exposed_comm_s}}},
                    {"comm_bytes", {{"dp", k.time.dp_bytes}, {"tp", k.time.tp_bytes}, {"pp", k.time.pp_bytes}}},
                    {"tokens_per_s", k.tokens_per_s}});
  }
  j["layouts"] = rows;
  j["fits"] = plan.fits.size();
  j["recommended"] = plan.recommended ? json(0) : json(nullptr);
  j["reason"] = plan.reason;
  return j.dump(1) + "\n";
}

}  // namespace paratrain::parallel::planner
