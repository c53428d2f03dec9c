// Pipeline-parallel training-state checkpoints (checkpoint/training_state.h): every pipeline
// stage holds a disjoint set of blocks under their usual full names, and the first and last
// stage both hold the tied wte.weight (and its optimizer state). Each (stage, tp index) writes
// its part, with ZeRO 1 every rank its shard of its stage's tensors, "rank 0" the manifest;
// the load returns the WHOLE state, bit-identical, the tied tensor taken once (from the lowest
// stage) and its other copy checked. pp = 2, pp = 2 x tp = 2 with cuts, ZeRO 1 over dp = 2 per
// stage; old (pp-less) checkpoints load as before; a missing stage part, a disagreeing
// stage's metadata and a mismatching tied copy are named. Every "rank" runs in turn here.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/tensor_cut.h"
#include "paratrain/checkpoint/training_state.h"
#include "checkpoint/state_test_util.h"

namespace fs = std::filesystem;
using namespace paratrain;
using namespace paratrain::checkpoint;

namespace {

using paratrain::test::iota;
using paratrain::test::same_bytes;
using paratrain::test::expect_same;
using paratrain::test::error_of;
using paratrain::test::read_json;

using Tensors = std::map<std::string, Tensor>;
constexpr int kPp = 2;






std::set<std::string> names_in(const std::string& path) {
  std::set<std::string> out;
  for (const auto& e : read_safetensors_header(path).entries) out.insert(e.name);
  return out;
}

// A two-block GPT-2-like model, whole: the padded vocabulary (wte, cut by rows, tied to the
// head), wpe (replicated), per block the packed q|k|v, a row-parallel projection and a
// replicated layer norm, then ln_f; AdamW state for each. Stage 0 holds wte, wpe and h.0.*;
// stage 1 h.1.*, ln_f.* and wte again (the tied LM head).
struct Whole {
  Tensors model, optimizer;
  std::map<std::string, TensorCut> cuts;
};

Whole make_whole() {
  Whole w;
  const int64_t C = 4, V = 7, T = 3;
  w.model["wte.weight"] = iota({V, C}, 1);
  w.model["wpe.weight"] = iota({T, C}, 50);
  w.cuts["wte.weight"] = {0, 1, V};
  for (int b = 0; b < 2; ++b) {
    const std::string h = "h." + std::to_string(b) + ".";
    const float at = 100.0f + 1000.0f * static_cast<float>(b);
    w.model[h + "attn.c_attn.weight"] = iota({C, 3 * C}, at);
    w.model[h + "attn.c_attn.bias"] = iota({3 * C}, at + 100);
    w.model[h + "attn.c_proj.weight"] = iota({C, C}, at + 200);
    w.model[h + "ln_1.weight"] = iota({C}, at + 300);
    w.cuts[h + "attn.c_attn.weight"] = {1, 3};
    w.cuts[h + "attn.c_attn.bias"] = {0, 3};
    w.cuts[h + "attn.c_proj.weight"] = {0};
  }
  w.model["ln_f.weight"] = iota({C}, 3000);
  w.model["ln_f.bias"] = iota({C}, 3100);
  float start = 5000;
  for (const auto& [name, t] : w.model)
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      w.optimizer[name + "." + state] = iota(t.shape(), start);
      start += 100;
    }
  return w;
}

bool on_stage(const std::string& name, int stage) {
  if (name == "wte.weight") return true;  // first and last stage (kPp == 2: both)
  if (name == "wpe.weight" || name.rfind("h.0.", 0) == 0) return stage == 0;
  return stage == 1;  // h.1.*, ln_f.*
}

const TensorCut& cut_of(const Whole& w, const std::string& param) {
  static const TensorCut replicated;
  auto it = w.cuts.find(param);
  return it == w.cuts.end() ? replicated : it->second;
}

// What (stage, tp index i of tp) holds: its stage's model tensors cut for index i, and their
// optimizer state.
Tensors stage_model(const Whole& w, int stage, int i, int tp) {
  Tensors out;
  for (const auto& [name, t] : w.model)
    if (on_stage(name, stage)) out[name] = cut_tensor(t, cut_of(w, name), i, tp);
  return out;
}
Tensors stage_optimizer(const Whole& w, int stage, int i, int tp) {
  Tensors out;
  for (const auto& [key, t] : w.optimizer) {
    const std::string param = key.substr(0, key.rfind('.'));
    if (on_stage(param, stage)) out[key] = cut_tensor(t, cut_of(w, param), i, tp);
  }
  return out;
}

