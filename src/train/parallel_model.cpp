#include "parallel_model.h"

#include <algorithm>

#include "config_check.h"
#include "test_hooks.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/tensor_parallel/grad_norm.h"

namespace paratrain::train {

using namespace parallel;

namespace {

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& cfg, const optim::NamedParams& params, double lr) {
  if (cfg.optimizer == "adamw") {
    optim::AdamWOptions o;
    o.lr = lr, o.beta1 = cfg.beta1, o.beta2 = cfg.beta2, o.eps = cfg.eps, o.weight_decay = cfg.weight_decay;
    return std::make_unique<optim::AdamW>(params, o);
  }
  optim::SGDOptions o;
  o.lr = lr, o.momentum = cfg.momentum, o.weight_decay = cfg.weight_decay;
  return std::make_unique<optim::SGD>(params, o);
}

nn::RecomputeMode recompute_mode(const std::string& s) {
  return s == "full" ? nn::RecomputeMode::Full : s == "selective" ? nn::RecomputeMode::Selective : nn::RecomputeMode::None;
}

}  // namespace

ParallelModel::ParallelModel(const TrainConfig& cfg, Task& task, const DeviceMesh& mesh, double lr, int64_t micro_batch)
    : model_(task.module()), mesh_(mesh) {
  nn::GPT* gpt = task.gpt();
  // Tensor parallelism cuts the (whole, initialised or loaded) model first.
  if (gpt) plan_ = parallelize_gpt(*gpt, mesh.tp(), {cfg.sequence_parallel});
  // Pipeline parallelism keeps this rank's stages of it.
  if (gpt) {
    const auto costs = cfg.pp_balance == "time" && mesh.shape().pp > 1
                           ? pipeline::measured_costs(*gpt, micro_batch, mesh.world().get())
                           : pipeline::parameter_costs(*gpt);
    const int v = mesh.shape().pp > 1 ? pipeline_virtual_chunks(cfg) : 1;
    all_stages_ = pipeline::all_stages(costs, mesh.shape().pp, v);
    chunks_ = pipeline::stage_chunks(costs, mesh.shape().pp, v, mesh.coord().pp);
    holds_last_ = pipeline::holds_last_stage(chunks_, gpt->config().n_layer);
    // --recompute: the blocks' innermost wrapper (ZeRO 3's gathers go around it); set up on
    // every block before the stage releases those it does not run.
    nn::recompute_blocks(*gpt, recompute_mode(cfg.recompute));
    if (mesh.shape().pp > 1) {
      pipeline::keep_stage_parameters(*gpt, chunks_);
      tied_ = pipeline::TiedHeadGroup(mesh, pipeline::holds_first_stage(chunks_), holds_last_);
    }
  }
  if (cfg.zero == 3) {
    FsdpOptions o;
    o.deterministic = cfg.deterministic;
    o.reshard_after_forward = cfg.zero3_reshard_after_forward;
    o.prefetch = cfg.zero3_prefetch;
    if (cfg.compress == "bf16" || cfg.compress == "fp16") o.comm_dtype = cfg.compress == "bf16" ? DType::BF16 : DType::F16;
    std::vector<nn::Module*> units;
    for (auto& block : gpt->h) units.push_back(block.get());
    fsdp_ = std::make_unique<FullyShardedDataParallel>(model_, units, mesh.dp(), o);  // dp rank 0's weights
  } else if (mesh.dp() || cfg.deterministic || cfg.zero > 0) {
    DdpOptions o;
    o.deterministic = cfg.deterministic;
    o.zero_stage = cfg.zero;  // ZeRO: gradients reduce-scattered into per-rank shards
    o.bucket_bytes = static_cast<size_t>(cfg.bucket_mb * (1 << 20));
    o.first_bucket_bytes = std::min<size_t>(o.bucket_bytes, size_t(1) << 20);
    o.compress = compress_options(cfg.compress, cfg.powersgd_rank, cfg.powersgd_start_iter, cfg.seed);
    // A pipeline step runs every backward inside no_sync() (its micro-batches interleave), and
    // finish() reduces every bucket.
    o.find_unused_parameters = pipelined();
    o.reorder_buckets = !pipelined();
    o.test_skip_allreduce_at = test_skip_allreduce_step(mesh.rank());  // test hook (PARATRAIN_TEST_SKIP_ALLREDUCE)
    ddp_ = std::make_unique<DistributedDataParallel>(model_, mesh.dp(), o);  // broadcasts dp rank 0's weights
  }
  params_ = model_.named_parameters();
  GradientShards* shards = fsdp_ ? static_cast<GradientShards*>(fsdp_.get()) : cfg.zero > 0 ? ddp_.get() : nullptr;
  // ZeRO (--zero 1|2|3): the optimizer holds state for, and updates, this rank's pieces only.
  opt_params_ = shards ? zero_pieces(*shards) : params_;
  opt_ = make_optimizer(cfg, opt_params_, lr);
  if (shards) zero_ = std::make_unique<ZeroOptimizer>(*shards, *opt_);
  break_reduction_ = break_reduction_hook(mesh.coord().dp, params_);
}

