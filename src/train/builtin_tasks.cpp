#include "builtin_tasks.h"

namespace paratrain::train {

bool is_gpt_model(const std::string& m) { return m == "gpt-nano" || m == "gpt-mini" || m == "gpt2-124m" || m == "gpt"; }

std::unique_ptr<Task> make_builtin_task(const TrainConfig& cfg, int64_t micro_batch, int dp, int tp) {
  if (is_gpt_model(cfg.model)) return make_gpt_task(cfg, micro_batch, dp, tp);
  return make_image_task(cfg, micro_batch, dp);
}

}  // namespace paratrain::train