// The ZeRO pieces of dp index d of dp of every tensor in `local`: elements [d*n/dp, (d+1)*n/dp)
// of the flattened tensor (`skew` shifts the split, so two stages cut the same tensor apart
// differently), with their state from `local_opt`.
OptimizerShard zero_pieces(const Tensors& local, const Tensors& local_opt, int d, int dp, int64_t skew = 0) {
  OptimizerShard shard;
  for (const auto& [name, t] : local) {
    const int64_t n = t.numel();
    const auto at = [&](int k) { return k == 0 ? 0 : k == dp ? n : std::clamp(k * n / dp + skew, int64_t{0}, n); };
    const int64_t b = at(d), e = at(d + 1);
    shard.pieces.push_back({name, b, e - b, t.shape()});
    for (const char* state : {".exp_avg", ".exp_avg_sq"})
      shard.tensors[name + state] = local_opt.at(name + state).reshape({-1}).narrow(0, b, e - b).clone();
  }
  return shard;
}

class PipelineStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_pps_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rank 0's part of the state: everything but the tensors.
  static TrainingState rank0_state(const Whole& w, int64_t step, int tp, int world) {
    TrainingState s;
    s.step = step;
    s.optimizer_steps = step;
    s.world_size = world;
    s.tp_size = tp;
    s.pp_size = kPp;
    s.cuts = w.cuts;
    s.model_metadata = {{"format", "pt"}, {"model", "gpt"}};
    s.config = {{"layout", {{"tp", tp}, {"pp", kPp}}}};
    return s;
  }

  // pp = 2 x tp without ZeRO: each (stage, tp index) writes its model and optimizer part (the
  // whole model's cuts passed: the writer keeps its stage's), rank 0 the manifest. `edit`
  // changes what a (stage, tp index) writes, as a bad save would.
  std::string save_pp(const Whole& w, int64_t step, int tp,
                      const std::function<void(int, int, Tensors&, Tensors&)>& edit = {}) {
    EXPECT_TRUE(prepare_checkpoint(dir_, step));
    TrainingState s = rank0_state(w, step, tp, tp * kPp);
    for (int p = 0; p < kPp; ++p)
      for (int i = 0; i < tp; ++i) {
        Tensors m = stage_model(w, p, i, tp), o = stage_optimizer(w, p, i, tp);
        if (edit) edit(p, i, m, o);
        s.model_parts.push_back(write_model_part(dir_, step, i, tp, m, o, w.cuts, step, p, kPp));
      }
    return save_training_state(dir_, s);
  }

  // pp = 2 x dp = 2 x tp with ZeRO 1: world rank r has tp index r % tp, dp index (r / tp) % 2
  // and stage r / (2 tp) (DESIGN.md's mesh); the dp-0 rank of each (stage, tp index) writes the
  // model part, every rank its ZeRO pieces of its stage's LOCAL tensors. Stage 1 cuts its
  // tensors apart at other points than stage 0 (`skew`), as its own dp group would. `edit`
  // changes the shard a rank writes.
  std::string save_zero_pp(const Whole& w, int64_t step, int tp,
                           const std::function<void(int, OptimizerShard&)>& edit = {},
                           const std::function<int(int)>& pp_size_of = {}) {
    const int dp = 2, world = dp * tp * kPp;
    EXPECT_TRUE(prepare_checkpoint(dir_, step));
    TrainingState s = rank0_state(w, step, tp, world);
    s.zero_stage = 1;
    for (int r = 0; r < world; ++r) {
      const int tp_idx = r % tp, dp_idx = (r / tp) % dp, pp_idx = r / (tp * dp);
      const Tensors local = stage_model(w, pp_idx, tp_idx, tp);
      if (dp_idx == 0)
        s.model_parts.push_back(write_model_part(dir_, step, tp_idx, tp, local, {}, w.cuts, step, pp_idx, kPp));
      OptimizerShard shard = zero_pieces(local, stage_optimizer(w, pp_idx, tp_idx, tp), dp_idx, dp, pp_idx);
      if (edit) edit(r, shard);
      const int pp_size = pp_size_of ? pp_size_of(r) : kPp;
      s.optimizer_shards.push_back(write_optimizer_shard(dir_, step, r, world, shard, step, tp_idx, tp,
                                                         pp_size == 1 ? 0 : pp_idx, pp_size));
    }
    return save_training_state(dir_, s);
  }

  std::string dir_;
};

