// Training-state checkpoints (checkpoint/training_state.h): round trip, the manifest written
// last, `latest`, keeping the last two, damaged checkpoints named and never loaded,
// incomplete ones (a killed save) passed over by the resume and named, then replaced by a
// new save; sharded optimizer state (ZeRO): one file per rank, assembled on load, a
// damaged, missing or non-covering shard named.
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/checkpoint/training_state.h"

namespace fs = std::filesystem;
using namespace paratrain;
using namespace paratrain::checkpoint;

namespace {

class TrainingStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("paratrain_ts_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static TrainingState make_state(int64_t step) {
    TrainingState s;
    s.step = step;
    s.model["w"] = Tensor::from_vector({1.0f, 2.0f, 3.0f + step, 4.0f}, {2, 2});
    s.model["b"] = Tensor::from_vector({0.5f, -0.5f}, {2});
    s.model_metadata = {{"format", "test"}};
    s.optimizer["w.exp_avg"] = Tensor::from_vector({0.1f, 0.2f, 0.3f, 0.4f}, {2, 2});
    s.optimizer["w.exp_avg_sq"] = Tensor::from_vector({0.01f, 0.02f, 0.03f, 0.04f}, {2, 2});
    s.optimizer_steps = step;
    s.rng = std::array<uint64_t, 4>{1, 0xffffffffffffffffULL, 3, 0x8000000000000000ULL};
    s.world_size = 2;
    s.config = {{"layout", {{"micro_batch", 3}, {"grad_accum", 1}, {"dp", 2}, {"seed", 7}}}};
    return s;
  }
  std::string dir_;
};

void flip_byte(const std::string& path, std::streamoff at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x01));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

TEST_F(TrainingStateTest, RoundTripIsExact) {
  const std::string p = save_training_state(dir_, make_state(4));
  EXPECT_EQ(p, (fs::path(dir_) / "step_4").string());
  auto latest = find_latest_checkpoint(dir_);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(*latest, p);
  TrainingState s = load_training_state(*latest);
  TrainingState want = make_state(4);
  EXPECT_EQ(s.step, 4);
  EXPECT_EQ(s.optimizer_steps, 4);
  EXPECT_EQ(s.world_size, 2);
  EXPECT_EQ(s.loss_scale, 1.0);
  ASSERT_TRUE(s.rng.has_value());
  EXPECT_EQ(*s.rng, *want.rng);
  EXPECT_EQ(s.config, want.config);
  EXPECT_EQ(s.model_metadata.at("format"), "test");
  ASSERT_EQ(s.model.size(), 2u);
  EXPECT_EQ(s.model.at("w").to_vector(), want.model.at("w").to_vector());
  EXPECT_EQ(s.optimizer.at("w.exp_avg_sq").to_vector(), want.optimizer.at("w.exp_avg_sq").to_vector());
}

TEST_F(TrainingStateTest, KeepsTheLastTwoAndLatestPointsToTheNewest) {
  for (int64_t step : {2, 4, 6, 8}) save_training_state(dir_, make_state(step));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step_2"));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step_4"));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "step_6" / "manifest.json"));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "step_8" / "manifest.json"));
  std::ifstream f(fs::path(dir_) / "latest");
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "step_8");
  // Saving the step that already is `latest` again is a no-op.
  save_training_state(dir_, make_state(8));
  EXPECT_EQ(load_training_state(*find_latest_checkpoint(dir_)).step, 8);
}

TEST_F(TrainingStateTest, NoCheckpointMeansFreshStart) {
  EXPECT_FALSE(find_latest_checkpoint(dir_).has_value());  // missing directory
  fs::create_directories(dir_);
  EXPECT_FALSE(find_latest_checkpoint(dir_).has_value());  // empty directory
}

TEST_F(TrainingStateTest, AnInterruptedSaveAfterLatestIsIgnoredAndReplaced) {
  save_training_state(dir_, make_state(2));
  // A kill during the save of step 4: its tensors are there, its manifest and `latest` not.
  fs::create_directories(fs::path(dir_) / "step_4");
  fs::copy_file(fs::path(dir_) / "step_2" / "model.safetensors", fs::path(dir_) / "step_4" / "model.safetensors");
  EXPECT_EQ(*find_latest_checkpoint(dir_), (fs::path(dir_) / "step_2").string());
  save_training_state(dir_, make_state(4));
  EXPECT_EQ(load_training_state(*find_latest_checkpoint(dir_)).step, 4);
}

TEST_F(TrainingStateTest, DamagedFileIsNamedAndNothingLoaded) {
  const std::string p = save_training_state(dir_, make_state(3));
  flip_byte(p + "/optim.safetensors", static_cast<std::streamoff>(fs::file_size(p + "/optim.safetensors") - 3));
  const std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
}

