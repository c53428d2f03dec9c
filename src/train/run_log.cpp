#include "run_log.h"

#include <iomanip>
#include <sstream>

#include "paratrain/kernels/cpu.h"
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

}  // namespace paratrain::train
