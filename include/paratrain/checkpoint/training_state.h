// Training-state checkpoints: everything a training run needs to continue bit-identically
// after it was stopped (docs/checkpoints.md, "Training-state checkpoints").
//
// On disk, under a checkpoint directory D:
//   D/step_<N>/model.safetensors   model weights (the Module's state_dict)
//   D/step_<N>/optim.safetensors   optimizer state ("<param>.exp_avg", ... ; step count in
//                                  its metadata too)
//   D/step_<N>/optim.rank<R>-of-<W>.safetensors
//                                  instead of optim.safetensors when the optimizer state is
//                                  sharded (ZeRO): world rank R's pieces, each a 1-D range of a
//                                  parameter's state, the ranges in the file's metadata (with
//                                  tp_index/tp_size under tensor parallelism, pp_index/pp_size
//                                  under pipeline parallelism); with the model in the shards
//                                  (ZeRO 3, model_in_shards) also the same ranges of the
//                                  parameters under "model/<param>", and then no
//                                  model.safetensors is written
//   D/step_<N>/model.tp<I>-of-<T>.safetensors
//                                  instead of model.safetensors (and of optim.safetensors
//                                  without ZeRO) when the run is tensor-parallel over T
//                                  ranks: index I's local model tensors under their names
//                                  and its local optimizer tensors under "optim/<name>";
//                                  the cuts (TensorCut, tensor_cut.h) in its metadata
//   D/step_<N>/model.pp<S>-of-<P>.tp<I>-of-<T>.safetensors
//                                  the same, when the run is pipeline-parallel over P stages
//                                  (P > 1; T may be 1): stage S's tensor-parallel index I,
//                                  holding only the stage's tensors (under their usual full
//                                  names), stage index and count in its metadata too
//   D/step_<N>/manifest.json       written LAST: step, world size, the run's configuration,
//                                  optimizer step count, RNG state, loss scale, and the size
//                                  and CRC32 of each file (every shard too); with the model
//                                  in the shards "model_in_shards": true and the model's
//                                  metadata ("model_metadata"); "tp_size" and "cuts" under
//                                  tensor parallelism, "pp_size" when P > 1. A step_<N>
//                                  without a manifest is incomplete.
//   D/latest                       "step_<N>\n", written after the manifest.
// Every file is written atomically (base/atomic_file.h), so a kill at any moment leaves
// either the previous checkpoint as `latest` or the new one, never a torn file.
//
// Unsharded state: only rank 0 calls save_training_state(). Sharded state, a protocol the
// caller runs over its ranks: rank 0 prepare_checkpoint(); (every rank waits for it)
// every rank write_optimizer_shard(); (rank 0 gathers every rank's ShardFileInfo) rank 0
// save_training_state() with optimizer_shards set, which writes the model and the manifest.
// Tensor-parallel state, the same protocol: rank 0 prepare_checkpoint(); the rank with dp
// index 0 of each tensor-parallel index I write_model_part() (and, with ZeRO, every rank
// write_optimizer_shard() with its tp index, the pieces being ranges of its LOCAL tensors);
// rank 0 save_training_state() with model_parts (and optimizer_shards) set, which writes only
// the manifest.
// Pipeline-parallel state, the same protocol again: the rank with dp index 0 of each (pipeline
// stage S, tensor-parallel index I) write_model_part() with pp_index S and pp_size P, holding
// its stage's (local) tensors; with ZeRO every rank write_optimizer_shard() with its tp and pp
// indices; rank 0 save_training_state() with pp_size, model_parts (P x T of them, pp-major) and
// optimizer_shards. A tensor more than one stage holds (GPT's tied wte.weight: first and last
// stage) is in each of their parts / shards.
// Fully sharded parameters (ZeRO 3), the same protocol: every rank write_optimizer_shard()
// with OptimizerShard::params set (under tensor parallelism with its tp index, ranges of its
// LOCAL tensors); rank 0 save_training_state() with optimizer_shards set and model_in_shards
// true (no model_parts), which writes only the manifest.
// load_training_state() always returns the whole state, the shards assembled, the
// tensor-parallel parts joined (join_tensor) and the pipeline stages united (a tensor held by
// several stages taken from the lowest, the other copies checked to be bit-identical), so any
// layout can resume from it.
//
// Thread-safety: free functions, no shared state; two processes must not save into the same
// directory at once.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/tensor_cut.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::checkpoint {

