// One pipeline rank's share of a GPT: the model chunks (consecutive block ranges) it runs.
//
// With p pipeline ranks and v chunks per rank the GPT is cut into S = p x v stages
// (partition.h); rank r runs stages r, r + p, ..., r + (v - 1) p (schedule.h). stage_chunks()
// picks the ranges; keep_stage_parameters() then drops from the model everything the rank's
// chunks never use, so that named_parameters() and state_dict() list only the stage's tensors
// under their usual (Hugging Face) names: the blocks of its chunks, wte and wpe on the rank
// holding the first stage, ln_f on the one holding the last, and wte again there for the tied
// LM head. The two copies of wte (first and last stage) start equal and stay equal: their
// gradients are summed across the two ranks each step (TiedHeadGroup) and the optimizer
// applies the same update to both.
//
// Thread-safety: none (call during set-up). Lifetime: the model must outlive what refers to it.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/parallel/pipeline/partition.h"

namespace paratrain::parallel::pipeline {

// The cost of each block and of what sits outside them, for balance_stages(): parameter
// counts (`--pp-balance params`, the default).
struct StageCosts {
  std::vector<double> blocks;
  double first_extra = 0, last_extra = 0;
};
StageCosts parameter_costs(const nn::GPT& model);
// Measured costs (`--pp-balance time`): each block's forward and backward on a (B, T, C)
// micro-batch of random hidden states, the embedding's and the head's with the loss, the
// fastest of a few runs, in milliseconds, on the parameters' device (each run timed until
// its work on a GPU is done). Rank 0's figures are broadcast over `world` (may
// be null), so every rank cuts the model the same way. Collective; call before the model is
// cut into stages. Parameters' gradients are left as they were.
StageCosts measured_costs(nn::GPT& model, int64_t micro_batch, comm::ProcessGroup* world);

// Rank `pp_rank`'s chunks (chunk c = model stage c x pp + pp_rank) of the S = pp x virtual_chunks
// stages balance_stages() cuts with `costs`. InputError when S exceeds the blocks.
std::vector<StageRange> stage_chunks(const StageCosts& costs, int pp, int virtual_chunks, int pp_rank);
// All S stages, in model order.
std::vector<StageRange> all_stages(const StageCosts& costs, int pp, int virtual_chunks);

// Releases every block outside `chunks`, and wte / wpe / ln_f when no chunk needs them.
void keep_stage_parameters(nn::GPT& model, const std::vector<StageRange>& chunks);

bool holds_first_stage(const std::vector<StageRange>& chunks);
bool holds_last_stage(const std::vector<StageRange>& chunks, int64_t n_layer);

// The tied token table's two copies: sums wte's gradient between the rank holding the first
// stage and the one holding the last (same dp and tp coordinates). Collective at construction
// over the world (every rank calls it, in the same order); a no-op with pp = 1.
class TiedHeadGroup {
 public:
  TiedHeadGroup() = default;
  TiedHeadGroup(const DeviceMesh& mesh, bool holds_first, bool holds_last);
  // Sums `grad` in place over the two copies (nothing when this rank holds neither or both).
  void sum_gradients(Tensor& grad) const;
  // Copies the first stage's `param` onto the last stage's (after a step whose two updates
  // may have rounded apart: ZeRO shards the copies differently over dp).
  void broadcast_from_first(Tensor& param) const;
  bool active() const { return group_ != nullptr; }
  // True on the rank whose copy is not counted in a global norm (the last stage's).
  bool duplicate() const { return duplicate_; }

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  bool duplicate_ = false;
};

// The union of the stages' tensors (a state dict per stage, f32), on pipeline rank 0; the
// other ranks get their own `mine` back. Collective over `pp` (null: `mine`). A name held by
// several stages (the tied wte) is taken from the lowest. The messages' buffers are on the
// device of each rank's tensors (a GPU's for nccl, which moves device memory only), and so
// are the tensors rank 0 receives.
std::map<std::string, Tensor> gather_stages(const std::map<std::string, Tensor>& mine, comm::ProcessGroup* pp);

}  // namespace paratrain::parallel::pipeline
