// DistributedDataParallel and ZeRO 1/2 with the parameters on cuda:0 over a one-rank nccl
// group (docs/ddp.md): buckets, accumulators and shards on the GPU, several small buckets,
// a no_sync micro-step, gradients checked against the same model on the CPU without DDP;
// the fp16/bf16 gradient compressor on a device bucket; and PowerSGD on the GPU's buckets,
// step by step the same DDP with PowerSGD on the CPU.
// A one-rank group communicates nothing, so these check the device side of the reducer (its
// buffers, kernels and copies); the collectives themselves are tests/gpu/nccl_process_group_test.
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/nn/module.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/zero.h"
#include "paratrain/tensor/random.h"

namespace paratrain::parallel {
namespace {

// Two linear layers with tanh between, parameters on `dev`, the same values for every `dev`
// (drawn on the CPU from a fixed seed).
class Mlp : public nn::Module {
 public:
  explicit Mlp(DeviceSpec dev) {
    Generator gen(7);
    auto param = [&](const std::string& name, Shape shape) {
      Tensor t = Tensor::empty(shape);
      fill_uniform(t, gen, -0.5f, 0.5f);
      return register_parameter(name, t.to(dev));
    };
    w1 = param("fc1.weight", {kIn, kHidden});
    b1 = param("fc1.bias", {kHidden});
    w2 = param("fc2.weight", {kHidden, kOut});
    b2 = param("fc2.bias", {kOut});
  }
  // mean((tanh(x W1 + b1) W2 + b2) * c): a scalar whose gradient reaches every parameter.
  Tensor loss(const Tensor& x, const Tensor& c) const {
    Tensor h = ops::tanh(ops::linear(x, w1, b1, true));
    return ops::mean(ops::mul(ops::linear(h, w2, b2, true), c));
  }

  static constexpr int64_t kIn = 16, kHidden = 24, kOut = 8, kRows = 4;
  Tensor w1, b1, w2, b2;
};

// Micro-batch k's input rows and output weights, on `dev`.
std::pair<Tensor, Tensor> batch(int k, DeviceSpec dev) {
  Generator gen(100 + static_cast<uint64_t>(k));
  Tensor x = Tensor::empty({Mlp::kRows, Mlp::kIn}), c = Tensor::empty({Mlp::kRows, Mlp::kOut});
  fill_uniform(x, gen, -1.0f, 1.0f);
  fill_uniform(c, gen, -1.0f, 1.0f);
  return {x.to(dev), c.to(dev)};
}

const DeviceSpec kCpu{Device::CPU, -1};
const DeviceSpec kGpu{Device::CUDA, 0};

using test::one_rank_nccl;

// The reference: `micro` micro-batches on the CPU model, no DDP, seed 1/micro each; returns
// each parameter's gradient by name.
std::map<std::string, std::vector<float>> cpu_gradients(int micro) {
  Mlp m(kCpu);
  Tensor seed = Tensor::full({}, 1.0f / static_cast<float>(micro));
  for (int k = 0; k < micro; ++k) {
    auto [x, c] = batch(k, kCpu);
    autograd::backward(m.loss(x, c), seed);
  }
  std::map<std::string, std::vector<float>> out;
  for (auto& [name, t] : m.named_parameters()) out[name] = t.grad().to_vector();
  return out;
}

// One DDP step on the model (on `dev`, the GPU unless said): micro-batches 0..micro-1, all
// but the last under no_sync.
void gpu_step(Mlp& m, DistributedDataParallel& ddp, int micro, DeviceSpec dev = kGpu) {
  Tensor seed = Tensor::full({}, ddp.backward_seed(micro)).to(dev);
  ddp.zero_grad();
  for (int k = 0; k < micro; ++k) {
    std::optional<NoSync> ns;
    if (k + 1 < micro) ns.emplace(ddp.no_sync());
    auto [x, c] = batch(k, dev);
    autograd::backward(m.loss(x, c), seed);
  }
  ddp.finish();
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], 1e-5 + 1e-4 * std::fabs(want[i])) << what << " element " << i;
}

DdpOptions small_buckets() {
  DdpOptions o;
  o.first_bucket_bytes = 64;  // fc2.bias alone
  o.bucket_bytes = 800;       // fc2.weight (768 bytes), then fc1.bias, then fc1.weight
  return o;
}

class DdpGpu : public ::testing::TestWithParam<bool> {};  // deterministic mode or not

