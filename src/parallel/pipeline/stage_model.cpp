#include "paratrain/parallel/pipeline/stage_model.h"

#include "paratrain/base/error.h"

namespace paratrain::parallel::pipeline {

namespace {

// What replaces a released child: a module with no parameters.
class Released final : public nn::Module {};

double param_count(const nn::Module& m) { return static_cast<double>(m.num_parameters()); }

}  // namespace

StageCosts parameter_costs(const nn::GPT& model) {
  StageCosts c;
  for (const auto& b : model.h) c.blocks.push_back(param_count(*b));
  // The first stage holds the token and position tables; the last the final norm and the
  // tied head (its copy of the token table).
  c.first_extra = param_count(*model.wte) + param_count(*model.wpe);
  c.last_extra = param_count(*model.ln_f) + param_count(*model.wte);
  return c;
}

std::vector<StageRange> all_stages(const StageCosts& costs, int pp, int virtual_chunks) {
  if (pp < 1 || virtual_chunks < 1)
    PT_THROW(InputError, "pipeline: --pp ", pp, " and --pp-virtual ", virtual_chunks, " must be at least 1");
  const int stages = pp * virtual_chunks;
  if (stages > static_cast<int>(costs.blocks.size()))
    PT_THROW(InputError, "--pp ", pp, virtual_chunks > 1 ? " x --pp-virtual " + std::to_string(virtual_chunks) : "",
             " = ", stages, " pipeline stages, but the model has only ", costs.blocks.size(),
             " blocks (every stage needs at least one; use fewer stages or more --n-layer)");
  return balance_stages(costs.blocks, costs.first_extra, costs.last_extra, stages);
}

std::vector<StageRange> stage_chunks(const StageCosts& costs, int pp, int virtual_chunks, int pp_rank) {
  const auto stages = all_stages(costs, pp, virtual_chunks);
  std::vector<StageRange> mine;
  for (int c = 0; c < virtual_chunks; ++c) mine.push_back(stages[static_cast<size_t>(c * pp + pp_rank)]);
  return mine;
}

bool holds_first_stage(const std::vector<StageRange>& chunks) {
  for (const auto& c : chunks)
    if (c.first_block == 0) return true;
  return false;
}

bool holds_last_stage(const std::vector<StageRange>& chunks, int64_t n_layer) {
  for (const auto& c : chunks)
    if (c.end_block == n_layer) return true;
  return false;
}

void keep_stage_parameters(nn::GPT& model, const std::vector<StageRange>& chunks) {
  const int64_t L = static_cast<int64_t>(model.h.size());
  std::vector<bool> keep(static_cast<size_t>(L), false);
  for (const auto& c : chunks)
    for (int64_t b = c.first_block; b < c.end_block; ++b) keep[static_cast<size_t>(b)] = true;
  nn::Module* list = &model.child("h");
  for (int64_t b = 0; b < L; ++b)
    if (!keep[static_cast<size_t>(b)]) {
      list->replace_module(std::to_string(b), std::make_shared<Released>());
      model.h[static_cast<size_t>(b)].reset();
    }
  const bool first = holds_first_stage(chunks), last = holds_last_stage(chunks, L);
  if (!first) {
    model.replace_module("wpe", std::make_shared<Released>());
    model.wpe.reset();
  }
  if (!last) {
    model.replace_module("ln_f", std::make_shared<Released>());
    model.ln_f.reset();
  }
  if (!first && !last) {
    model.replace_module("wte", std::make_shared<Released>());
    model.wte.reset();
  }
}

TiedHeadGroup::TiedHeadGroup(const DeviceMesh& mesh, bool holds_first, bool holds_last) {
  const MeshShape& s = mesh.shape();
  if (s.pp == 1 || !mesh.world()) return;
  // One group per (dp, tp) coordinate: its first-stage rank and its last-stage rank. Every
  // rank creates all of them in the same order (new_group is collective over the world).
  for (int d = 0; d < s.dp; ++d)
    for (int t = 0; t < s.tp; ++t) {
      const int first = mesh_rank({d, t, 0}, s), last = mesh_rank({d, t, s.pp - 1}, s);
      auto g = mesh.world()->new_group({first, last});
      if (g) group_ = g;
    }
  duplicate_ = holds_last && !holds_first;
}

void TiedHeadGroup::broadcast_from_first(Tensor& param) const {
  if (!group_) return;
  if (!param.is_contiguous()) PT_THROW(Error, "TiedHeadGroup: wte is not contiguous");
  group_->broadcast(param.data<float>(), static_cast<size_t>(param.numel()), DType::F32, 0)->wait();
}

void TiedHeadGroup::sum_gradients(Tensor& grad) const {
  if (!group_ || !grad.defined()) return;
  if (!grad.is_contiguous()) PT_THROW(Error, "TiedHeadGroup: wte's gradient is not contiguous");
  group_->allreduce(grad.data<float>(), static_cast<size_t>(grad.numel()), DType::F32)->wait();
}

}  // namespace paratrain::parallel::pipeline
