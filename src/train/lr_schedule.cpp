#include "lr_schedule.h"

namespace paratrain::train {

optim::LRSchedule lr_schedule_for(const TrainConfig& cfg, Task& task, int64_t total_steps) {
  const double lr = cfg.lr >= 0 ? cfg.lr : (cfg.optimizer == "sgd" ? 0.05 : (task.gpt() ? 6e-4 : 1e-3));
  optim::LRSchedule sched;
  sched.kind = optim::LRSchedule::parse(cfg.lr_schedule);
  sched.lr = lr;
  sched.min_lr = cfg.min_lr >= 0 ? cfg.min_lr : lr / 10;
  sched.warmup = cfg.warmup_steps;
  sched.total = total_steps;
  return sched;
}

}  // namespace paratrain::train
