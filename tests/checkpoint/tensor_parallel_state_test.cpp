// Tensor-parallel training-state checkpoints (checkpoint/training_state.h, tensor_cut.h): the
// ranks of a tp group each write their part of the model (and optimizer state), "rank 0"
// writes the manifest, and the load returns the WHOLE state, bit-identical to the tensors that
// were cut -- with the optimizer state in the parts, or in ZeRO shards over dp = 2 x tp = 2.
// A damaged, missing or disagreeing part, and shards that leave out part of a local tensor,
// are named. Every "rank" runs in turn in this process.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
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

constexpr int kTp = 2;





void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x01));
}


// A GPT-2-like block, whole: padded vocabulary, packed q|k|v, a row-parallel projection and a
// replicated layer norm; AdamW state for each.
struct Whole {
  std::map<std::string, Tensor> model, optimizer;
  std::map<std::string, TensorCut> cuts;
};

Whole make_whole() {
  Whole w;
  const int64_t C = 4, V = 7;
  w.model["wte.weight"] = iota({V, C}, 1);
  w.model["h.0.attn.c_attn.weight"] = iota({C, 3 * C}, 100);
  w.model["h.0.attn.c_attn.bias"] = iota({3 * C}, 200);
  w.model["h.0.attn.c_proj.weight"] = iota({C, C}, 300);
  w.model["h.0.ln_1.weight"] = iota({C}, 400);
  w.cuts["wte.weight"] = {0, 1, V};
  w.cuts["h.0.attn.c_attn.weight"] = {1, 3};
  w.cuts["h.0.attn.c_attn.bias"] = {0, 3};
  w.cuts["h.0.attn.c_proj.weight"] = {0};
  float start = 1000;
  for (const auto& [name, t] : w.model)
    for (const char* state : {"exp_avg", "exp_avg_sq"}) {
      w.optimizer[name + "." + state] = iota(t.shape(), start);
      start += 100;
    }
  return w;
}

const TensorCut& cut_of(const Whole& w, const std::string& param) {
  static const TensorCut replicated;
  auto it = w.cuts.find(param);
  return it == w.cuts.end() ? replicated : it->second;
}

// What tp index i holds: its model part, and its optimizer state (following the parameters).
std::map<std::string, Tensor> local_model(const Whole& w, int i) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : w.model) out[name] = cut_tensor(t, cut_of(w, name), i, kTp);
  return out;
}
std::map<std::string, Tensor> local_optimizer(const Whole& w, int i) {
  std::map<std::string, Tensor> out;
  for (const auto& [key, t] : w.optimizer) out[key] = cut_tensor(t, cut_of(w, key.substr(0, key.rfind('.'))), i, kTp);
  return out;
}

class TensorParallelStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_tps_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Rank 0's part of the state: everything but the tensors.
  static TrainingState rank0_state(const Whole& w, int64_t step) {
    TrainingState s;
    s.step = step;
    s.optimizer_steps = step;
    s.world_size = kTp;
    s.tp_size = kTp;
    s.cuts = w.cuts;
    s.model_metadata = {{"format", "pt"}, {"model", "gpt"}};
    s.config = {{"layout", {{"tp", kTp}}}};
    return s;
  }

  // tp = 2 without ZeRO: each tp index writes model and optimizer; rank 0 the manifest.
  std::string save_tp(const Whole& w, int64_t step) {
    EXPECT_TRUE(prepare_checkpoint(dir_, step));
    TrainingState s = rank0_state(w, step);
    for (int i = 0; i < kTp; ++i)
      s.model_parts.push_back(
          write_model_part(dir_, step, i, kTp, local_model(w, i), local_optimizer(w, i), w.cuts, step));
    return save_training_state(dir_, s);
  }

  // dp = 2 x tp = 2 with ZeRO: world rank r has tp index r % 2 and dp index r / 2 (DESIGN.md's
  // mesh); the dp-0 rank of each tp index writes the model part, every rank its ZeRO pieces of
  // its LOCAL parameters (dp index d: the d-th half of each flattened local tensor). With
  // `parts` false the model is saved whole (model.safetensors) and only the optimizer is cut.
  std::string save_zero_tp(const Whole& w, int64_t step, bool parts = true,
                           const std::vector<int>& drop_ranks = {}) {
    const int dp = 2, world = dp * kTp;
    EXPECT_TRUE(prepare_checkpoint(dir_, step));
    TrainingState s = rank0_state(w, step);
    s.world_size = world;
    s.zero_stage = 1;
    for (int r = 0; r < world; ++r) {
      const int tp_idx = r % kTp, dp_idx = r / kTp;
      const auto local = local_model(w, tp_idx);
      const auto local_opt = local_optimizer(w, tp_idx);
      if (parts && dp_idx == 0)
        s.model_parts.push_back(write_model_part(dir_, step, tp_idx, kTp, local, {}, w.cuts, step));
      OptimizerShard shard;
      if (std::find(drop_ranks.begin(), drop_ranks.end(), r) == drop_ranks.end())
        for (const auto& [name, t] : local) {
          const int64_t n = t.numel(), half = (n + 1) / 2;
          const int64_t b = dp_idx * half, e = std::min(n, b + half);
          shard.pieces.push_back({name, b, e - b, t.shape()});
          for (const char* state : {".exp_avg", ".exp_avg_sq"})
            shard.tensors[name + state] = local_opt.at(name + state).reshape({-1}).narrow(0, b, e - b).clone();
        }
      s.optimizer_shards.push_back(write_optimizer_shard(dir_, step, r, world, shard, step, tp_idx, kTp));
    }
    if (!parts) s.model = w.model;
    return save_training_state(dir_, s);
  }

  std::string dir_;
};

