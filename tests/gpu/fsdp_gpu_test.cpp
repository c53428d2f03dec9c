// ZeRO stage 3 (parallel/fsdp.h) with the tiny GPT on cuda:0 over a one-rank nccl group: its
// blocks as units, gathered into flat device buffers around their forward and backward, the
// gradient reduced into a device shard; against the same GPT on the CPU without a wrapper.
// Checks: every shard piece and its gradient live on the GPU; the gradients follow the CPU
// (1e-5 absolute + 1e-4 relative: the GPU kernels sum in other orders), for two steps (the
// second reuses freed buffers) and with and without reshard-after-forward; nothing stays
// gathered after finish(); full_state() is the parameters bit for bit (copies only) and
// load_full_state() takes host tensors. A one-rank group communicates nothing, so this checks
// the device side (buffers, copies, kernels, the storage rebinding); the collectives are
// tests/gpu/nccl_process_group_test.cpp.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/fsdp.h"
#include "parallel/ddp_test_util.h"

namespace paratrain::parallel {
namespace {

const DeviceSpec kGpu{Device::CUDA, 0};

using test::one_rank_nccl;

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-4 * std::fabs(want[i])) << what << " element " << i;
}

class FsdpGpu : public ::testing::TestWithParam<bool> {};  // reshard after forward or not

TEST_P(FsdpGpu, TinyGptGradientsFollowTheCpuAndTheStateComesBack) {
  PT_REQUIRE_GPU();
  const nn::GPTConfig cfg = testing::tiny_gpt();
  nn::GPT ref(cfg, 7), model(cfg, 7);
  model.to(kGpu);
  std::vector<nn::Module*> units;
  for (auto& b : model.h) units.push_back(b.get());
  FsdpOptions o;
  o.reshard_after_forward = GetParam();
  FullyShardedDataParallel fsdp(model, units, one_rank_nccl(), o);

  Tensor x, y;
  testing::make_rows(0, 0, 2, cfg.block_size, cfg.vocab_size, x, y);
  autograd::backward(ref.loss(x, y));
  std::map<std::string, std::vector<float>> want;
  for (auto& [name, t] : ref.named_parameters()) want[name] = t.grad().to_vector();

  const Tensor xg = x.to(kGpu), yg = y.to(kGpu);
  for (int step = 0; step < 2; ++step) {
    fsdp.zero_grad();
    autograd::backward(model.loss(xg, yg), Tensor::full({}, fsdp.backward_seed(1)).to(kGpu));
    fsdp.finish();
    EXPECT_EQ(fsdp.memory().gathered_bytes, 0) << "step " << step;
    for (const auto& piece : fsdp.shard_pieces()) {
      ASSERT_TRUE(piece.param.is_cuda() && piece.grad.is_cuda()) << piece.name;
      const auto& w = want.at(piece.name);
      ASSERT_EQ(piece.begin, 0) << piece.name << ": one rank holds whole parameters";
      expect_close(piece.grad.to_vector(), w, piece.name + " step " + std::to_string(step));
    }
  }
  const auto ref_state = ref.state_dict();
  const auto state = fsdp.full_state();
  ASSERT_EQ(state.size(), ref_state.size());
  for (const auto& [name, t] : state) EXPECT_EQ(t.to_vector(), ref_state.at(name).to_vector()) << name;
  std::map<std::string, Tensor> halved;
  for (const auto& [name, t] : ref_state) {
    std::vector<float> v = t.to_vector();
    for (float& f : v) f *= 0.5f;
    halved[name] = Tensor::from_vector(v, t.shape());  // host tensors into device shards
  }
  fsdp.load_full_state(halved);
  for (const auto& [name, t] : fsdp.full_state()) EXPECT_EQ(t.to_vector(), halved.at(name).to_vector()) << name;
}

INSTANTIATE_TEST_SUITE_P(Modes, FsdpGpu, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Reshard" : "KeepGathered"; });

TEST(FsdpGpu, ParametersOnTwoDevicesAreRefusedNamingBoth) {
  PT_REQUIRE_GPU();
  nn::GPT model(testing::tiny_gpt(), 7);
  model.wte->weight.move_to_(kGpu);  // one parameter moved, the rest left on the CPU
  try {
    FullyShardedDataParallel fsdp(model, {}, one_rank_nccl());
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("Module::to"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace paratrain::parallel
