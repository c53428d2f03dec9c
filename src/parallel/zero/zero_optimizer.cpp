// ZeroOptimizer: the optimizer step of ZeRO stages 1 and 2 over DistributedDataParallel's
// gradient shards (zero.h).
//
// Per step, after ddp.finish() left this rank's block of the mean gradient of every bucket in
// its shard:
//   1. grad_norm(): each rank sums the squares of its pieces (f64), the partial sums are
//      all-gathered (as raw 64-bit words: the groups reduce f32/i64, not f64) and added in
//      rank order, so every rank gets the same norm.
//   2. clip_grad_norm(): the pieces' gradients are scaled, as optim::clip_grad_norm.
//   3. step(): the inner optimizer updates the pieces -- 1-D views into the parameters'
//      memory (stage 3: into the parameter shards) -- with the same kernel and per-element
//      arithmetic as the unsharded optimizer; then publish_parameters() (stages 1/2: every
//      rank's block is all-gathered back into every parameter; stage 3: nothing).
#include "paratrain/parallel/zero.h"

#include "paratrain/kernels/tensor_reduce.h"
#include "parallel/flat_ops.h"
#include "parallel/rank_sum.h"

#include <cmath>
#include <cstring>
#include <unordered_map>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::parallel {

optim::NamedParams zero_pieces(GradientShards& shards) {
  if (shards.zero_stage() == 0)
    PT_THROW(InputError, "zero_pieces: DistributedDataParallel was built without zero_stage (1 or 2)");
  optim::NamedParams out;
  for (auto& piece : shards.shard_pieces()) {
    Tensor p = piece.param;
    p.set_grad(piece.grad);
    out.emplace_back(piece.name, p);
  }
  return out;
}

ZeroOptimizer::ZeroOptimizer(GradientShards& shards, optim::Optimizer& opt)
    : shards_(shards), opt_(opt), stage_(shards.zero_stage()), pieces_(shards.shard_pieces()) {
  if (stage_ == 0) PT_THROW(InputError, "ZeroOptimizer: DistributedDataParallel was built without zero_stage (1 or 2)");
  const auto& ps = opt.params();
  bool same = ps.size() == pieces_.size();
  for (size_t i = 0; same && i < ps.size(); ++i)
    same = ps[i].first == pieces_[i].name && ps[i].second.data_ptr() == pieces_[i].param.data_ptr() &&
           ps[i].second.numel() == pieces_[i].param.numel();
  if (!same)
    PT_THROW(InputError, "ZeroOptimizer: the optimizer must be built over zero_pieces(shards) (", ps.size(),
             " parameters given, this rank owns ", pieces_.size(), " pieces)");
  std::vector<int64_t> dims;
  for (const auto& p : pieces_) dims.push_back(static_cast<int64_t>(p.shape.size()));
  opt_.set_param_dims(std::move(dims));
}

double ZeroOptimizer::grad_norm() {
  std::vector<Tensor> grads;
  for (const auto& p : pieces_) grads.push_back(p.grad);
  double sq = kernels::sum_of_squares(grads);  // one read-back, not one per piece
  sq = detail::sum_in_rank_order(shards_.process_group().get(), sq);
  return std::sqrt(sq);
}

void ZeroOptimizer::clip_grad_norm(double max_norm, double norm) {
  if (max_norm <= 0.0 || norm <= max_norm) return;
  const float coef = static_cast<float>(max_norm / (norm + 1e-6));  // as optim::clip_grad_norm
  for (const auto& p : pieces_) {
    const detail::OnDeviceOf on(p.grad);
    kernels::kernel(&kernels::Registry::scale, p.grad)(p.grad.data<float>(), p.grad.data<float>(), coef, p.grad.numel());
  }
}

void ZeroOptimizer::step() {
  opt_.step();
  shards_.publish_parameters();
}

checkpoint::OptimizerShard ZeroOptimizer::shard_state() const {
  checkpoint::OptimizerShard s;
  for (const auto& p : pieces_) s.pieces.push_back({p.name, p.begin, p.param.numel(), p.shape});
  s.tensors = opt_.state_dict();
  return s;
}

void ZeroOptimizer::load_state(const std::map<std::string, Tensor>& full, int64_t steps_taken) {
  // Which state tensors a piece has: the names the inner optimizer itself reports.
  std::unordered_map<std::string, const ShardPiece*> by_name;
  for (const auto& p : pieces_) by_name[p.name] = &p;
  std::map<std::string, Tensor> mine;
  for (const auto& [key, cur] : opt_.state_dict()) {
    const auto dot = key.rfind('.');
    PT_CHECK(dot != std::string::npos && by_name.count(key.substr(0, dot)), "state tensor ", key, " of no piece");
    const auto& piece = *by_name.at(key.substr(0, dot));
    auto it = full.find(key);
    if (it == full.end()) PT_THROW(InputError, "optimizer state: missing tensor '", key, "'");
    if (it->second.numel() != shape_numel(piece.shape))
      PT_THROW(InputError, "optimizer state: tensor '", key, "' has shape ", shape_str(it->second.shape()),
               ", expected ", shape_str(piece.shape));
    mine[key] = it->second.contiguous().view({-1}).narrow(0, piece.begin, piece.param.numel());
  }
  opt_.load_state_dict(mine, steps_taken);
}

ZeroMemory ZeroOptimizer::memory() const {
  ZeroMemory m;
  int64_t owned = 0, total = 0;
  for (const auto& p : pieces_) owned += p.param.numel();
  for (const auto& [name, t] : shards_.module().named_parameters())
    if (t.requires_grad()) total += t.numel();
  for (const auto& [key, t] : opt_.state_dict()) m.optimizer_bytes += static_cast<int64_t>(t.nbytes());
  // AdamW and SGD keep the same state for every element, so the unsharded size scales.
  if (owned > 0)
    m.optimizer_unsharded_bytes =
        static_cast<int64_t>(static_cast<double>(m.optimizer_bytes) * static_cast<double>(total) / static_cast<double>(owned));
  m.gradient_bytes = shards_.gradient_bytes();
  m.gradient_shard_bytes = owned * static_cast<int64_t>(sizeof(float));
  return m;
}

}  // namespace paratrain::parallel