TEST_F(TensorParallelStateTest, PartsLoadAsTheWholeState) {
  const Whole w = make_whole();
  const std::string p = save_tp(w, 6);
  for (int i = 0; i < kTp; ++i) EXPECT_TRUE(fs::exists(p + "/" + model_part_file_name(i, kTp))) << i;
  EXPECT_EQ(model_part_file_name(1, 2), "model.tp1-of-2.safetensors");
  EXPECT_FALSE(fs::exists(p + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(p + "/optim.safetensors"));

  // The manifest: tp size, cuts and every part with its size and CRC.
  const nlohmann::json m = read_json(p + "/manifest.json");
  EXPECT_EQ(m.at("tp_size"), kTp);
  EXPECT_EQ(m.at("cuts").at("wte.weight"), "0/7");
  EXPECT_EQ(m.at("cuts").at("h.0.attn.c_attn.weight"), "1x3");
  EXPECT_FALSE(m.at("cuts").contains("h.0.ln_1.weight"));
  EXPECT_EQ(m.at("model_parts"), (nlohmann::json{"model.tp0-of-2.safetensors", "model.tp1-of-2.safetensors"}));
  for (int i = 0; i < kTp; ++i) {
    const std::string f = model_part_file_name(i, kTp);
    EXPECT_EQ(m.at("files").at(f).at("bytes").get<uint64_t>(), fs::file_size(p + "/" + f)) << f;
    EXPECT_EQ(m.at("files").at(f).at("crc32"), file_crc32(p + "/" + f)) << f;
  }
  EXPECT_FALSE(m.at("files").contains("model.safetensors"));
  // A part's own metadata.
  const SafetensorsHeader h = read_safetensors_header(p + "/model.tp1-of-2.safetensors");
  EXPECT_EQ(h.metadata.at("format"), "paratrain-model-part");
  EXPECT_EQ(h.metadata.at("tp_index"), "1");
  EXPECT_EQ(h.metadata.at("tp_size"), "2");
  EXPECT_EQ(h.metadata.at("optimizer_steps"), "6");
  EXPECT_EQ(nlohmann::json::parse(h.metadata.at("cuts")).at("h.0.attn.c_proj.weight"), "0");
  bool has_optim = false;
  for (const auto& e : h.entries) has_optim |= e.name == "optim/wte.weight.exp_avg";
  EXPECT_TRUE(has_optim);

  const TrainingState s = load_training_state(*find_latest_checkpoint(dir_));
  EXPECT_EQ(s.step, 6);
  EXPECT_EQ(s.tp_size, kTp);
  EXPECT_EQ(s.cuts, w.cuts);
  EXPECT_EQ(s.model_parts.size(), 2u);
  EXPECT_TRUE(s.optimizer_shards.empty());
  EXPECT_EQ(s.model_metadata, (Metadata{{"format", "pt"}, {"model", "gpt"}}));
  expect_same(s.model, w.model);  // the padding row of wte is dropped: [7, 4] again
  expect_same(s.optimizer, w.optimizer);
  verify_training_state(*find_latest_checkpoint(dir_));
}

TEST_F(TensorParallelStateTest, ZeroPiecesOverDpTimesTpLoadAsTheWholeState) {
  const Whole w = make_whole();
  for (bool parts : {true, false}) {
    fs::remove_all(dir_);
    const std::string p = save_zero_tp(w, 4, parts);
    for (int r = 0; r < 4; ++r) {
      const std::string f = p + "/" + optimizer_shard_file_name(r, 4);
      ASSERT_TRUE(fs::exists(f)) << f;
      const SafetensorsHeader h = read_safetensors_header(f);
      EXPECT_EQ(h.metadata.at("tp_index"), std::to_string(r % kTp));
      EXPECT_EQ(h.metadata.at("tp_size"), "2");
    }
    EXPECT_EQ(fs::exists(p + "/model.safetensors"), !parts);
    EXPECT_FALSE(fs::exists(p + "/optim.safetensors"));
    const TrainingState s = load_training_state(p);
    EXPECT_EQ(s.tp_size, kTp);
    EXPECT_EQ(s.zero_stage, 1);
    EXPECT_EQ(s.optimizer_shards.size(), 4u);
    EXPECT_EQ(s.model_parts.size(), parts ? 2u : 0u);
    expect_same(s.model, w.model);
    expect_same(s.optimizer, w.optimizer);
  }
}

TEST_F(TensorParallelStateTest, AnOldCheckpointHasNoTensorParallelFields) {
  TrainingState s;
  s.step = 2;
  s.model["w"] = iota({2, 2}, 0);
  s.optimizer["w.exp_avg"] = iota({2, 2}, 9);
  const std::string p = save_training_state(dir_, s);
  const nlohmann::json m = read_json(p + "/manifest.json");
  EXPECT_FALSE(m.contains("tp_size"));
  EXPECT_FALSE(m.contains("cuts"));
  EXPECT_FALSE(m.contains("model_parts"));
  const TrainingState back = load_training_state(p);
  EXPECT_EQ(back.tp_size, 1);
  EXPECT_TRUE(back.cuts.empty());
  EXPECT_TRUE(back.model_parts.empty());
  expect_same(back.model, s.model);
  expect_same(back.optimizer, s.optimizer);
  // A shard written without tensor parallelism carries no tp metadata.
  OptimizerShard shard;
  ASSERT_TRUE(prepare_checkpoint(dir_, 3));
  write_optimizer_shard(dir_, 3, 0, 1, shard, 3);
  EXPECT_EQ(read_safetensors_header(dir_ + "/step_3/" + optimizer_shard_file_name(0, 1)).metadata.count("tp_size"), 0u);
}

TEST_F(TensorParallelStateTest, ADamagedPartIsNamedAndNothingLoaded) {
  const Whole w = make_whole();
  const std::string p = save_tp(w, 3);
  const std::string part = p + "/model.tp1-of-2.safetensors";
  flip_byte(part, static_cast<std::streamoff>(fs::file_size(part) - 5));
  const std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("checkpoint " + p + " is damaged: model.tp1-of-2.safetensors fails its checksum"),
            std::string::npos)
      << msg;
}

