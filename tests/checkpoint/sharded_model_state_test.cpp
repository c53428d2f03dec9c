// Training-state checkpoints whose model is in the optimizer shards (checkpoint/training_state.h,
// ZeRO 3: no rank holds the whole model). Each "rank" owns a contiguous range of a padded flat
// layout of the parameters, as ZeRO cuts them, and writes its pieces of the parameters
// (OptimizerShard::params, "model/<name>" in the file) beside its pieces of the optimizer state;
// "rank 0" writes only the manifest. The load returns the WHOLE model and optimizer state,
// bit-identical, for W = 2 and 3 ranks and for dp 2 x tp 2 (pieces of LOCAL tensors joined
// along their cuts). Shards that lack a model tensor, hold one of no piece, or leave out a range
// are named as damaged. Every "rank" runs in turn in this process.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/tensor_cut.h"
#include "paratrain/checkpoint/training_state.h"

namespace fs = std::filesystem;
using namespace paratrain;
using namespace paratrain::checkpoint;

namespace {

using Tensors = std::map<std::string, Tensor>;

// Distinct non-integer values per tensor, so that a misplaced element shows.
Tensor ramp(const Shape& shape, float seed) {
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed + 0.125f * static_cast<float>(i) - 0.3f;
  return Tensor::from_vector(v, shape);
}

// Same names, shapes, dtypes and bytes.
void expect_bit_equal(const Tensors& got, const Tensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, w] : want) {
    ASSERT_EQ(got.count(name), 1u) << name;
    const Tensor g = got.at(name).contiguous(), c = w.contiguous();
    ASSERT_EQ(g.shape(), c.shape()) << name;
    ASSERT_EQ(g.dtype(), c.dtype()) << name;
    EXPECT_EQ(std::memcmp(g.data_ptr(), c.data_ptr(), c.nbytes()), 0) << name;
  }
}