TEST_F(PipelineStateTest, TwoStagesLoadAsTheWholeModelBitExact) {
  const Whole w = make_whole();
  const std::string p = save_pp(w, 6, 1);
  EXPECT_EQ(model_part_file_name(0, 1, 1, 2), "model.pp1-of-2.tp0-of-1.safetensors");
  for (const char* f : {"model.pp0-of-2.tp0-of-1.safetensors", "model.pp1-of-2.tp0-of-1.safetensors"})
    EXPECT_TRUE(fs::exists(p + "/" + f)) << f;
  EXPECT_FALSE(fs::exists(p + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(p + "/optim.safetensors"));

  const nlohmann::json m = read_json(p + "/manifest.json");
  EXPECT_EQ(m.at("pp_size"), kPp);
  EXPECT_EQ(m.at("tp_size"), 1);
  EXPECT_EQ(m.at("model_parts"),
            (nlohmann::json{"model.pp0-of-2.tp0-of-1.safetensors", "model.pp1-of-2.tp0-of-1.safetensors"}));
  // Each stage's part holds its own blocks and the tied wte; its metadata says which stage.
  const std::string last = p + "/model.pp1-of-2.tp0-of-1.safetensors";
  const SafetensorsHeader h = read_safetensors_header(last);
  EXPECT_EQ(h.metadata.at("pp_index"), "1");
  EXPECT_EQ(h.metadata.at("pp_size"), "2");
  EXPECT_EQ(h.metadata.at("tp_index"), "0");
  const std::set<std::string> in_last = names_in(last), in_first = names_in(p + "/model.pp0-of-2.tp0-of-1.safetensors");
  for (const char* n : {"wte.weight", "optim/wte.weight.exp_avg", "h.1.ln_1.weight", "ln_f.bias"})
    EXPECT_TRUE(in_last.count(n)) << n;
  for (const char* n : {"wpe.weight", "h.0.ln_1.weight"}) EXPECT_FALSE(in_last.count(n)) << n;
  for (const char* n : {"wte.weight", "wpe.weight", "h.0.attn.c_proj.weight"}) EXPECT_TRUE(in_first.count(n)) << n;
  EXPECT_FALSE(in_first.count("ln_f.weight"));

  verify_training_state(p);
  const TrainingState s = load_training_state(*find_latest_checkpoint(dir_));
  EXPECT_EQ(s.step, 6);
  EXPECT_EQ(s.pp_size, kPp);
  EXPECT_EQ(s.tp_size, 1);
  EXPECT_EQ(s.model_parts.size(), 2u);
  EXPECT_EQ(s.model_metadata, (Metadata{{"format", "pt"}, {"model", "gpt"}}));
  expect_same(s.model, w.model);  // the union of the stages, wte once
  expect_same(s.optimizer, w.optimizer);
}

TEST_F(PipelineStateTest, TwoStagesTimesTwoTensorParallelPartsJoinAlongTheCuts) {
  const Whole w = make_whole();
  const std::string p = save_pp(w, 4, 2);
  const nlohmann::json m = read_json(p + "/manifest.json");
  // pp-major: stage 0's tp parts, then stage 1's.
  EXPECT_EQ(m.at("model_parts"),
            (nlohmann::json{"model.pp0-of-2.tp0-of-2.safetensors", "model.pp0-of-2.tp1-of-2.safetensors",
                            "model.pp1-of-2.tp0-of-2.safetensors", "model.pp1-of-2.tp1-of-2.safetensors"}));
  EXPECT_EQ(m.at("pp_size"), kPp);
  EXPECT_EQ(m.at("tp_size"), 2);
  EXPECT_EQ(m.at("cuts").size(), w.cuts.size());  // the cuts of every stage
  // A stage's part records the cuts of its own tensors: stage 1 has wte's and h.1's, not h.0's.
  const nlohmann::json part_cuts =
      nlohmann::json::parse(read_safetensors_header(p + "/model.pp1-of-2.tp1-of-2.safetensors").metadata.at("cuts"));
  EXPECT_EQ(part_cuts.at("wte.weight"), "0/7");
  EXPECT_EQ(part_cuts.at("h.1.attn.c_attn.weight"), "1x3");
  EXPECT_FALSE(part_cuts.contains("h.0.attn.c_attn.weight"));

  const TrainingState s = load_training_state(p);
  EXPECT_EQ(s.pp_size, kPp);
  EXPECT_EQ(s.tp_size, 2);
  EXPECT_EQ(s.cuts, w.cuts);
  ASSERT_EQ(s.model_parts.size(), 4u);
  EXPECT_EQ(s.model_parts[2].name, model_part_file_name(0, 2, 1, 2));
  expect_same(s.model, w.model);  // wte [7, 4] again: the padding row dropped on each stage
  expect_same(s.optimizer, w.optimizer);
}

TEST_F(PipelineStateTest, ZeroOneShardsOverDpTwoPerStageAssembleWhole) {
  const Whole w = make_whole();
  for (int tp : {1, 2}) {
    fs::remove_all(dir_);
    const int world = 2 * tp * kPp;
    const std::string p = save_zero_pp(w, 5, tp);
    for (int r = 0; r < world; ++r) {
      const SafetensorsHeader h = read_safetensors_header(p + "/" + optimizer_shard_file_name(r, world));
      EXPECT_EQ(h.metadata.at("pp_index"), std::to_string(r / (2 * tp))) << r;
      EXPECT_EQ(h.metadata.at("pp_size"), "2") << r;
      EXPECT_EQ(h.metadata.count("tp_index"), tp > 1 ? 1u : 0u) << r;
    }
    // The last stage's ranks hold pieces of the tied wte too (they update their own copy).
    bool last_has_wte = false;
    for (const auto& n : names_in(p + "/" + optimizer_shard_file_name(world - 1, world)))
      last_has_wte |= n == "wte.weight.exp_avg";
    EXPECT_TRUE(last_has_wte);
    EXPECT_FALSE(fs::exists(p + "/optim.safetensors"));
    const TrainingState s = load_training_state(p);
    EXPECT_EQ(s.pp_size, kPp);
    EXPECT_EQ(s.zero_stage, 1);
    EXPECT_EQ(s.optimizer_shards.size(), static_cast<size_t>(world));
    EXPECT_EQ(s.model_parts.size(), static_cast<size_t>(tp * kPp));
    expect_same(s.model, w.model);
    expect_same(s.optimizer, w.optimizer);
  }
}

TEST_F(PipelineStateTest, TheTiedTensorIsTakenOnceFromTheLowestStage) {
  const Whole w = make_whole();
  // Both stages' shards cover wte.weight's state exactly once each, cut at other points: pooled
  // together they would overlap; grouped by stage, stage 0's alone give the tensor.
  std::string p = save_zero_pp(w, 3, 1);
  TrainingState s = load_training_state(p);
  ASSERT_EQ(s.optimizer.count("wte.weight.exp_avg"), 1u);
  EXPECT_TRUE(same_bytes(s.optimizer.at("wte.weight.exp_avg"), w.optimizer.at("wte.weight.exp_avg")));
  EXPECT_TRUE(same_bytes(s.model.at("wte.weight"), w.model.at("wte.weight")));
  EXPECT_EQ(s.model.size(), w.model.size());

  // The last stage's shards may also leave the tied tensor's state to the first stage.
  fs::remove_all(dir_);
  p = save_zero_pp(w, 3, 1, [](int r, OptimizerShard& sh) {
    if (r < 2) return;  // stage 0's ranks
    std::erase_if(sh.pieces, [](const OptimizerShard::Piece& pc) { return pc.name == "wte.weight"; });
    sh.tensors.erase("wte.weight.exp_avg");
    sh.tensors.erase("wte.weight.exp_avg_sq");
  });
  s = load_training_state(p);
  expect_same(s.optimizer, w.optimizer);

  // Within one stage the pieces must still cover every element exactly once: stage 1's rank 3
  // holding nothing leaves out the second half of its tensors, wte's among them.
  fs::remove_all(dir_);
  p = save_zero_pp(w, 3, 1, [](int r, OptimizerShard& sh) {
    if (r == 3) sh = OptimizerShard();
  });
  const std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: the optimizer shards leave out elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on pipeline stage 1"), std::string::npos) << msg;
}

TEST_F(PipelineStateTest, AMismatchingTiedCopyIsDamaged) {
  const Whole w = make_whole();
  // The last stage's copy of wte.weight differs in one element.
  std::string p = save_pp(w, 2, 2, [](int stage, int i, Tensors& m, Tensors&) {
    if (stage == 1 && i == 1) {
      Tensor t = m.at("wte.weight").clone();
      t.data<float>()[5] += 1.0f;
      m["wte.weight"] = t;
    }
  });
  verify_training_state(p);  // the files are as the manifest lists them: their content disagrees
  std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: wte.weight differs between pipeline stages 0 and 1"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was loaded"), std::string::npos) << msg;

  // Its optimizer state in the parts.
  fs::remove_all(dir_);
  p = save_pp(w, 2, 1, [](int stage, int, Tensors&, Tensors& o) {
    if (stage == 1) o["wte.weight.exp_avg_sq"] = iota(o.at("wte.weight.exp_avg_sq").shape(), -7);
  });
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: the optimizer tensor wte.weight.exp_avg_sq differs between pipeline stages 0 and 1"),
            std::string::npos)
      << msg;

  // Its shape (the last stage saved another embedding width).
  fs::remove_all(dir_);
  p = save_pp(w, 2, 1, [](int stage, int, Tensors& m, Tensors&) {
    if (stage == 1) m["wte.weight"] = iota({7, 5}, 1);
  });
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("wte.weight differs between pipeline stages 0 and 1 ([7, 4] against [7, 5]"), std::string::npos)
      << msg;

  // Its optimizer state in the ZeRO shards (one piece of stage 1's rank 2): the two stages
  // shard the tied tensor differently, so their data-parallel sums may round apart in the last
  // bits; the lowest stage's state is taken and the other copy not compared.
  fs::remove_all(dir_);
  p = save_zero_pp(w, 2, 1, [](int r, OptimizerShard& sh) {
    if (r == 2) sh.tensors["wte.weight.exp_avg"] = iota(sh.tensors.at("wte.weight.exp_avg").shape(), 77);
  });
  const TrainingState st = load_training_state(p);
  const Tensor a = st.optimizer.at("wte.weight.exp_avg").contiguous(), b = w.optimizer.at("wte.weight.exp_avg").contiguous();
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << "stage 0's copy";
}