// One rank's part of a sharded optimizer state (ZeRO). Piece p covers the elements
// [begin, begin + numel) of the flattened parameter `name` (whole shape `shape`); `tensors`
// holds, for each piece, its 1-D state tensors "<name>.<state>" (exp_avg, exp_avg_sq,
// momentum_buffer) of numel elements. `params`, when the rank holds only pieces of the
// parameters themselves (ZeRO 3), holds for each piece the same range of the parameter:
// params[name] a 1-D f32 tensor of numel elements (stored in the shard file as
// "model/<name>"); either empty (ZeRO 1/2: the model is saved whole) or one for every piece.
struct OptimizerShard {
  struct Piece {
    std::string name;
    int64_t begin = 0, numel = 0;
    Shape shape;
  };
  std::vector<Piece> pieces;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, Tensor> params;
};

// A written shard file: its name inside the checkpoint directory, size and CRC32.
struct ShardFileInfo {
  std::string name;
  uint64_t bytes = 0;
  std::string crc32;  // 8 lower-case hex digits
};

struct TrainingState {
  int64_t step = 0;                           // optimizer steps completed = next step index
  std::map<std::string, Tensor> model;        // model weights
  Metadata model_metadata;                    // __metadata__ of model.safetensors (with
                                              // model_parts or model_in_shards: kept in
                                              // the manifest)
  std::map<std::string, Tensor> optimizer;    // optimizer state tensors (whole; on load
                                              // assembled from the shards when sharded)
  // Save with sharded state: the shard files the ranks wrote (rank order); `optimizer` is
  // then unused. On load: the shard files the checkpoint has (empty when unsharded).
  std::vector<ShardFileInfo> optimizer_shards;
  int zero_stage = 0;                         // recorded in the manifest
  int64_t optimizer_steps = 0;                // Optimizer::steps_taken()
  std::optional<std::array<uint64_t, 4>> rng; // dropout Generator state, when the run has one
  double loss_scale = 1.0;                     // the loss scaler's scale (1 without one)
  int64_t loss_scale_growth_tracker = 0;       // its clean steps towards the next growth
  int world_size = 1;
  // Tensor parallelism: the tp size the state was saved with, and the cut of every model tensor
  // that is not replicated (an optimizer tensor "<param>.<state>" follows its parameter's cut).
  // Recorded in the manifest when tp_size > 1 or model_parts is set; on load filled in from it
  // (while `model` and `optimizer` are always returned whole).
  // Under pipeline parallelism `cuts` covers the cut tensors of every stage (a name's cut is
  // the same on every stage that holds it).
  int tp_size = 1;
  std::map<std::string, TensorCut> cuts;
  // Pipeline parallelism: the number of stages the state was saved with. Recorded in the
  // manifest when > 1 (then model_parts, when set, has one part per (stage, tp index), and each
  // optimizer shard says its stage); on load filled in from it (1 when absent).
  int pp_size = 1;
  // Save with tensor-parallel / pipeline parts: the part files written by write_model_part(),
  // pp-major: model_parts[pp_index * tp_size + tp_index], model_parts.size() == tp_size x
  // pp_size; `model` is then unused, and so is `optimizer` (the parts hold it, or
  // optimizer_shards do). On load: the part files the checkpoint has, in that order.
  std::vector<ShardFileInfo> model_parts;
  // Save with the parameters in the shards (ZeRO 3: every rank wrote OptimizerShard::params):
  // needs optimizer_shards and no model_parts; `model` is then unused, no model.safetensors is
  // written, and the manifest records "model_in_shards": true and model_metadata (and, when
  // tp_size > 1, tp_size and the cuts; the shards' pieces are then ranges of LOCAL tensors).
  // On load: true when the checkpoint's model came from its shards (`model` is whole anyway).
  bool model_in_shards = false;
  // The run's configuration (free-form JSON object the caller builds and compares; the
  // trainer records the data layout micro_batch/grad_accum/dp/seed and every setting that
  // changes the arithmetic).
  nlohmann::json config = nlohmann::json::object();
};

// Directory name of the checkpoint of step N: "step_<N>".
std::string checkpoint_name(int64_t step);