// The InputError message `fn` throws ("" when it throws none).
std::string input_error(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

nlohmann::json manifest_of(const std::string& ckpt) {
  std::ifstream f(fs::path(ckpt) / "manifest.json");
  return nlohmann::json::parse(f);
}

// AdamW state for every parameter.
Tensors adam_state(const Tensors& model) {
  Tensors out;
  float seed = 50;
  for (const auto& [name, t] : model) {
    out[name + ".exp_avg"] = ramp(t.shape(), seed);
    out[name + ".exp_avg_sq"] = ramp(t.shape(), seed + 7);
    seed += 20;
  }
  return out;
}

// The ZeRO cut of `model` (and its `optimizer` state) over `dp` ranks: the parameters
// flattened one after the other in name order, padded to a multiple of dp, rank d owning the
// elements [d*L, (d+1)*L) of that layout. Rank d's piece of a parameter is its share of the
// parameter's elements; a rank owning none of a parameter's elements has no piece of it, or
// (with `empty_pieces`) a piece of 0 elements.
std::vector<OptimizerShard> zero_cut(const Tensors& model, const Tensors& optimizer, int dp, bool empty_pieces) {
  int64_t total = 0;
  for (const auto& [name, t] : model) total += t.numel();
  const int64_t per_rank = (total + dp - 1) / dp;
  std::vector<OptimizerShard> shards(static_cast<size_t>(dp));
  for (int d = 0; d < dp; ++d) {
    int64_t offset = 0;  // the parameter's first element in the flat layout
    for (const auto& [name, t] : model) {
      const int64_t n = t.numel();
      const int64_t b = std::clamp(d * per_rank - offset, int64_t{0}, n);
      const int64_t e = std::clamp((d + 1) * per_rank - offset, int64_t{0}, n);
      offset += n;
      if (b == e && !empty_pieces) continue;
      OptimizerShard& s = shards[static_cast<size_t>(d)];
      s.pieces.push_back({name, b, e - b, t.shape()});
      s.params[name] = t.reshape({-1}).narrow(0, b, e - b).clone();
      for (const auto& [key, st] : optimizer)
        if (key.rfind(name + ".", 0) == 0 && key.find('.', name.size() + 1) == std::string::npos)
          s.tensors[key] = st.reshape({-1}).narrow(0, b, e - b).clone();
    }
  }
  return shards;
}

class ShardedModelStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_sms_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A small model: 2-D and 1-D tensors, sizes 15, 5, 7 (divisible by neither 2 nor 3) and 4.
  static Tensors model() {
    return {{"a.weight", ramp({3, 5}, 1)},
            {"a.bias", ramp({5}, 2)},
            {"b.weight", ramp({7}, 3)},
            {"c.weight", ramp({2, 2}, 4)}};
  }

  // Rank 0's part of the state: everything but the tensors.
  static TrainingState manifest_state(int64_t step, int world) {
    TrainingState s;
    s.step = step;
    s.optimizer_steps = step;
    s.world_size = world;
    s.zero_stage = 3;
    s.model_in_shards = true;
    s.model_metadata = {{"format", "pt"}};
    s.config = {{"layout", {{"dp", world}, {"zero", 3}}}};
    return s;
  }

  // The sharded protocol with the model in the shards: prepare, every rank its shard (tp index
  // tp_of(r) of tp), rank 0 the manifest.
  std::string save(TrainingState s, const std::vector<OptimizerShard>& shards, int tp = 1,
                   const std::function<int(int)>& tp_of = [](int) { return 0; }) {
    const int world = static_cast<int>(shards.size());
    EXPECT_TRUE(prepare_checkpoint(dir_, s.step));
    for (int r = 0; r < world; ++r)
      s.optimizer_shards.push_back(
          write_optimizer_shard(dir_, s.step, r, world, shards[static_cast<size_t>(r)], s.step, tp_of(r), tp));
    return save_training_state(dir_, s);
  }

  // Rewrites the shard of `rank` (as a damaged save might have left it) with its tensors
  // changed by `edit`, its metadata kept; returns what the manifest must list of it.
  ShardFileInfo rewrite_shard(int64_t step, int rank, int world, const std::function<void(Tensors&)>& edit) {
    const std::string name = optimizer_shard_file_name(rank, world);
    const std::string path = (fs::path(dir_) / checkpoint_name(step) / name).string();
    SafetensorsFile f = read_safetensors(path);
    edit(f.tensors);
    save_safetensors(path, f.tensors, f.metadata);
    return {name, static_cast<uint64_t>(fs::file_size(path)), file_crc32(path)};
  }

  // Saves `shards` with the shard of `rank` then rewritten by `edit`, and returns what the load says.
  std::string load_error_after(const std::vector<OptimizerShard>& shards, int rank,
                               const std::function<void(Tensors&)>& edit) {
    const int world = static_cast<int>(shards.size());
    TrainingState s = manifest_state(3, world);
    EXPECT_TRUE(prepare_checkpoint(dir_, s.step));
    for (int r = 0; r < world; ++r)
      s.optimizer_shards.push_back(write_optimizer_shard(dir_, s.step, r, world, shards[static_cast<size_t>(r)], 3));
    s.optimizer_shards[static_cast<size_t>(rank)] = rewrite_shard(s.step, rank, world, edit);
    const std::string p = save_training_state(dir_, s);
    verify_training_state(p);  // the files are as the manifest lists them: only their content is wrong
    return input_error([&] { load_training_state(p); });
  }

  std::string dir_;
};