TEST_F(PipelineStateTest, OldPpLessCheckpointsStillLoad) {
  // A tensor-parallel checkpoint written through the API as it was before pipeline parallelism
  // (no pp arguments, pp_size left at 1): the old names, no pp keys anywhere.
  const Whole w = make_whole();
  ASSERT_TRUE(prepare_checkpoint(dir_, 3));
  TrainingState s;
  s.step = 3;
  s.optimizer_steps = 3;
  s.world_size = 4;
  s.tp_size = 2;
  s.zero_stage = 1;
  s.cuts = w.cuts;
  for (int r = 0; r < 4; ++r) {
    const int i = r % 2, d = r / 2;
    Tensors local, local_opt;
    for (const auto& [name, t] : w.model) local[name] = cut_tensor(t, cut_of(w, name), i, 2);
    for (const auto& [key, t] : w.optimizer)
      local_opt[key] = cut_tensor(t, cut_of(w, key.substr(0, key.rfind('.'))), i, 2);
    if (d == 0) s.model_parts.push_back(write_model_part(dir_, 3, i, 2, local, {}, w.cuts, 3));
    s.optimizer_shards.push_back(write_optimizer_shard(dir_, 3, r, 4, zero_pieces(local, local_opt, d, 2), 3, i, 2));
  }
  const std::string p = save_training_state(dir_, s);
  EXPECT_EQ(model_part_file_name(1, 2), "model.tp1-of-2.safetensors");
  EXPECT_EQ(model_part_file_name(1, 2, 0, 1), "model.tp1-of-2.safetensors");
  const nlohmann::json m = read_json(p + "/manifest.json");
  EXPECT_FALSE(m.contains("pp_size"));
  EXPECT_EQ(m.at("model_parts"), (nlohmann::json{"model.tp0-of-2.safetensors", "model.tp1-of-2.safetensors"}));
  EXPECT_EQ(read_safetensors_header(p + "/model.tp1-of-2.safetensors").metadata.count("pp_size"), 0u);
  EXPECT_EQ(read_safetensors_header(p + "/" + optimizer_shard_file_name(3, 4)).metadata.count("pp_index"), 0u);
  const TrainingState back = load_training_state(p);
  EXPECT_EQ(back.pp_size, 1);
  EXPECT_EQ(back.tp_size, 2);
  expect_same(back.model, w.model);
  expect_same(back.optimizer, w.optimizer);

  // And a plain one-process checkpoint.
  TrainingState plain;
  plain.step = 4;
  plain.model = w.model;
  plain.optimizer = w.optimizer;
  const std::string q = save_training_state(dir_, plain);
  EXPECT_FALSE(read_json(q + "/manifest.json").contains("pp_size"));
  const TrainingState back2 = load_training_state(q);
  EXPECT_EQ(back2.pp_size, 1);
  expect_same(back2.model, w.model);
}