TEST_F(TensorParallelStateTest, APartWhoseMetadataDisagreesIsDamaged) {
  const Whole w = make_whole();
  // Part 1 records other cuts than the manifest (it says c_proj is replicated).
  ASSERT_TRUE(prepare_checkpoint(dir_, 2));
  TrainingState s = rank0_state(w, 2);
  auto other_cuts = w.cuts;
  other_cuts.erase("h.0.attn.c_proj.weight");
  s.model_parts.push_back(write_model_part(dir_, 2, 0, kTp, local_model(w, 0), local_optimizer(w, 0), w.cuts, 2));
  s.model_parts.push_back(write_model_part(dir_, 2, 1, kTp, local_model(w, 1), local_optimizer(w, 1), other_cuts, 2));
  std::string p = save_training_state(dir_, s);
  std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: model.tp1-of-2.safetensors records the cuts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nothing was loaded"), std::string::npos) << msg;

  // Part 1 is a copy of part 0 (consistent size and CRC in the manifest): the wrong index.
  fs::remove_all(dir_);
  ASSERT_TRUE(prepare_checkpoint(dir_, 2));
  s.model_parts.clear();
  s.model_parts.push_back(write_model_part(dir_, 2, 0, kTp, local_model(w, 0), local_optimizer(w, 0), w.cuts, 2));
  const std::string step = dir_ + "/step_2/";
  fs::copy_file(step + "model.tp0-of-2.safetensors", step + "model.tp1-of-2.safetensors");
  s.model_parts.push_back({"model.tp1-of-2.safetensors", fs::file_size(step + "model.tp1-of-2.safetensors"),
                           file_crc32(step + "model.tp1-of-2.safetensors")});
  p = save_training_state(dir_, s);
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("model.tp1-of-2.safetensors does not say it is tensor-parallel part 1 of 2"), std::string::npos)
      << msg;

  // The manifest's tp size disagrees with the parts it lists.
  nlohmann::json m = read_json(p + "/manifest.json");
  m["tp_size"] = 3;
  std::ofstream(p + "/manifest.json") << m.dump(2);
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("lists 2 model parts for a tp_size of 3"), std::string::npos) << msg;
}