TEST_F(ShardedModelStateTest, ModelAndOptimizerInShardsLoadWhole) {
  const Tensors want_model = model(), want_optim = adam_state(want_model);
  for (int world : {2, 3}) {
    fs::remove_all(dir_);
    const auto shards = zero_cut(want_model, want_optim, world, /*empty_pieces=*/world == 3);
    TrainingState s = manifest_state(5, world);
    s.model["unused"] = ramp({2}, 9);  // model is unused with model_in_shards: nothing writes it
    const std::string p = save(s, shards);

    EXPECT_FALSE(fs::exists(p + "/model.safetensors")) << world;
    EXPECT_FALSE(fs::exists(p + "/optim.safetensors")) << world;
    const nlohmann::json m = manifest_of(p);
    EXPECT_EQ(m.at("model_in_shards"), true);
    EXPECT_EQ(m.at("model_metadata"), (nlohmann::json{{"format", "pt"}}));
    EXPECT_FALSE(m.at("files").contains("model.safetensors"));
    EXPECT_FALSE(m.contains("model_parts"));
    EXPECT_FALSE(m.contains("tp_size"));
    EXPECT_EQ(m.at("optimizer_shards").size(), static_cast<size_t>(world));
    // Rank 0's file holds its pieces of the parameters under "model/" beside the state.
    bool has_param = false, has_state = false;
    for (const auto& e : read_safetensors_header(p + "/" + optimizer_shard_file_name(0, world)).entries) {
      has_param |= e.name == "model/a.bias";
      has_state |= e.name == "a.bias.exp_avg";
    }
    EXPECT_TRUE(has_param && has_state) << world;

    verify_training_state(p);
    const TrainingState back = load_training_state(p);
    EXPECT_TRUE(back.model_in_shards);
    EXPECT_EQ(back.step, 5);
    EXPECT_EQ(back.zero_stage, 3);
    EXPECT_EQ(back.optimizer_shards.size(), static_cast<size_t>(world));
    EXPECT_EQ(back.model_metadata, (Metadata{{"format", "pt"}}));
    expect_bit_equal(back.model, want_model);
    expect_bit_equal(back.optimizer, want_optim);
  }
}

TEST_F(ShardedModelStateTest, TensorParallelPiecesOfLocalTensorsJoinWhole) {
  constexpr int kTp = 2, kDp = 2, kWorld = kTp * kDp;
  const Tensors want_model = {{"emb.weight", ramp({7, 4}, 1)},   // padded vocabulary rows
                              {"fc.weight", ramp({4, 6}, 2)},    // cut along dim 1
                              {"proj.weight", ramp({6, 4}, 3)},  // cut along dim 0
                              {"ln.weight", ramp({4}, 4)}};      // replicated
  const std::map<std::string, TensorCut> cuts = {{"emb.weight", {0, 1, 7}}, {"fc.weight", {1}}, {"proj.weight", {0}}};
  const Tensors want_optim = adam_state(want_model);
  const auto cut_of = [&](const std::string& param) { return cuts.count(param) ? cuts.at(param) : TensorCut{}; };
  // World rank r is tp index r % 2, dp index r / 2 (DESIGN.md's mesh); each tp index's LOCAL
  // tensors are cut ZeRO's way over its dp ranks.
  std::vector<OptimizerShard> shards(kWorld);
  for (int i = 0; i < kTp; ++i) {
    Tensors local_model, local_optim;
    for (const auto& [name, t] : want_model) local_model[name] = cut_tensor(t, cut_of(name), i, kTp);
    for (const auto& [key, t] : want_optim)
      local_optim[key] = cut_tensor(t, cut_of(key.substr(0, key.rfind('.'))), i, kTp);
    // The load takes a replicated tensor from the lowest tp index: tp index 1's copy differs here
    // (as a drifted copy would), and must not be what comes back.
    if (i == 1) local_model["ln.weight"] = ramp({4}, 99);
    const auto mine = zero_cut(local_model, local_optim, kDp, /*empty_pieces=*/false);
    for (int d = 0; d < kDp; ++d) shards[static_cast<size_t>(d * kTp + i)] = mine[static_cast<size_t>(d)];
  }
  TrainingState s = manifest_state(4, kWorld);
  s.tp_size = kTp;
  s.cuts = cuts;
  const std::string p = save(s, shards, kTp, [](int r) { return r % kTp; });

  for (const auto& e : fs::directory_iterator(p)) {
    const std::string f = e.path().filename().string();
    EXPECT_TRUE(f == "manifest.json" || f.rfind("optim.rank", 0) == 0) << "unexpected file " << f;
  }
  const nlohmann::json m = manifest_of(p);
  EXPECT_EQ(m.at("model_in_shards"), true);
  EXPECT_EQ(m.at("tp_size"), kTp);
  EXPECT_EQ(m.at("cuts").at("emb.weight"), "0/7");
  EXPECT_FALSE(m.at("cuts").contains("ln.weight"));
  EXPECT_FALSE(m.contains("model_parts"));

  const TrainingState back = load_training_state(p);
  EXPECT_TRUE(back.model_in_shards);
  EXPECT_EQ(back.tp_size, kTp);
  EXPECT_EQ(back.cuts, cuts);
  EXPECT_TRUE(back.model_parts.empty());
  expect_bit_equal(back.model, want_model);  // emb.weight [7, 4] again: the padding row dropped
  expect_bit_equal(back.optimizer, want_optim);

  // Neither dp rank of tp index 1 holds proj.weight: its half of the cut tensor is missing.
  fs::remove_all(dir_);
  for (int d = 0; d < kDp; ++d) {
    OptimizerShard& sh = shards[static_cast<size_t>(d * kTp + 1)];
    std::erase_if(sh.pieces, [](const OptimizerShard::Piece& pc) { return pc.name == "proj.weight"; });
    sh.params.erase("proj.weight");
    sh.tensors.erase("proj.weight.exp_avg");
    sh.tensors.erase("proj.weight.exp_avg_sq");
  }
  const std::string q = save(s, shards, kTp, [](int r) { return r % kTp; });
  const std::string msg = input_error([&] { load_training_state(q); });
  EXPECT_NE(msg.find("is damaged: proj.weight (cut 0 over 2 tensor-parallel ranks) is missing from the optimizer "
                     "shards of tensor-parallel index 1"),
            std::string::npos)
      << msg;
}