TEST_F(PipelineStateTest, AMissingStagePartIsNamed) {
  const Whole w = make_whole();
  const std::string p = save_pp(w, 2, 2);
  const std::string gone = "model.pp1-of-2.tp0-of-2.safetensors";
  fs::remove(p + "/" + gone);
  std::string msg = error_of([&] { verify_training_state(p); });
  EXPECT_NE(msg.find("checkpoint " + p + " is incomplete: " + gone + " is missing"), std::string::npos) << msg;
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find(gone + " is missing"), std::string::npos) << msg;

  // Saving a manifest for a stage part that was never written is refused.
  ASSERT_TRUE(prepare_checkpoint(dir_, 4));
  TrainingState s = rank0_state(w, 4, 2, 4);
  for (int st = 0; st < kPp; ++st)
    for (int i = 0; i < 2; ++i)
      if (st == 0)
        s.model_parts.push_back(write_model_part(dir_, 4, i, 2, stage_model(w, st, i, 2), stage_optimizer(w, st, i, 2),
                                                 w.cuts, 4, st, kPp));
      else
        s.model_parts.push_back({model_part_file_name(i, 2, st, kPp), 0, "00000000"});
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("the model part " + (fs::path(dir_) / "step_4" / "model.pp1-of-2.tp0-of-2.safetensors").string() +
                     " is missing"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(dir_ + "/step_4/manifest.json"));
  // Parts not matching pp_size x tp_size, or not in pp-major order.
  s.model_parts.resize(2);
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("2 model parts for a tp_size of 2 x a pp_size of 2 = 4"), std::string::npos) << msg;
  s.model_parts = {s.model_parts[0], {model_part_file_name(0, 2, 1, 2), 0, ""}, s.model_parts[1],
                   {model_part_file_name(1, 2, 1, 2), 0, ""}};
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("model part 1 of 4 is model.pp1-of-2.tp0-of-2.safetensors, expected "
                     "model.pp0-of-2.tp1-of-2.safetensors"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(fs::exists(dir_ + "/step_4/manifest.json"));

  // A manifest whose pp_size disagrees with the parts it lists.
  fs::remove_all(dir_);
  const std::string q = save_pp(w, 2, 2);
  nlohmann::json m = read_json(q + "/manifest.json");
  m["pp_size"] = 3;
  std::ofstream(q + "/manifest.json") << m.dump(2);
  msg = error_of([&] { load_training_state(q); });
  EXPECT_NE(msg.find("lists 4 model parts for a tp_size of 2 x a pp_size of 3 = 6"), std::string::npos) << msg;
  m["pp_size"] = 0;
  std::ofstream(q + "/manifest.json") << m.dump(2);
  msg = error_of([&] { load_training_state(q); });
  EXPECT_NE(msg.find("has a malformed \"pp_size\""), std::string::npos) << msg;
}