TEST_P(DdpGpu, GradientsInSeveralBucketsMatchTheCpu) {
  PT_REQUIRE_GPU();
  Mlp m(kGpu);
  DdpOptions o = small_buckets();
  o.deterministic = GetParam();
  DistributedDataParallel ddp(m, one_rank_nccl(), o);
  ASSERT_GE(ddp.bucket_names().size(), 3u);
  const auto want = cpu_gradients(2);
  for (int step = 0; step < 2; ++step) {  // the second step reuses the zeroed buckets
    gpu_step(m, ddp, 2);
    for (auto& [name, t] : m.named_parameters()) {
      ASSERT_TRUE(t.grad().is_cuda()) << name;
      expect_close(t.grad().to_vector(), want.at(name), name + " step " + std::to_string(step));
    }
  }
  // One micro-step per step: no no_sync pass.
  gpu_step(m, ddp, 1);
  const auto want1 = cpu_gradients(1);
  for (auto& [name, t] : m.named_parameters()) expect_close(t.grad().to_vector(), want1.at(name), name + " (1 micro)");
}

INSTANTIATE_TEST_SUITE_P(Modes, DdpGpu, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Deterministic" : "Default"; });

class ZeroGpu : public ::testing::TestWithParam<int> {};  // zero stage

TEST_P(ZeroGpu, ShardsHoldTheCpuGradientAndTheNorm) {
  PT_REQUIRE_GPU();
  Mlp m(kGpu);
  DdpOptions o = small_buckets();
  o.zero_stage = GetParam();
  DistributedDataParallel ddp(m, one_rank_nccl(), o);
  optim::SGDOptions so;
  so.lr = 0.1;
  optim::SGD sgd(zero_pieces(ddp), so);
  ZeroOptimizer zero(ddp, sgd);
  const auto want = cpu_gradients(2);
  double want_sq = 0;
  for (const auto& [name, g] : want)
    for (float v : g) want_sq += static_cast<double>(v) * v;
  for (int step = 0; step < 2; ++step) {  // stage 2 frees the buckets at finish(), zero_grad() takes them again
    gpu_step(m, ddp, 2);
    int64_t covered = 0;
    for (const auto& piece : ddp.shard_pieces()) {
      ASSERT_TRUE(piece.grad.is_cuda()) << piece.name;
      const auto& full = want.at(piece.name);
      const std::vector<float> part(full.begin() + piece.begin, full.begin() + piece.begin + piece.grad.numel());
      expect_close(piece.grad.to_vector(), part, piece.name + " step " + std::to_string(step));
      covered += piece.grad.numel();
    }
    EXPECT_EQ(covered, m.num_parameters());  // one rank owns everything
    const double norm = zero.grad_norm();
    EXPECT_NEAR(norm, std::sqrt(want_sq), 1e-4 * std::sqrt(want_sq));
    zero.clip_grad_norm(0.5 * norm, norm);  // halves the shard
    for (const auto& piece : ddp.shard_pieces()) {
      const auto& full = want.at(piece.name);
      std::vector<float> half(full.begin() + piece.begin, full.begin() + piece.begin + piece.grad.numel());
      for (float& v : half) v *= static_cast<float>(0.5 * norm / (norm + 1e-6));
      expect_close(piece.grad.to_vector(), half, piece.name + " clipped");
    }
  }
  if (GetParam() == 2) {
    std::string pieces;  // what the shards hold, named in a failure
    for (const auto& piece : ddp.shard_pieces())
      pieces += " " + piece.name + "[" + std::to_string(piece.begin) + "+" + std::to_string(piece.grad.numel()) + "]";
    EXPECT_EQ(ddp.gradient_bytes(), m.num_parameters() * 4)
        << "only the shard is held (a released bucket counts nothing); pieces:" << pieces;
  }
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroGpu, ::testing::Values(1, 2));

TEST(DdpGpuRefuses, ParametersOnTwoDevices) {
  PT_REQUIRE_GPU();
  Mlp m(kGpu), mixed(kCpu);
  class Two : public nn::Module {
   public:
    Two(const Tensor& a, const Tensor& b) {
      register_parameter("gpu", a);
      register_parameter("cpu", b);
    }
  } two(m.w1, mixed.b2);
  try {
    DistributedDataParallel ddp(two, one_rank_nccl());
    FAIL() << "no error";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("gpu is on cuda:0"), std::string::npos) << what;
    EXPECT_NE(what.find("cpu on cpu"), std::string::npos) << what;
  }
}