void ParallelModel::zero_grad() {
  if (fsdp_)
    fsdp_->zero_grad();
  else if (ddp_)
    ddp_->zero_grad();
  else
    model_.zero_grad();
}

float ParallelModel::backward_seed(int64_t grad_accum) const {
  return fsdp_ ? fsdp_->backward_seed(grad_accum)
         : ddp_ ? ddp_->backward_seed(grad_accum)
                : 1.0f / static_cast<float>(grad_accum);
}

std::optional<NoSyncScope> ParallelModel::no_sync() {
  std::optional<NoSyncScope> s;
  if (ddp_) s.emplace(ddp_->no_sync());
  if (fsdp_) s.emplace(fsdp_->no_sync());
  return s;
}

void ParallelModel::sum_tied_gradient() {
  for (auto& [name, p] : params_)
    if (name == "wte.weight") {
      Tensor g = p.grad();
      if (!g.defined()) {
        g = Tensor::zeros(p.shape(), p.dtype(), p.device_spec());
        p.set_grad(g);
      }
      tied_.sum_gradients(g);
    }
}

void ParallelModel::finish() {
  // The tied token table's two copies (first and last pipeline stage) get the sum of their
  // gradients. Without ZeRO after the data-parallel mean: both then hold the same bits and
  // take the same step. With ZeRO before it (afterwards only shards exist, cut differently on
  // the two stages); clip_and_step() then copies the first stage's updated weights over.
  if (tied_.active() && zero_) sum_tied_gradient();
  if (ddp_) ddp_->finish();    // .grad = mean over every micro-batch of every rank
  if (fsdp_) fsdp_->finish();  // this rank's shard of that mean
  if (break_reduction_ && ++finished_steps_ == break_reduction_->step) break_reduction(*break_reduction_, params_, ddp_.get());
  if (tied_.active() && !zero_) sum_tied_gradient();
}

double ParallelModel::grad_norm() {
  const bool spans_ranks = plan_.size() > 1 || pipelined();
  if (!spans_ranks) return zero_ ? zero_->grad_norm() : optim::grad_norm(params_);
  // Over the mesh: tp shards summed, replicated parameters once, the tied head's second copy
  // (last stage) not counted.
  optim::NamedParams counted;
  for (const auto& np : zero_ ? opt_params_ : params_)
    if (!(tied_.duplicate() && np.first.rfind("wte.weight", 0) == 0)) counted.push_back(np);
  return mesh_grad_norm(counted, [this](const std::string& n) { return plan_.sharded(n); }, mesh_, zero_ != nullptr);
}

void ParallelModel::clip_and_step(double max_norm, double norm) {
  if (zero_) {
    zero_->clip_grad_norm(max_norm, norm);
    zero_->step();  // this rank's pieces, then the parameters are all-gathered
    if (tied_.active())
      for (auto& [name, p] : params_)
        if (name == "wte.weight") tied_.broadcast_from_first(p);
  } else {
    optim::clip_grad_norm(params_, max_norm, norm);
    opt_->step();
  }
}

void ParallelModel::memory_between_steps(int64_t out[3]) const {
  out[0] = out[1] = out[2] = 0;  // optimizer state, gradients, parameters
  for (const auto& [key, t] : opt_->state_dict()) out[0] += static_cast<int64_t>(t.nbytes());
  if (fsdp_) {
    out[1] = fsdp_->gradient_bytes(), out[2] = fsdp_->memory().parameter_shard_bytes;
    return;
  }
  if (ddp_) out[1] = ddp_->gradient_bytes();
  for (const auto& [name, p] : params_) {
    out[2] += static_cast<int64_t>(p.nbytes());
    if (!ddp_) out[1] += p.grad().defined() ? static_cast<int64_t>(p.grad().nbytes()) : 0;
  }
}

std::map<std::string, Tensor> ParallelModel::whole_weights() {
  auto weights = plan_.gather_whole(fsdp_ ? fsdp_->full_state() : model_.state_dict());
  return pipelined() ? pipeline::gather_stages(weights, mesh_.pp().get()) : weights;
}

}  // namespace paratrain::train