TEST_F(PipelineStateTest, AStageWhoseMetadataDisagreesWithTheManifestIsNamed) {
  const Whole w = make_whole();
  // Stage 1's part is a copy of stage 0's (consistent size and CRC in the manifest).
  ASSERT_TRUE(prepare_checkpoint(dir_, 2));
  TrainingState s = rank0_state(w, 2, 1, 2);
  s.model_parts.push_back(
      write_model_part(dir_, 2, 0, 1, stage_model(w, 0, 0, 1), stage_optimizer(w, 0, 0, 1), w.cuts, 2, 0, kPp));
  const std::string step = dir_ + "/step_2/";
  const std::string second = model_part_file_name(0, 1, 1, kPp);
  fs::copy_file(step + s.model_parts[0].name, step + second);
  s.model_parts.push_back({second, fs::file_size(step + second), file_crc32(step + second)});
  std::string p = save_training_state(dir_, s);
  std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: " + second + " does not say it is pipeline stage 1 of 2 (its pp_index 0"),
            std::string::npos)
      << msg;

  // A stage's part records other cuts than the manifest gives its tensors.
  fs::remove_all(dir_);
  ASSERT_TRUE(prepare_checkpoint(dir_, 2));
  s.model_parts.clear();
  auto other = w.cuts;
  other.erase("h.1.attn.c_proj.weight");
  for (int st = 0; st < kPp; ++st)
    s.model_parts.push_back(write_model_part(dir_, 2, 0, 1, stage_model(w, st, 0, 1), stage_optimizer(w, st, 0, 1),
                                             st == 1 ? other : w.cuts, 2, st, kPp));
  p = save_training_state(dir_, s);
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: model.pp1-of-2.tp0-of-1.safetensors records the cuts"), std::string::npos) << msg;

  // A shard written without its stage under a pipeline manifest.
  fs::remove_all(dir_);
  p = save_zero_pp(w, 2, 1, {}, [](int r) { return r == 3 ? 1 : kPp; });
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: optim.rank3-of-4.safetensors does not say it belongs to a pipeline of 2 stages "
                     "(its pp_size: none)"),
            std::string::npos)
      << msg;

  // No shard of stage 1 (its ranks' files claim stage 0).
  fs::remove_all(dir_);
  ASSERT_TRUE(prepare_checkpoint(dir_, 2));
  TrainingState z = rank0_state(w, 2, 1, 2);
  z.zero_stage = 1;
  z.model = w.model;
  for (int r = 0; r < 2; ++r)
    z.optimizer_shards.push_back(write_optimizer_shard(
        dir_, 2, r, 2, zero_pieces(stage_model(w, 0, 0, 1), stage_optimizer(w, 0, 0, 1), r, 2), 2, 0, 1, 0, kPp));
  p = save_training_state(dir_, z);
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: no optimizer shard is of pipeline stage 1 of 2"), std::string::npos) << msg;
}