// Writes D/step_<N>/ (N = state.step) and then D/latest, creating D when missing. A leftover
// step_<N> that is not the current `latest` (e.g. half-written before a kill) is replaced; if
// step_<N> already is `latest`, it is complete and identical, and nothing is written. With
// state.optimizer_shards set, the directory was prepared by prepare_checkpoint() and holds the
// shards already: it writes the model file and the manifest listing every shard (sizes and CRCs
// as given; InputError when a listed file is missing). With state.model_parts set likewise, the
// parts hold the model (and, without shards, the optimizer state): neither model.safetensors
// nor optim.safetensors is written, the manifest lists every part and records tp_size, the cuts
// and model_metadata (and pp_size when > 1) (InputError when a part is missing or the parts are
// not model_part_file_name(i % tp_size, tp_size, i / tp_size, pp_size) for i in 0..tp_size x
// pp_size - 1). Afterwards keeps the newest `keep_last` complete checkpoints and deletes older
// step_* directories. Returns the checkpoint's path. With state.model_in_shards (and
// optimizer_shards) set, the shards hold the model too: no model.safetensors is written, the
// manifest records model_in_shards and model_metadata. InputError when model_in_shards is set
// without optimizer_shards or together with model_parts, or when pp_size < 1. IoError on write
// failures. `before_manifest`, when set, runs once every tensor file of the checkpoint is on
// disk and before the manifest is written: the point where a killed save leaves an incomplete
// step_<N> (the trainer's fault-injection hook, PARATRAIN_TEST_KILL_IN_SAVE).
std::string save_training_state(const std::string& dir, const TrainingState& state, int keep_last = 2,
                                const std::function<void()>& before_manifest = {});

// Sharded save, first step (rank 0, before any rank writes its shard): false when
// D/step_<N> already is the complete `latest` (nothing to write); else removes a leftover
// step_<N>, creates it (and D) and returns true. IoError on failure.
bool prepare_checkpoint(const std::string& dir, int64_t step);

// "optim.rank<R>-of-<W>.safetensors"
std::string optimizer_shard_file_name(int rank, int world_size);

// Sharded save, every rank after prepare_checkpoint(): writes this rank's shard atomically to
// D/step_<N>/optimizer_shard_file_name(rank, world_size) (pieces in the metadata, with rank,
// world size and the step count) and returns its name, size and CRC32. Under tensor parallelism
// (tp_size > 1; `rank`, `world_size` are then the world's) the pieces are ranges of the rank's
// LOCAL tensors (their shapes the local shapes), and tp_index / tp_size are recorded in the
// metadata too, so that the load assembles each tp index's local tensors from its ranks' pieces
// before joining them across tp. Under pipeline parallelism (pp_size > 1) the pieces are of the
// rank's stage's tensors and pp_index / pp_size are recorded too: the load assembles each
// stage's tensors from that stage's shards only (every tensor of a stage covered exactly once
// by them), then unites the stages (a tensor of several stages, the tied wte.weight, from the
// lowest; the copies must be bit-identical). Without tp / pp (size 1) the metadata has no such
// keys, as before. shard.params (ZeRO 3) are written under "model/<name>". InputError when
// tp_index is not in [0, tp_size) or pp_index not in [0, pp_size), a state tensor's name starts
// with "model/", or shard.params is neither empty nor one 1-D f32 tensor of the piece's numel
// for every piece (a name of no piece, a piece without one, a wrong size).
ShardFileInfo write_optimizer_shard(const std::string& dir, int64_t step, int rank, int world_size,
                                    const OptimizerShard& shard, int64_t optimizer_steps, int tp_index = 0,
                                    int tp_size = 1, int pp_index = 0, int pp_size = 1);

// "model.tp<I>-of-<T>.safetensors" when pp_size == 1 (the name of checkpoints before pipeline
// parallelism), else "model.pp<S>-of-<P>.tp<I>-of-<T>.safetensors" (S = pp_index, P = pp_size;
// also with T = 1: "model.pp1-of-2.tp0-of-1.safetensors").
std::string model_part_file_name(int tp_index, int tp_size, int pp_index = 0, int pp_size = 1);

// Tensor-parallel / pipeline save, after prepare_checkpoint(), by one rank of each (stage,
// tensor-parallel index) (the one with dp index 0): writes atomically
// D/step_<N>/model_part_file_name(tp_index, tp_size, pp_index, pp_size), one safetensors file
// holding `local_model` under its names and `local_optimizer` (empty with ZeRO, whose shards
// hold it) under "optim/<name>", with metadata "format" ("paratrain-model-part"), "tp_index",
// "tp_size", "cuts" (a JSON object name -> TensorCut text, the non-replicated tensors) and
// "optimizer_steps", and "pp_index", "pp_size" when pp_size > 1. Replicated tensors may be left
// out of every part of a stage but the first that holds them (the load takes a replicated
// tensor from the lowest tp index holding it). With pp_size > 1, `local_model` holds the
// stage's tensors only and `cuts` may be the whole model's: the cuts of tensors the stage does
// not hold are left out of the part's metadata (pp_size == 1: every cut must name a tensor of
// local_model). Returns the file's name, size and CRC32 for rank 0's manifest. InputError when
// tp_index is not in [0, tp_size) or pp_index not in [0, pp_size), a model name starts with
// "optim/", or a cut names no tensor of local_model (pp_size == 1) or a dimension it does not
// have.
ShardFileInfo write_model_part(const std::string& dir, int64_t step, int tp_index, int tp_size,
                               const std::map<std::string, Tensor>& local_model,
                               const std::map<std::string, Tensor>& local_optimizer,
                               const std::map<std::string, TensorCut>& cuts, int64_t optimizer_steps,
                               int pp_index = 0, int pp_size = 1);