// PowerSGD on a GPU bucket (factors, error feedback and warm start on the device, the
// Gram-Schmidt a device kernel) against the same GradCompressor on the CPU, each over a
// one-rank group (a one-rank sum is the identity, so the factor arithmetic is what is
// compared; DDP itself compresses only when ranks communicate). The bucket holds the MLP's
// fc1 gradient, 16 x 24 of rank 8 (8 rows of input), then its bias: step 0 is uncompressed
// and leaves the bucket as it was, then four compressed steps whose error feedback carries
// over, within the f32 GEMM tolerance. Rank-2 factors of a rank-8 matrix are lossy: the
// reduced gradient is not the plain one.
TEST(DdpGpu, PowerSgdFollowsTheCpuStepByStep) {
  PT_REQUIRE_GPU();
  CompressOptions o;
  o.kind = CompressKind::PowerSGD;
  o.powersgd_rank = 2;
  o.powersgd_start_iter = 1;
  o.seed = 5;
  comm::ProcessGroupOptions host;
  host.backend = "shm";
  host.timeout_s = 60;
  GradCompressor on_gpu(o, one_rank_nccl(), 60);
  GradCompressor on_cpu(o, comm::create_process_group(std::make_shared<comm::HashStore>(), 0, 1, host), 60);
  const auto plain = cpu_gradients(2);
  std::vector<float> grads = plain.at("fc1.weight");
  const int64_t n_weight = static_cast<int64_t>(grads.size()), n_bias = Mlp::kHidden;
  grads.insert(grads.end(), plain.at("fc1.bias").begin(), plain.at("fc1.bias").end());
  auto slots_of = [&](Tensor& flat) {
    return std::vector<GradSlot>{{0, flat.narrow(0, 0, n_weight).view({Mlp::kIn, Mlp::kHidden})},
                                 {1, flat.narrow(0, n_weight, n_bias)}};
  };
  for (int step = 0; step < 5; ++step) {
    Tensor gpu_flat = Tensor::from_vector(grads, {n_weight + n_bias}).to(kGpu);
    Tensor cpu_flat = Tensor::from_vector(grads, {n_weight + n_bias});
    on_gpu.launch(gpu_flat, slots_of(gpu_flat));
    on_gpu.finish();
    on_cpu.launch(cpu_flat, slots_of(cpu_flat));
    on_cpu.finish();
    ASSERT_TRUE(gpu_flat.is_cuda());
    const std::vector<float> got = gpu_flat.to_vector(), want = cpu_flat.to_vector();
    expect_close(got, want, "bucket step " + std::to_string(step));
    double diff = 0;
    for (int64_t i = 0; i < n_weight; ++i) diff = std::max(diff, std::fabs(double(want[i]) - grads[i]));
    if (step == 0) EXPECT_EQ(diff, 0.0) << "the first step is uncompressed";
    if (step > 0) EXPECT_GT(diff, 1e-4) << "a rank-2 approximation of a rank-8 gradient, step " << step;
    EXPECT_EQ(got[n_weight], grads[n_weight]) << "a bias travels uncompressed, step " << step;
  }
}

// The fp16/bf16 compressor on a GPU bucket over a one-rank nccl group: the bucket comes back
// as the gradient rounded once to the 16-bit type (scale by 1/1, cast, sum of one, cast back),
// bit for bit the host rounding of the same values (the casts are bit-exact).
TEST(GradCompressorGpu, Cast16BucketsRoundOnceOnTheDevice) {
  PT_REQUIRE_GPU();
  for (CompressKind kind : {CompressKind::BF16, CompressKind::F16}) {
    CompressOptions co;
    co.kind = kind;
    GradCompressor gc(co, one_rank_nccl(), 60);
    std::vector<float> host(1001);
    for (size_t i = 0; i < host.size(); ++i) host[i] = std::sin(0.37f * static_cast<float>(i)) * 3.0f + 1e-3f;
    for (int step = 0; step < 2; ++step) {  // the second step reuses the device half buffer
      Tensor bucket = Tensor::from_vector(host, {1001}).to(kGpu);
      gc.launch(bucket, {{0, bucket.narrow(0, 0, 1001)}});
      gc.finish();
      ASSERT_TRUE(bucket.is_cuda());
      const std::vector<float> got = bucket.to_vector();
      for (size_t i = 0; i < host.size(); ++i) {
        const float want = kind == CompressKind::BF16 ? bf16_to_f32(f32_to_bf16(host[i]))
                                                      : f16_to_f32(f32_to_f16(host[i]));
        ASSERT_EQ(got[i], want) << (kind == CompressKind::BF16 ? "bf16" : "fp16") << " element " << i;
      }
      EXPECT_EQ(gc.bytes_sent(), 2 * 1001);
    }
  }
}

}  // namespace
}  // namespace paratrain::parallel
