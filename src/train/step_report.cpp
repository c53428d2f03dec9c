#include "step_report.h"

#include <algorithm>
#include <type_traits>

#include "paratrain/nn/gpt.h"
#include "config_check.h"

namespace paratrain::train {

using namespace parallel;

void gather_step_report(StepReport& r, comm::ProcessGroup* pg, const MeshShape& shape, double weight,
                        const AllocatorStats& memory) {
  const StepOutcome& o = r.outcome;
  r.step_ms_per_rank = {r.step_s * 1e3};
  r.compute_ms_per_rank = {o.compute_s * 1e3};
  r.busy_ms_per_rank = {o.busy_ms};
  r.data_wait_ms_per_rank = {r.data_wait_s * 1e3};
  r.peak_per_rank = {memory.peak_bytes_in_use};
  r.allocated_per_rank = {memory.bytes_in_use};
  r.reserved_per_rank = {memory.bytes_reserved};
  r.activation_per_rank = {o.activation_bytes};
  if (!pg) return;
  const int world = shape.world();
  // Per rank, in one all-gather (on nccl, host buffers wait for the GPU: one call, not one per
  // kind of figure): the weighted loss (0 where no loss was computed: pipeline ranks without
  // the last stage), step, compute, data-wait, pipeline busy and pipeline wall ms; then the
  // allocator's peak, in-use and reserved bytes and the activation bytes.
  struct RankFigures {
    float loss, step_ms, compute_ms, data_wait_ms, busy_ms, wall_ms;
    int64_t peak, allocated, reserved, activation;
  };
  const RankFigures mine{o.computes_loss ? static_cast<float>(r.loss * weight) : 0.0f,
                         static_cast<float>(r.step_s * 1e3),
                         static_cast<float>(o.compute_s * 1e3),
                         static_cast<float>(r.data_wait_s * 1e3),
                         static_cast<float>(o.busy_ms),
                         static_cast<float>(o.wall_ms),
                         memory.peak_bytes_in_use,
                         memory.bytes_in_use,
                         memory.bytes_reserved,
                         o.activation_bytes};
  std::vector<RankFigures> all(static_cast<size_t>(world));
  static_assert(sizeof(RankFigures) % sizeof(int64_t) == 0 && std::is_trivially_copyable_v<RankFigures>);
  pg->allgather(&mine, all.data(), sizeof(RankFigures) / sizeof(int64_t), DType::I64)->wait();  // as bytes
  double sum = 0, busy = 0, wall = 0;
  r.step_ms_per_rank.clear(), r.compute_ms_per_rank.clear(), r.busy_ms_per_rank.clear(), r.data_wait_ms_per_rank.clear();
  r.peak_per_rank.clear(), r.allocated_per_rank.clear(), r.reserved_per_rank.clear(), r.activation_per_rank.clear();
  for (const RankFigures& k : all) {
    sum += k.loss;
    r.step_ms_per_rank.push_back(k.step_ms);
    r.compute_ms_per_rank.push_back(k.compute_ms);
    r.data_wait_ms_per_rank.push_back(k.data_wait_ms);
    r.busy_ms_per_rank.push_back(k.busy_ms);
    busy += k.busy_ms;
    wall += k.wall_ms;
    r.peak_per_rank.push_back(k.peak);
    r.allocated_per_rank.push_back(k.allocated);
    r.reserved_per_rank.push_back(k.reserved);
    r.activation_per_rank.push_back(k.activation);
  }
  r.loss = sum / (world / shape.pp);
  if (shape.pp > 1) r.bubble_fraction = wall > 0 ? 1.0 - busy / wall : 0.0;
}

void gather_memory_between_steps(RunFigures& run, ParallelModel& pm, comm::ProcessGroup* pg) {
  int64_t mine[3];  // optimizer state, gradients, parameters
  pm.memory_between_steps(mine);
  std::vector<int64_t> all(mine, mine + 3);
  if (pg) {
    all.resize(3 * static_cast<size_t>(pg->size()));
    pg->allgather(mine, all.data(), 3, DType::I64)->wait();
  }
  run.mem_optimizer_per_rank.clear(), run.mem_grad_per_rank.clear(), run.mem_param_per_rank.clear();
  for (size_t r = 0; r < all.size() / 3; ++r) {
    run.mem_optimizer_per_rank.push_back(all[3 * r]);
    run.mem_grad_per_rank.push_back(all[3 * r + 1]);
    run.mem_param_per_rank.push_back(all[3 * r + 2]);
  }
}

SlowestRank slowest_rank(const StepReport& r) {
  const size_t n = r.compute_ms_per_rank.size();
  if (n < 2 || r.data_wait_ms_per_rank.size() != n) return {};
  std::vector<double> work(n);
  for (size_t k = 0; k < n; ++k) work[k] = r.compute_ms_per_rank[k] + r.data_wait_ms_per_rank[k];
  const int slow = static_cast<int>(std::max_element(work.begin(), work.end()) - work.begin());
  std::vector<double> sorted = work;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[(n - 1) / 2];  // the lower middle: with 2 ranks, the faster one
  return {slow, median > 0 ? work[static_cast<size_t>(slow)] / median - 1.0 : 0.0};
}

nlohmann::json metrics_line(const StepReport& r, const TrainConfig& cfg, ParallelModel& pm, const DeviceMesh& mesh,
                            Task& task, const amp::MixedPrecision& mp, const RunFigures& run,
                            const std::vector<int64_t>* micro_batch_per_rank) {
  const MeshShape& shape = mesh.shape();
  const int world = shape.world();
  DistributedDataParallel* const ddp = pm.ddp();
  FullyShardedDataParallel* const fsdp = pm.fsdp();
  const FsdpStepStats z3 = fsdp ? fsdp->last_stats() : FsdpStepStats{};
  const double comm_ms = ddp ? ddp->last_stats().comm_ms : z3.gather_ms + z3.reduce_scatter_ms;
  const double exposed_ms =
      ddp ? ddp->last_stats().exposed_comm_ms : z3.gather_exposed_ms + z3.reduce_scatter_exposed_ms;
  nlohmann::json m = {{"step", r.step},
                      {"loss", r.loss},
                      {"lr", r.lr},
                      {"grad_norm", r.norm},
                      {"step_ms", r.step_s * 1e3},
                      {"compute_ms", r.step_s * 1e3 - exposed_ms},
                      {"comm_ms", comm_ms},
                      {"exposed_comm_ms", exposed_ms},
                      {"mfu", run.peak_flops > 0 ? run.flops_per_item * run.items_per_step / r.step_s /
                                                   (run.peak_flops * world)
                                             : 0.0},
                      {"peak_flops", run.peak_flops * world},
                      {"device", run.device},
                      {"page_faults", r.page_faults},
                      {"loss_scale", r.loss_scale},
                      {"skipped", r.skipped},
                      {"mem_peak_bytes", r.peak_per_rank},
                      {"mem_allocated_bytes", r.allocated_per_rank},
                      {"mem_reserved_bytes", r.reserved_per_rank},
                      {"step_ms_per_rank", r.step_ms_per_rank},
                      {"compute_ms_per_rank", r.compute_ms_per_rank},
                      {"data_wait_ms", r.data_wait_s * 1e3}};
  if (r.host_waits >= 0) m["host_waits"] = r.host_waits;
  if (mesh.world()) {
    m["world_size"] = world;
    m["data_wait_ms_per_rank"] = r.data_wait_ms_per_rank;
    const SlowestRank slow = slowest_rank(r);
    m["slowest_rank"] = slow.rank, m["slowest_rank_lag"] = slow.lag;
  }
  if (r.traffic.is_object()) {
    if (!r.traffic["busbw_gbps"].empty()) m["busbw_gbps"] = r.traffic["busbw_gbps"];
    if (!r.traffic["bytes"].empty()) m["comm_bytes_per_group"] = r.traffic["bytes"];
  }
  m["mem_optimizer_bytes"] = run.mem_optimizer_per_rank;
  m["mem_grad_bytes"] = run.mem_grad_per_rank;
  m["mem_param_bytes"] = run.mem_param_per_rank;
  if (pm.zero()) m["zero"] = cfg.zero;
  if (mp.half()) m["precision"] = amp::precision_name(run.compute_dtype), m["mem_half_copy_bytes"] = mp.half_copy_bytes();
  m["mem_activation_bytes"] = r.outcome.activation_bytes;
  m["mem_activation_bytes_per_rank"] = r.activation_per_rank;
  if (cfg.recompute != "none") m["recompute"] = cfg.recompute;
  if (ddp && mesh.dp())
    m["comm_bytes"] = ddp->last_stats().bytes, m["comm_bytes_uncompressed"] = ddp->last_stats().bytes_uncompressed;
  if (fsdp && mesh.dp()) {
    m["comm_bytes"] = z3.gather_bytes + z3.reduce_scatter_bytes;
    m["zero3"] = {{"gather_ms", z3.gather_ms},
                  {"gather_exposed_ms", z3.gather_exposed_ms},
                  {"reduce_scatter_ms", z3.reduce_scatter_ms},
                  {"reduce_scatter_exposed_ms", z3.reduce_scatter_exposed_ms},
                  {"gather_hidden_ms", std::max(0.0, z3.gather_ms - z3.gather_exposed_ms)},
                  {"reduce_scatter_hidden_ms", std::max(0.0, z3.reduce_scatter_ms - z3.reduce_scatter_exposed_ms)},
                  {"gathers", z3.gathers},
                  {"gather_bytes", z3.gather_bytes},
                  {"reduce_scatter_bytes", z3.reduce_scatter_bytes},
                  {"peak_gathered_units", z3.peak_gathered_units},
                  {"peak_gathered_bytes", z3.peak_gathered_bytes}};
  }
  m["layout"] = {{"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp}};
  // What `paratrain plan --check` needs to rebuild the run's memory estimate.
  m["micro_batch"] = run.micro_batch;
  m["grad_accum"] = cfg.grad_accum;
  m["bucket_mb"] = cfg.bucket_mb;
  if (const nn::GPT* g = task.gpt()) {
    const nn::GPTConfig& gc = g->config();
    m["model"] = {{"name", task.name()},           {"n_layer", gc.n_layer},       {"n_head", gc.n_head},
                  {"n_embd", gc.n_embd},         {"block_size", gc.block_size}, {"vocab_size", gc.vocab_size},
                  {"dropout", gc.dropout}};
  }
  if (cfg.zero == 3) m["zero3_prefetch"] = cfg.zero3_prefetch;
  if (pm.plan().size() > 1) {
    m["tp_comm_ms"] = r.tp.ms;
    m["tp_comm_bytes"] = r.tp.bytes;
    m["tp_comm_calls"] = r.tp.calls;
    if (cfg.sequence_parallel) m["sequence_parallel"] = true;
  }
  if (pm.pipelined()) {
    m["bubble_fraction"] = r.bubble_fraction;
    m["pp_schedule"] = cfg.pp_schedule;
    m["pp_virtual"] = pipeline_virtual_chunks(cfg);
    m["pp_p2p_ms"] = r.outcome.p2p_ms;
    m["pp_p2p_bytes"] = r.outcome.p2p_bytes;
    m["pp_busy_ms_per_rank"] = r.busy_ms_per_rank;
  }
  if (micro_batch_per_rank) m["micro_batch_per_rank"] = *micro_batch_per_rank;
  m[task.counts_tokens() ? "tokens_per_s" : "samples_per_s"] = static_cast<double>(run.items_per_step) / r.step_s;
  return m;
}

}  // namespace paratrain::train
