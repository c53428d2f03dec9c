// A program's task checked before the first step, and every micro-batch's loss (task_checks.h).
#include "task_checks.h"

#include <vector>

#include "paratrain/base/error.h"

namespace paratrain::train {

void refuse_builtin_fields(const TrainConfig& c) {
  const auto refuse = [](const char* field, const std::string& value) {
    PT_THROW(InputError, "TrainConfig::", field, " is set (", value,
             "), but only the built-in tasks read it; a program's own Task brings its data and model (leave it unset)");
  };
  if (!c.data.empty()) refuse("data", c.data);
  if (!c.val_data.empty()) refuse("val_data", c.val_data);
  if (!c.dataset.empty()) refuse("dataset", c.dataset);
  if (!c.data_dir.empty()) refuse("data_dir", c.data_dir);
  if (c.n_layer) refuse("n_layer", std::to_string(c.n_layer));
  if (c.n_head) refuse("n_head", std::to_string(c.n_head));
  if (c.n_embd) refuse("n_embd", std::to_string(c.n_embd));
  if (c.block_size) refuse("block_size", std::to_string(c.block_size));
  if (c.vocab_size) refuse("vocab_size", std::to_string(c.vocab_size));
  if (c.dropout != 0.0f) refuse("dropout", std::to_string(c.dropout));
}

void check_task_supports(const TrainConfig& c, const parallel::MeshShape& shape, Task& task) {
  if (task.gpt()) return;
  const std::string who = "task '" + task.name() + "' has no GPT (Task::gpt() is null)";
  if (shape.tp > 1)
    PT_THROW(InputError, "TrainConfig::tp = ", shape.tp, ": tensor parallelism cuts a GPT's layers, and ", who,
             "; train it data-parallel (tp = 1)");
  if (shape.pp > 1)
    PT_THROW(InputError, "TrainConfig::pp = ", shape.pp, ": pipeline parallelism cuts a GPT's blocks, and ", who,
             "; train it data-parallel (pp = 1)");
  if (c.zero == 3)
    PT_THROW(InputError, "TrainConfig::zero = 3 shards a GPT block by block, and ", who, "; use zero = 1 or 2");
  if (c.recompute != "none")
    PT_THROW(InputError, "TrainConfig::recompute = ", c.recompute, " recomputes a GPT's blocks, and ", who,
             "; leave it \"none\"");
  if (c.sequence_parallel) PT_THROW(InputError, "TrainConfig::sequence_parallel needs a GPT, and ", who);
}

void check_trainable(Task& task) {
  for (const auto& [name, p] : task.module().named_parameters())
    if (p.requires_grad()) return;
  PT_THROW(InputError, "task '", task.name(), "': the model (Task::module()) has no parameter that requires a gradient;",
           " register its parameters with Module::register_parameter / register_module");
}

void check_tasks_agree(comm::ProcessGroup& world, Task& task) {
  const int W = world.size();
  const int64_t mine[2] = {task.num_examples(), task.steps_per_epoch()};
  std::vector<int64_t> all(2 * static_cast<size_t>(W));
  world.allgather(mine, all.data(), 2, DType::I64)->wait();
  for (int r = 1; r < W; ++r)
    if (all[2 * r] != all[0] || all[2 * r + 1] != all[1])
      PT_THROW(InputError, "rank ", world.rank(), ": the ranks' tasks differ: rank 0's training data has ", all[0],
               " examples (", all[1], " steps per epoch), rank ", r, "'s has ", all[2 * r], " (", all[2 * r + 1],
               "); every rank must see the same dataset (the data order gives each rank its part of it)");
}

void check_loss(const Tensor& loss, const Task& task) {
  if (!loss.defined())
    PT_THROW(InputError, "task '", task.name(), "': the loss function returned an undefined tensor");
  if (loss.numel() != 1)
    PT_THROW(InputError, "task '", task.name(), "': the loss function returned a tensor of shape ",
             shape_str(loss.shape()), "; it must return the batch's mean loss as a scalar (e.g. ops::mean of the per-example losses)");
  if (!loss.requires_grad())
    PT_THROW(InputError, "task '", task.name(),
             "': the loss does not depend on the model's parameters (it has no gradient); compute it from the "
             "model's forward, outside any NoGradGuard");
}

}  // namespace paratrain::train
