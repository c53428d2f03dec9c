#include "resume.h"

#include "paratrain/base/error.h"
#include "paratrain/base/log.h"
#include "run_record.h"

namespace paratrain::train {

std::optional<checkpoint::TrainingState> find_resume_state(const TrainConfig& cfg, const nlohmann::json& this_run,
                                                           int64_t steps, int world, int64_t restart_count,
                                                           std::ostream& log) {
  std::optional<checkpoint::TrainingState> resumed;
  if (!cfg.resume) log << "restart " << restart_count << " of the group: resuming from " << cfg.checkpoint_dir << "\n";
  const checkpoint::ResumePoint point = checkpoint::find_resume_point(cfg.checkpoint_dir);
  PT_LOG_DEBUG(kCheckpoint, "resume point in ", cfg.checkpoint_dir, ": ",
               point.checkpoint ? *point.checkpoint : std::string("none"), ", ", point.ignored.size(), " ignored");
  if (!point.ignored.empty()) log << ignored_checkpoints_warning(point) << "\n";
  if (const auto& ckpt = point.checkpoint) {
    resumed = checkpoint::load_training_state(*ckpt);
    PT_LOG_DEBUG(kCheckpoint, "loaded ", *ckpt, ": step ", resumed->step, ", saved by ", resumed->world_size, " ranks, ",
                 resumed->model.size(), " model tensors");
    check_resume_config(*ckpt, resumed->config, this_run);
    if (resumed->step > steps)
      PT_THROW(InputError, "cannot resume from ", *ckpt, ": it is at step ", resumed->step, ", beyond --steps ", steps);
    log << "resuming from " << *ckpt << " (step " << resumed->step << " of " << steps << ")";
    if (resumed->world_size != world) log << ", saved by " << resumed->world_size << " ranks, now " << world;
    if (!resumed->optimizer_shards.empty())
      log << ", optimizer state from " << resumed->optimizer_shards.size() << " shard(s)"
          << (cfg.zero > 0 ? (resumed->optimizer_shards.size() != static_cast<size_t>(world) ? ", re-cut" : "")
                           : ", assembled");
    log << "\n";
  } else if (point.ignored.empty()) {
    log << "no checkpoint in " << cfg.checkpoint_dir << ": starting from step 0\n";
  }
  return resumed;
}

}  // namespace paratrain::train
