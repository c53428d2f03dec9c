#include "run_log.h"

#include <iomanip>
#include <sstream>

#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/pipeline/partition.h"

namespace paratrain::train {

using namespace parallel;

void log_run_header(std::ostream& log, const TrainConfig& cfg, const Task& task, ParallelModel& pm,
                    const DeviceMesh& mesh, int64_t steps, int64_t micro_batch) {
  const MeshShape& shape = mesh.shape();
  const int dp = shape.dp;
  log << "paratrain train: " << task.name() << ", " << pm.module().num_parameters() << " parameters"
      << (pm.plan().size() > 1 || pm.pipelined() ? " on this rank" : "") << ", " << steps << " steps, global batch " << micro_batch << " x "
      << cfg.grad_accum << " x " << dp << " = " << micro_batch * cfg.grad_accum * dp << " " << task.example_noun()
      << ", " << kernels::cpu::num_threads() << " threads" << (shape.world() > 1 ? " per rank" : "");
  if (const auto& pg = mesh.world())
    log << ", " << shape.world() << " ranks (" << pg->backend_name() << (cfg.deterministic ? ", deterministic" : "") << ")"
        << ", layout " << shape.str() << (cfg.sequence_parallel ? ", sequence parallel" : "");
  if (cfg.recompute != "none") log << ", recompute " << cfg.recompute;
  log << "\n";
  if (pm.pipelined())
    log << "pipeline: " << cfg.pp_schedule << ", " << pm.all_stages().size() << " stages, "
        << pipeline::describe_stages(pm.all_stages()) << " (cut by "
        << (cfg.pp_balance == "time" ? "measured time" : "parameter count") << "), " << cfg.grad_accum
        << " micro-batches per step\n";
  if (ZeroOptimizer* zero = pm.zero()) {
    const ZeroMemory zm = zero->memory();
    const auto mib = [](int64_t b) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1 << 20);
      return o.str();
    };
    if (FullyShardedDataParallel* fsdp = pm.fsdp()) {
      const FsdpMemory fm = fsdp->memory();
      log << "zero 3: per rank, parameters " << mib(fm.parameter_shard_bytes) << " MiB (unsharded "
          << mib(fm.parameter_bytes) << " MiB), gradient shard " << mib(fm.gradient_shard_bytes) << " MiB, optimizer state "
          << mib(zm.optimizer_bytes) << " MiB (unsharded " << mib(zm.optimizer_unsharded_bytes) << " MiB); "
          << fsdp->num_units() << " units gathered one at a time (largest " << mib(fm.largest_unit_bytes) << " MiB)"
          << (cfg.zero3_reshard_after_forward ? "" : ", kept from forward to backward") << "\n";
    } else {
      log << "zero " << cfg.zero << ": per rank, optimizer state " << mib(zm.optimizer_bytes) << " MiB (unsharded "
        << mib(zm.optimizer_unsharded_bytes) << " MiB), gradient shard " << mib(zm.gradient_shard_bytes) << " MiB"
        << (cfg.zero == 2 ? "; the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB) are held only from zero_grad to the reduce-scatter"
                          : " next to the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB)")
          << "\n";
    }
  }
  if (cfg.compress != "none")
    log << (!mesh.dp() ? "--compress " + cfg.compress + ": one data-parallel rank, nothing to send"
            : pm.fsdp() ? "--compress " + cfg.compress + " with --zero 3: parameters all-gathered and gradients "
                         "reduce-scattered in " + cfg.compress + " (half the bytes; shards and optimizer stay f32)"
                       : compress_summary(pm.module(), pm.ddp()->options().compress))
        << "\n";

}

std::string step_progress_text(const StepReport& r, const ProgressFigures& f, const TrainConfig& cfg,
                               const ParallelModel& pm) {
  std::ostringstream line;
  line << "step " << r.step + 1 << "/" << f.steps << " | loss " << std::fixed << std::setprecision(4) << r.loss
       << " | lr " << std::scientific << std::setprecision(2) << r.lr << std::fixed << " | " << std::setprecision(0)
       << f.rate << (f.counts_tokens ? " tok/s" : " samples/s") << " | ETA " << monitor::format_duration(f.eta_s);
  if (f.mfu >= 0) line << " | MFU " << std::setprecision(1) << 100.0 * f.mfu << "%";
  if (f.loss_scaling) line << " | scale " << std::setprecision(0) << r.loss_scale << (r.skipped ? " (skipped)" : "");
  const bool tp = pm.plan().size() > 1;
  if (tp || pm.pipelined()) line << " | " << pm.mesh().shape().str();
  if (tp) line << ", tp comm " << std::setprecision(1) << r.tp.ms << " ms";
  if (pm.pipelined()) line << ", " << cfg.pp_schedule << " bubble " << std::setprecision(2) << r.bubble_fraction;
  if (const SlowestRank slow = slowest_rank(r); slow.rank >= 0 && slow.lag > f.slow_rank_lag)
    line << " | slowest rank " << slow.rank << " (+" << std::setprecision(0) << 100 * slow.lag << "% compute+data)";
  return line.str();
}

void log_balance_change(std::ostream& log, int64_t from_step, const std::vector<int64_t>& sizes,
                        const StepReport& r) {
  log << "balance: from step " << from_step + 1 << " micro-batches per rank [";
  for (size_t k = 0; k < sizes.size(); ++k) log << (k ? ", " : "") << sizes[k];
  log << "] (measured compute ms per rank last step [";
  for (size_t k = 0; k < r.compute_ms_per_rank.size(); ++k)
    log << (k ? ", " : "") << std::lround(r.compute_ms_per_rank[k]);
  log << "])\n";
}

}  // namespace paratrain::train