TEST_F(TensorParallelStateTest, PiecesThatDoNotCoverALocalTensorAreDamaged) {
  const Whole w = make_whole();
  // World rank 3 (tp index 1, dp index 1) wrote no pieces: the second halves of tp index 1's
  // local tensors are missing.
  std::string p = save_zero_tp(w, 5, true, {3});
  std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: the optimizer shards leave out elements"), std::string::npos) << msg;
  EXPECT_NE(msg.find("on tensor-parallel index 1"), std::string::npos) << msg;
  // Neither rank of tp index 1 wrote pieces: its part of every cut tensor is missing.
  fs::remove_all(dir_);
  p = save_zero_tp(w, 5, true, {1, 3});
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: h.0.attn.c_attn.bias.exp_avg (cut 0x3 over 2 tensor-parallel ranks) is missing "
                     "from the optimizer shards of tensor-parallel index 1"),
            std::string::npos)
      << msg;
}

TEST_F(TensorParallelStateTest, AMissingPartIsListedAndRefused) {
  const Whole w = make_whole();
  const std::string p = save_tp(w, 2);
  fs::remove(p + "/model.tp0-of-2.safetensors");
  std::string msg = error_of([&] { verify_training_state(p); });
  EXPECT_NE(msg.find("checkpoint " + p + " is incomplete: model.tp0-of-2.safetensors is missing"), std::string::npos)
      << msg;
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("model.tp0-of-2.safetensors is missing"), std::string::npos) << msg;
  // Saving a manifest for a part that was never written is refused.
  ASSERT_TRUE(prepare_checkpoint(dir_, 4));
  TrainingState s = rank0_state(w, 4);
  s.model_parts.push_back(write_model_part(dir_, 4, 0, kTp, local_model(w, 0), local_optimizer(w, 0), w.cuts, 4));
  s.model_parts.push_back({"model.tp1-of-2.safetensors", 0, "00000000"});
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("the model part"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.tp1-of-2.safetensors is missing"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir_ + "/step_4/manifest.json"));
  s.model_parts.pop_back();
  msg = error_of([&] { save_training_state(dir_, s); });
  EXPECT_NE(msg.find("1 model parts for a tp_size of 2"), std::string::npos) << msg;
}

TEST_F(TensorParallelStateTest, WriteModelPartRejectsBadInput) {
  const Whole w = make_whole();
  ASSERT_TRUE(prepare_checkpoint(dir_, 1));
  std::string msg = error_of([&] { write_model_part(dir_, 1, 2, 2, local_model(w, 0), {}, w.cuts, 1); });
  EXPECT_NE(msg.find("tensor-parallel index 2 of 2 does not exist"), std::string::npos) << msg;
  auto cuts = w.cuts;
  cuts["lm_head.weight"] = {0};
  msg = error_of([&] { write_model_part(dir_, 1, 0, 2, local_model(w, 0), {}, cuts, 1); });
  EXPECT_NE(msg.find("the cut 0 of lm_head.weight names no local model tensor"), std::string::npos) << msg;
  cuts = w.cuts;
  cuts["h.0.ln_1.weight"] = {1};
  msg = error_of([&] { write_model_part(dir_, 1, 0, 2, local_model(w, 0), {}, cuts, 1); });
  EXPECT_NE(msg.find("names a dimension"), std::string::npos) << msg;
  auto model = local_model(w, 0);
  model["optim/x"] = iota({1}, 0);
  msg = error_of([&] { write_model_part(dir_, 1, 0, 2, model, {}, w.cuts, 1); });
  EXPECT_NE(msg.find("optim/x"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir_ + "/step_1/" + model_part_file_name(0, 2)));
  msg = error_of([&] {
    OptimizerShard shard;
    write_optimizer_shard(dir_, 1, 0, 4, shard, 1, 2, 2);
  });
  EXPECT_NE(msg.find("tensor-parallel index 2 of 2 does not exist"), std::string::npos) << msg;
}

}  // namespace