TEST_F(TrainingStateTest, TruncatedFileIsDamaged) {
  const std::string p = save_training_state(dir_, make_state(3));
  fs::resize_file(p + "/model.safetensors", fs::file_size(p + "/model.safetensors") - 4);
  const std::string msg = error_of([&] { verify_training_state(p); });
  EXPECT_NE(msg.find("model.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
}

TEST_F(TrainingStateTest, MissingManifestIsIncomplete) {
  const std::string p = save_training_state(dir_, make_state(5));
  fs::remove(p + "/manifest.json");
  // `latest` still names it: the resume must fail, naming the checkpoint.
  const std::string msg = error_of([&] { load_training_state(*find_latest_checkpoint(dir_)); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  // Without `latest` it is one incomplete step directory among others: passed over, named.
  fs::remove(fs::path(dir_) / "latest");
  const ResumePoint rp = find_resume_point(dir_);
  EXPECT_FALSE(rp.checkpoint.has_value());
  EXPECT_EQ(rp.ignored, std::vector<std::string>{p});
}

// A save killed before its manifest leaves step_<N> with some files: an incomplete checkpoint.
void make_incomplete(const std::string& dir, int64_t step) {
  const fs::path p = fs::path(dir) / checkpoint_name(step);
  fs::create_directories(p);
  std::ofstream(p / "model.safetensors") << "half a file";
  std::ofstream(p / "optim.safetensors.tmp.12345") << "a temporary the kill left";
}

TEST_F(TrainingStateTest, OnlyIncompleteCheckpointsMeanAFreshStartThatNamesThem) {
  make_incomplete(dir_, 2);
  make_incomplete(dir_, 4);
  ResumePoint rp = find_resume_point(dir_);
  EXPECT_FALSE(rp.checkpoint.has_value());
  EXPECT_EQ(rp.ignored, (std::vector<std::string>{(fs::path(dir_) / "step_4").string(),
                                                  (fs::path(dir_) / "step_2").string()}));
  EXPECT_FALSE(find_latest_checkpoint(dir_).has_value());
  // The fresh run saves step 2 again: the leftover is replaced, not merged.
  save_training_state(dir_, make_state(2));
  EXPECT_EQ(load_training_state((fs::path(dir_) / "step_2").string()).step, 2);
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step_2" / "optim.safetensors.tmp.12345"));
  rp = find_resume_point(dir_);
  ASSERT_TRUE(rp.checkpoint.has_value());
  EXPECT_EQ(*rp.checkpoint, (fs::path(dir_) / "step_2").string());
  EXPECT_EQ(rp.ignored, std::vector<std::string>{(fs::path(dir_) / "step_4").string()});
  // Then step 4 and step 6: every checkpoint complete, the rotation keeps the newest two.
  save_training_state(dir_, make_state(4));
  EXPECT_TRUE(find_resume_point(dir_).ignored.empty());
  save_training_state(dir_, make_state(6));
  EXPECT_FALSE(fs::exists(fs::path(dir_) / "step_2"));
  EXPECT_TRUE(fs::exists(fs::path(dir_) / "step_4" / "manifest.json"));
  EXPECT_EQ(load_training_state(*find_resume_point(dir_).checkpoint).step, 6);
}

TEST_F(TrainingStateTest, ACompleteCheckpointIsPickedOverANewerIncompleteOne) {
  const std::string complete = save_training_state(dir_, make_state(2));
  make_incomplete(dir_, 4);
  for (bool with_latest : {true, false}) {
    if (!with_latest) fs::remove(fs::path(dir_) / "latest");
    const ResumePoint rp = find_resume_point(dir_);
    ASSERT_TRUE(rp.checkpoint.has_value()) << with_latest;
    EXPECT_EQ(*rp.checkpoint, complete) << with_latest;
    EXPECT_EQ(rp.ignored, std::vector<std::string>{(fs::path(dir_) / "step_4").string()}) << with_latest;
  }
}

TEST_F(TrainingStateTest, ADamagedCompleteCheckpointIsNotPassedOver) {
  // A complete step_2 whose model fails its checksum, a complete step_1 before it and an
  // incomplete step_3 after: the resume picks step_2 and its load fails, naming it.
  save_training_state(dir_, make_state(1));
  const std::string p = save_training_state(dir_, make_state(2));
  make_incomplete(dir_, 3);
  flip_byte(p + "/model.safetensors", static_cast<std::streamoff>(fs::file_size(p + "/model.safetensors") - 3));
  const ResumePoint rp = find_resume_point(dir_);
  ASSERT_TRUE(rp.checkpoint.has_value());
  EXPECT_EQ(*rp.checkpoint, p);
  std::string msg = error_of([&] { load_training_state(*rp.checkpoint); });
  EXPECT_NE(msg.find(p + " is damaged: model.safetensors fails its checksum"), std::string::npos) << msg;
  // Truncated: damaged too.
  fs::resize_file(p + "/model.safetensors", fs::file_size(p + "/model.safetensors") - 4);
  msg = error_of([&] { load_training_state(*find_resume_point(dir_).checkpoint); });
  EXPECT_NE(msg.find(p + " is damaged: model.safetensors has"), std::string::npos) << msg;
}

TEST_F(TrainingStateTest, GarbledManifestIsDamaged) {
  const std::string p = save_training_state(dir_, make_state(1));
  std::ofstream(p + "/manifest.json") << "{\"format\": ";
  const std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("manifest.json"), std::string::npos) << msg;
  EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
}

TEST_F(TrainingStateTest, LatestNamingAMissingDirectoryIsAnError) {
  fs::create_directories(dir_);
  std::ofstream(fs::path(dir_) / "latest") << "step_9\n";
  const std::string msg = error_of([&] { find_latest_checkpoint(dir_); });
  EXPECT_NE(msg.find("step_9"), std::string::npos) << msg;
}

// The optimizer state of make_state() cut into `world` shards the way ZeRO's ranks hold it:
// rank r has elements [r*len, (r+1)*len) of w (4 elements, flattened) -- pieces of 1-D views.
std::vector<OptimizerShard> cut(const TrainingState& s, int world) {
  std::vector<OptimizerShard> out(world);
  const int64_t len = (4 + world - 1) / world;
  for (int r = 0; r < world; ++r) {
    const int64_t b = std::min<int64_t>(4, r * len), e = std::min<int64_t>(4, b + len);
    if (b >= e) continue;
    out[r].pieces.push_back({"w", b, e - b, {2, 2}});
    for (const char* k : {"w.exp_avg", "w.exp_avg_sq"})
      out[r].tensors[k] = s.optimizer.at(k).view({-1}).narrow(0, b, e - b);
  }
  return out;
}

// The sharded protocol of one save (every "rank" in turn, in this process).
std::string save_sharded(const std::string& dir, TrainingState s, const std::vector<OptimizerShard>& shards) {
  const int world = static_cast<int>(shards.size());
  EXPECT_TRUE(prepare_checkpoint(dir, s.step));
  for (int r = 0; r < world; ++r)
    s.optimizer_shards.push_back(write_optimizer_shard(dir, s.step, r, world, shards[r], s.optimizer_steps));
  s.zero_stage = 1;
  return save_training_state(dir, s);
}

TEST_F(TrainingStateTest, ShardedOptimizerStateIsAssembledOnLoad) {
  for (int world : {1, 2, 3}) {
    const TrainingState want = make_state(4 + world);
    const std::string p = save_sharded(dir_, want, cut(want, world));
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(fs::exists(p + "/" + optimizer_shard_file_name(r, world))) << r << " of " << world;
    EXPECT_FALSE(fs::exists(p + "/optim.safetensors"));
    TrainingState s = load_training_state(*find_latest_checkpoint(dir_));
    EXPECT_EQ(s.step, 4 + world);
    EXPECT_EQ(s.zero_stage, 1);
    ASSERT_EQ(s.optimizer_shards.size(), static_cast<size_t>(world));
    ASSERT_EQ(s.optimizer.size(), 2u);
    for (const char* k : {"w.exp_avg", "w.exp_avg_sq"}) {
      EXPECT_EQ(s.optimizer.at(k).shape(), (Shape{2, 2})) << k;
      EXPECT_EQ(s.optimizer.at(k).to_vector(), want.optimizer.at(k).to_vector()) << k << ", " << world << " shards";
    }
    EXPECT_EQ(s.model.at("w").to_vector(), want.model.at("w").to_vector());
  }
  // Saving the step that already is `latest` again: prepare says there is nothing to do.
  EXPECT_FALSE(prepare_checkpoint(dir_, 7));
}

TEST_F(TrainingStateTest, DamagedOrMissingShardIsNamed) {
  const TrainingState want = make_state(2);
  const std::string p = save_sharded(dir_, want, cut(want, 2));
  const std::string shard = p + "/" + optimizer_shard_file_name(1, 2);
  flip_byte(shard, static_cast<std::streamoff>(fs::file_size(shard) - 2));
  std::string msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.rank1-of-2.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("checksum"), std::string::npos) << msg;
  fs::remove(shard);
  msg = error_of([&] { load_training_state(p); });
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("optim.rank1-of-2.safetensors is missing"), std::string::npos) << msg;
}

TEST_F(TrainingStateTest, ShardsThatDoNotCoverTheStateAreDamaged) {
  // Consistent checksums, but the pieces leave out elements 2..4 (rank 1 holds nothing) or
  // overlap (both ranks hold all): the state cannot be assembled.
  const TrainingState want = make_state(3);
  auto shards = cut(want, 2);
  shards[1] = OptimizerShard();
  std::string msg = error_of([&] { load_training_state(save_sharded(dir_, want, shards)); });
  EXPECT_NE(msg.find("damaged"), std::string::npos) << msg;
  EXPECT_NE(msg.find("leave out elements 2..4 of w.exp_avg"), std::string::npos) << msg;
  shards = cut(want, 1);
  shards.push_back(shards[0]);
  fs::remove_all(dir_);
  msg = error_of([&] { load_training_state(save_sharded(dir_, want, shards)); });
  EXPECT_NE(msg.find("overlap"), std::string::npos) << msg;
}

}  // namespace