TEST_F(PipelineStateTest, WritersRejectAStageThatDoesNotExist) {
  const Whole w = make_whole();
  ASSERT_TRUE(prepare_checkpoint(dir_, 1));
  std::string msg =
      error_of([&] { write_model_part(dir_, 1, 0, 1, stage_model(w, 0, 0, 1), {}, w.cuts, 1, 2, kPp); });
  EXPECT_NE(msg.find("write_model_part: pipeline stage 2 of 2 does not exist"), std::string::npos) << msg;
  msg = error_of([&] { write_optimizer_shard(dir_, 1, 0, 2, OptimizerShard(), 1, 0, 1, -1, kPp); });
  EXPECT_NE(msg.find("write_optimizer_shard: pipeline stage -1 of 2 does not exist"), std::string::npos) << msg;
  // Without stages a cut of a tensor the part does not hold is still refused.
  msg = error_of([&] { write_model_part(dir_, 1, 0, 1, stage_model(w, 1, 0, 1), {}, w.cuts, 1); });
  EXPECT_NE(msg.find("names no local model tensor"), std::string::npos) << msg;
  for (const auto& e : fs::directory_iterator(dir_ + "/step_1")) ADD_FAILURE() << "wrote " << e.path();
  TrainingState s;
  s.step = 1;
  s.pp_size = 0;
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("pp_size 0"), std::string::npos) << msg;
}

}  // namespace