// Where a resume starts: the checkpoint to load (nullopt: start from step 0) and the
// incomplete checkpoints passed over (step_* directories without a manifest, a save that was
// killed), which the caller must report.
struct ResumePoint {
  std::optional<std::string> checkpoint;  // path of D/step_<N>
  std::vector<std::string> ignored;       // paths of incomplete D/step_*, newest first
};

// The checkpoint a resume should load. It is the one D/latest names, unless a newer step_*
// has a manifest (a kill between the manifest and the `latest` update); without D/latest, the
// newest step_* that has a manifest; none (start fresh) when D is missing, empty, or holds
// only incomplete step_* directories. Every step_* without a manifest other than the one
// picked is listed in `ignored`. The answer depends only on the files, so every rank that
// reads the same D decides the same. InputError when D/latest is unreadable or names a
// missing directory. `latest` is written only after a manifest, so a D/latest naming a
// step_* without one is returned as is and fails to load as incomplete (a removed manifest
// is damage, not an interrupted save). Nothing here reads tensors or checksums:
// load_training_state() verifies the one picked.
ResumePoint find_resume_point(const std::string& dir);

// find_resume_point(dir).checkpoint, for callers that only look (it does not say what was
// ignored; a run that resumes uses find_resume_point and reports the ignored ones).
std::optional<std::string> find_latest_checkpoint(const std::string& dir);

// Checks a checkpoint directory without loading tensors: manifest present and well-formed,
// every listed file present with the recorded size and CRC32. InputError naming the
// checkpoint and the file otherwise ("incomplete" when the manifest is missing, "damaged"
// on a size or checksum mismatch).
void verify_training_state(const std::string& ckpt_dir);

// verify_training_state(), then reads everything into a TrainingState (nothing is applied to
// any model or optimizer here, so a bad checkpoint is never half-loaded). Sharded optimizer
// state is assembled into whole tensors; InputError ("damaged", naming the file or tensor) when
// a shard's metadata is malformed or the pieces do not cover every element exactly once. A
// tensor-parallel checkpoint is returned whole too: the parts' tensors joined (join_tensor, the
// padding dropped), with ZeRO each tp index's local tensors first assembled from its pieces;
// tp_size, cuts and model_parts are filled in. InputError ("damaged", naming the file or
// tensor) when a part's metadata disagrees with the manifest (format, tp index, tp size, cuts),
// a cut tensor is missing from a part, or the parts cannot be joined. A pipeline-parallel
// checkpoint (pp_size > 1, filled in) is returned whole as the union of its stages: each
// stage's tensors joined across its tp parts (or assembled from its shards' pieces and joined),
// then a name held by several stages (the tied wte.weight, and its optimizer state) taken from
// the lowest stage; InputError ("damaged", naming the tensor and the two stages) when another
// stage's copy differs from it in shape, dtype or any bit, and when a part's or shard's
// pp_index / pp_size disagree with the manifest or no shard is of some stage. A checkpoint with
// "model_in_shards" has its model assembled from the shards' "model/<name>" pieces exactly as
// the optimizer state is (whole local shape, every element exactly once, then joined across tp
// along the cuts; a replicated tensor from the lowest tp index holding it), model_metadata
// taken from the manifest and model_in_shards set; InputError ("damaged") when a shard lacks
// the model tensor of one of its pieces, or holds "model/" tensors the manifest does not
// expect. (As for the optimizer state, a parameter of which no shard lists any piece is just
// absent from `model`: the caller's load into its module names it.)
TrainingState load_training_state(const std::string& ckpt_dir);

// CRC32 (zlib) of a file's bytes, as 8 lower-case hex digits; IoError if unreadable.
std::string file_crc32(const std::string& path);

}  // namespace paratrain::checkpoint
