#include "checkpoint_saver.h"

#include <cstdio>
#include <string>

#include "paratrain/base/log.h"
#include "paratrain/base/trace.h"


namespace paratrain::train {

using namespace parallel;

CheckpointSaver::CheckpointSaver(const TrainConfig& cfg, Task& task, ParallelModel& model, const DeviceMesh& mesh,
                                 amp::MixedPrecision& mp, nlohmann::json run_config,
                                 std::function<void(int64_t)> before_manifest)
    : cfg_(cfg),
      task_(task),
      model_(model),
      mesh_(mesh),
      mp_(mp),
      run_config_(std::move(run_config)),
      before_manifest_(std::move(before_manifest)) {}

checkpoint::TrainingState CheckpointSaver::run_state(int64_t done) const {
  checkpoint::TrainingState st;
  st.step = done;
  st.model_metadata = task_.metadata();
  st.zero_stage = cfg_.zero;
  st.optimizer_steps = model_.optimizer().steps_taken();
  st.loss_scale = mp_.scaler().scale();
  st.loss_scale_growth_tracker = mp_.scaler().growth_tracker();
  if (Generator* gen = task_.generator()) st.rng = gen->state();
  st.world_size = mesh_.shape().world();
  st.config = run_config_;
  return st;
}

void CheckpointSaver::save(int64_t done) {
  trace::Span span("checkpoint save", "train");
  span.num("step", static_cast<double>(done));
  const MeshShape& shape = mesh_.shape();
  const MeshCoord me = mesh_.coord();
  const int rank = mesh_.rank(), world = shape.world();
  comm::ProcessGroup* const pg = mesh_.world().get();
  const auto& plan = model_.plan();
  ZeroOptimizer* zero = model_.zero();
  FullyShardedDataParallel* fsdp = model_.fsdp();
  optim::Optimizer& opt = model_.optimizer();
  // The model in parts, one per (pipeline stage, tp index), written by their dp-rank-0 ranks.
  const bool parted = (plan.size() > 1 || model_.pipelined()) && !fsdp;
  PT_LOG_DEBUG(kCheckpoint, "saving ", checkpoint::checkpoint_name(done), " in ", cfg_.checkpoint_dir,
               zero ? " (optimizer shards)" : "", parted ? " (model parts)" : "", !zero && !parted && rank != 0 ? " (rank 0 writes it)" : "");
  if (!zero && !parted) {
    if (rank != 0) return before_manifest_(done);  // it writes no file of the checkpoint
    checkpoint::TrainingState st = run_state(done);
    st.model = model_.module().state_dict();
    st.optimizer = opt.state_dict();
    checkpoint::save_training_state(cfg_.checkpoint_dir, st, 2, [&] { before_manifest_(done); });
    return;
  }
  int32_t go = rank == 0 ? static_cast<int32_t>(checkpoint::prepare_checkpoint(cfg_.checkpoint_dir, done)) : 0;
  if (pg) pg->broadcast(&go, 1, DType::I32, 0)->wait();
  if (!go) return;  // this step's checkpoint is already complete
  const auto crc_bits = [](const checkpoint::ShardFileInfo& f) {
    return static_cast<int64_t>(std::stoul(f.crc32, nullptr, 16));
  };
  int64_t info[4] = {0, 0, 0, 0};  // part bytes, part CRC, shard bytes, shard CRC
  if (parted && me.dp == 0) {
    const auto part = checkpoint::write_model_part(cfg_.checkpoint_dir, done, me.tp, shape.tp, model_.module().state_dict(),
                                                   zero ? std::map<std::string, Tensor>{} : opt.state_dict(),
                                                   plan.cuts(), opt.steps_taken(), me.pp, shape.pp);
    info[0] = static_cast<int64_t>(part.bytes), info[1] = crc_bits(part);
  }
  if (zero) {
    checkpoint::OptimizerShard shard = zero->shard_state();
    if (fsdp) shard.params = fsdp->parameter_pieces();
    const auto mine = checkpoint::write_optimizer_shard(cfg_.checkpoint_dir, done, rank, world, shard,
                                                        opt.steps_taken(), me.tp, shape.tp, me.pp, shape.pp);
    info[2] = static_cast<int64_t>(mine.bytes), info[3] = crc_bits(mine);
  }
  if (rank != 0) before_manifest_(done);  // its files written; rank 0 never gets their CRCs: no manifest
  std::vector<int64_t> all(info, info + 4);
  if (pg) {
    all.resize(4 * static_cast<size_t>(world));
    pg->allgather(info, all.data(), 4, DType::I64)->wait();
  }
  if (rank != 0) return;
  const auto file = [&all](std::string name, int r, int at) {
    char crc[9];
    std::snprintf(crc, sizeof crc, "%08lx", static_cast<unsigned long>(all[4 * r + at + 1]));
    return checkpoint::ShardFileInfo{std::move(name), static_cast<uint64_t>(all[4 * r + at]), crc};
  };
  checkpoint::TrainingState st = run_state(done);
  if (parted || (fsdp && shape.tp > 1)) {
    st.tp_size = shape.tp;
    st.pp_size = shape.pp;
    st.cuts = plan.cuts();
  }
  if (parted)
    st.model_parts.resize(static_cast<size_t>(shape.tp * shape.pp));
  else if (fsdp)
    st.model_in_shards = true;
  else
    st.model = model_.module().state_dict();
  for (int r = 0; r < world; ++r) {
    const MeshCoord c = mesh_coord(r, shape);
    if (parted && c.dp == 0)
      st.model_parts[static_cast<size_t>(c.pp * shape.tp + c.tp)] =
          file(checkpoint::model_part_file_name(c.tp, shape.tp, c.pp, shape.pp), r, 0);
    if (zero) st.optimizer_shards.push_back(file(checkpoint::optimizer_shard_file_name(r, world), r, 2));
  }
  checkpoint::save_training_state(cfg_.checkpoint_dir, st, 2, [&] { before_manifest_(done); });
}

}  // namespace paratrain::train