TEST_F(ShardedModelStateTest, AShardWithoutTheModelTensorOfAPieceIsDamaged) {
  const Tensors want_model = model();
  const auto shards = zero_cut(want_model, adam_state(want_model), 2, false);
  // Rank 1's file lost model/b.weight (its piece and optimizer state are still listed).
  const std::string msg = load_error_after(shards, 1, [](Tensors& t) { ASSERT_EQ(t.erase("model/b.weight"), 1u); });
  EXPECT_NE(msg.find("is damaged: optim.rank1-of-2.safetensors holds no model/b.weight for its piece of b.weight"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("nothing was loaded"), std::string::npos) << msg;
}

TEST_F(ShardedModelStateTest, AModelTensorOfNoPieceIsDamaged) {
  const Tensors want_model = model();
  const auto shards = zero_cut(want_model, adam_state(want_model), 2, false);
  const std::string msg = load_error_after(shards, 0, [](Tensors& t) { t["model/x"] = ramp({2}, 0); });
  EXPECT_NE(msg.find("is damaged: optim.rank0-of-2.safetensors holds tensor model/x, which belongs to no piece"),
            std::string::npos)
      << msg;
}

TEST_F(ShardedModelStateTest, PiecesThatLeaveOutPartOfAParameterAreDamaged) {
  // Optimizer state without tensors (SGD without momentum): the parameters alone are sharded.
  // Rank 1 lost its piece of a.weight (metadata and tensor), whose first elements rank 0 holds.
  const Tensors want_model = model();
  auto shards = zero_cut(want_model, {}, 2, false);
  int64_t begin = -1, end = -1;
  for (const auto& pc : shards[1].pieces)
    if (pc.name == "a.weight") begin = pc.begin, end = pc.begin + pc.numel;
  ASSERT_GT(begin, 0);
  std::erase_if(shards[1].pieces, [](const OptimizerShard::Piece& pc) { return pc.name == "a.weight"; });
  shards[1].params.erase("a.weight");
  const std::string p = save(manifest_state(2, 2), shards);
  const std::string msg = input_error([&] { load_training_state(p); });
  EXPECT_NE(msg.find("is damaged: the optimizer shards leave out elements " + std::to_string(begin) + ".." +
                     std::to_string(end) + " of model/a.weight"),
            std::string::npos)
      << msg;
}

TEST_F(ShardedModelStateTest, ModelTensorsTheManifestDoesNotExpectAreDamaged) {
  // Shards with the parameters, saved without model_in_shards (model.safetensors written whole).
  const Tensors want_model = model();
  const auto shards = zero_cut(want_model, adam_state(want_model), 2, false);
  TrainingState s = manifest_state(2, 2);
  s.model_in_shards = false;
  s.model = want_model;
  const std::string p = save(s, shards);
  EXPECT_TRUE(fs::exists(p + "/model.safetensors"));
  EXPECT_FALSE(manifest_of(p).contains("model_in_shards"));
  const std::string msg = input_error([&] { load_training_state(p); });
  EXPECT_NE(
      msg.find("holds the model tensor model/a.bias, though the manifest does not say the model is in the shards"),
      std::string::npos)
      << msg;
}

TEST_F(ShardedModelStateTest, BadInputIsRefusedBeforeAnythingIsWritten) {
  const Tensors want_model = model();
  const auto shards = zero_cut(want_model, adam_state(want_model), 2, false);
  ASSERT_TRUE(prepare_checkpoint(dir_, 1));
  const std::string shard0 = dir_ + "/step_1/" + optimizer_shard_file_name(0, 2);
  const auto write_error = [&](const OptimizerShard& sh) {
    return input_error([&] { write_optimizer_shard(dir_, 1, 0, 2, sh, 1); });
  };
  OptimizerShard sh = shards[0];
  sh.params["nope"] = ramp({1}, 0);
  EXPECT_NE(write_error(sh).find("the parameter piece nope belongs to no piece of the shard"), std::string::npos);
  sh = shards[0];
  sh.params.erase(sh.pieces.front().name);
  EXPECT_NE(write_error(sh).find("the piece " + sh.pieces.front().name + " has no parameter tensor"),
            std::string::npos);
  sh = shards[0];
  sh.params[sh.pieces.front().name] = ramp({sh.pieces.front().numel + 1}, 0);
  EXPECT_NE(write_error(sh).find("its piece 1-D f32 of"), std::string::npos);
  sh = shards[0];
  sh.tensors["model/a.bias.exp_avg"] = ramp({1}, 0);
  EXPECT_NE(write_error(sh).find("reserved for the parameters"), std::string::npos);
  EXPECT_FALSE(fs::exists(shard0));

  // model_in_shards needs the shards, and excludes model parts.
  TrainingState s = manifest_state(1, 2);
  EXPECT_NE(input_error([&] { save_training_state(dir_, s); }).find("optimizer_shards is empty"), std::string::npos);
  s.optimizer_shards.push_back(write_optimizer_shard(dir_, 1, 0, 2, shards[0], 1));
  s.optimizer_shards.push_back(write_optimizer_shard(dir_, 1, 1, 2, shards[1], 1));
  s.model_parts.push_back({model_part_file_name(0, 1), 0, "00000000"});
  EXPECT_NE(input_error([&] { save_training_state(dir_, s); }).find("model_in_shards and model_parts are both given"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(dir_ + "/step_1/manifest.json"));
  EXPECT_FALSE(fs::exists(dir_ + "/step_1/model.safetensors"));

  // A manifest that says model_in_shards malformedly, or with model parts too, is damaged.
  s.model_parts.clear();
  const std::string p = save_training_state(dir_, s);
  nlohmann::json m = manifest_of(p);
  m["model_in_shards"] = "yes";
  std::ofstream(p + "/manifest.json") << m.dump(2);
  EXPECT_NE(input_error([&] { verify_training_state(p); }).find("has a malformed \"model_in_shards\""),
            std::string::npos);
  m["model_in_shards"] = true;
  m.erase("optimizer_shards");
  std::ofstream(p + "/manifest.json") << m.dump(2);
  EXPECT_NE(input_error([&] { load_training_state(p); }).find("says \"model_in_shards\" but lists no"),
            std::string::npos);
}

}  // namespace
