// What a checkpoint records about the run, and the checks a resume makes against it.
#include "run_record.h"

#include "paratrain/amp/mixed_precision.h"
#include "paratrain/base/error.h"

namespace paratrain::train {

// What a checkpoint records about the run: the data layout, and every setting that changes
// the arithmetic (`model`: the task's name) (a resume under different values would not continue the same run).
nlohmann::json run_config(const TrainConfig& c, const std::string& model, int64_t micro_batch,
                          const parallel::MeshShape& mesh, int64_t steps, double lr) {
  return {{"layout",
           {{"micro_batch", micro_batch},
            {"grad_accum", c.grad_accum},
            {"dp", mesh.dp},
            {"tp", mesh.tp},
            {"pp", mesh.pp},
            {"seed", c.seed},
            {"zero", c.zero}}},
          {"math",
           {{"model", model},         {"n_layer", c.n_layer},           {"n_head", c.n_head},
            {"n_embd", c.n_embd},       {"block_size", c.block_size},     {"vocab_size", c.vocab_size},
            {"dropout", c.dropout},     {"steps", steps},                 {"optimizer", c.optimizer},
            {"lr", lr},                 {"beta1", c.beta1},               {"beta2", c.beta2},
            {"eps", c.eps},             {"momentum", c.momentum},         {"weight_decay", c.weight_decay},
            {"lr_schedule", c.lr_schedule}, {"warmup_steps", c.warmup_steps}, {"min_lr", c.min_lr},
            {"grad_clip", c.grad_clip}, {"seed", c.seed},
            {"precision", amp::precision_name(amp::parse_precision(c.precision))},
            {"loss_scale", !c.loss_scale.empty()                                                ? c.loss_scale
                           : amp::default_loss_scale(amp::parse_precision(c.precision)).enabled ? "dynamic"
                                                                                                : "none"},
            {"loss_scale_growth_interval", c.loss_scale_growth_interval}}}};
}

// InputError unless `saved` (from the checkpoint) describes the same run as `now`: every
// "math" setting equal, and the same global batch (micro_batch x grad_accum x dp) and seed.
void check_resume_config(const std::string& ckpt, const nlohmann::json& saved, const nlohmann::json& now) {
  if (!saved.contains("math") || !saved.contains("layout"))
    PT_THROW(InputError, "checkpoint ", ckpt, " does not record the run's configuration; cannot resume from it");
  // Settings added after checkpoints already existed: a checkpoint without them was saved
  // with their defaults.
  static const nlohmann::json kLaterDefaults = {
      {"precision", "fp32"}, {"loss_scale", "none"}, {"loss_scale_growth_interval", 2000}};
  for (const auto& [key, value] : now["math"].items()) {
    const nlohmann::json* was = saved["math"].contains(key) ? &saved["math"][key]
                                : kLaterDefaults.contains(key) ? &kLaterDefaults[key]
                                                               : nullptr;
    if (!was || *was != value)
      PT_THROW(InputError, "cannot resume from ", ckpt, ": it was saved with ", key, " = ",
               was ? was->dump() : std::string("(none)"), ", this run has ", key, " = ", value.dump(),
               " (resume with the same settings)");
  }
  const auto& a = saved["layout"];
  const auto& b = now["layout"];
  const int64_t ga = a.value("micro_batch", int64_t(0)) * a.value("grad_accum", int64_t(0)) * a.value("dp", int64_t(0));
  const int64_t gb = b["micro_batch"].get<int64_t>() * b["grad_accum"].get<int64_t>() * b["dp"].get<int64_t>();
  if (ga != gb)
    PT_THROW(InputError, "cannot resume from ", ckpt, ": its global batch is ", a.value("micro_batch", 0), " x ",
             a.value("grad_accum", 0), " x ", a.value("dp", 0), " = ", ga, " (micro-batch x grad-accum x ranks), this run's is ",
             b["micro_batch"].get<int64_t>(), " x ", b["grad_accum"].get<int64_t>(), " x ", b["dp"].get<int64_t>(), " = ", gb,
             "; choose --micro-batch/--grad-accum so that the global batch is the same");
}

// The one warning line about the incomplete checkpoints (killed saves) a resume passes over.
std::string ignored_checkpoints_warning(const checkpoint::ResumePoint& p) {
  std::string names;
  for (const auto& d : p.ignored) names += (names.empty() ? "" : ", ") + d;
  return "warning: ignoring incomplete checkpoint" + std::string(p.ignored.size() > 1 ? "s " : " ") + names +
         " (no manifest.json: a save was interrupted)" +
         (p.checkpoint ? "" : "; no complete checkpoint, starting from step 0");
}

// Each rank finds its resume point on its own; the answer is a function of the files
// (checkpoint::find_resume_point), so the ranks agree unless the directory changed while
// they read it. Checked before any step runs: ranks at different steps would fail later in
// a collective, or train on wrong weights. Error naming the ranks otherwise.
void check_ranks_start_at_the_same_step(comm::ProcessGroup& pg, int64_t start_step, const std::string& dir) {
  std::vector<int64_t> all(static_cast<size_t>(pg.size()));
  pg.allgather(&start_step, all.data(), 1, DType::I64)->wait();
  for (int r = 1; r < pg.size(); ++r)
    if (all[r] != all[0])
      PT_THROW(Error, "rank ", pg.rank(), ": the ranks disagree on where to resume: rank 0 starts at step ", all[0],
               ", rank ", r, " at step ", all[r], " (each rank reads ", dir,
               " on its own; did it change while the job started?)");
}

}  // namespace paratrain::train
