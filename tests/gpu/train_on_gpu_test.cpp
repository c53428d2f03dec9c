// Training a GPT on one GPU through the autograd ops, the nn layers and AdamW: two copies of
// a gpt-nano-sized model built from one seed, one moved to cuda:0 with Module::to, run
// forward + loss, backward and AdamW steps side by side; the loss, every gradient and every
// updated parameter of the GPU copy are compared against the CPU copy, and every gradient and
// optimizer state tensor must be on cuda:0.
//
// Tolerances (f32), per element, M = max |want| over the tensor:
//   loss:       |got - want| <= 1e-4 |want|
//   gradients:  |got - want| <= 1e-4 |want| + 1e-5 M
//   parameters: |got - want| <= 1e-5 |want| + 5e-6   (5e-6: 0.5% of an update's largest size, lr)
// Everything is f32 on both sides (the GPU's GEMMs use exact f32 compute, no TF32), so the
// copies differ only by summation order: cuBLASLt's and oneDNN's blocking of the K sums,
// attention's tiles, LayerNorm's and the embedding backward's f32 atomics. Each such sum
// differs by a few ulps (2^-23 ~ 1.2e-7) of the magnitudes summed, which scale with the
// tensor's largest values rather than with the element: hence the M term, and 1e-4 relative
// leaves a factor of ~100 over sums of a few hundred terms and two steps of drift.
// The optimizer uses eps = 1e-3 (not torch's 1e-8) so that AdamW's update is a Lipschitz
// function of the gradient (slope <= lr / eps = 1): with eps = 1e-8, a gradient within
// rounding of zero may change sign between two correct summation orders and flip its
// parameter's update by 2 lr; with 1e-3 an update is off by at most the gradient's error,
// a few ulps of the largest gradient (~1e-6 for gradients up to 1).
//
// The CNN classifier (conv, ReLU, max-pool twice, two linear layers) is compared the same way
// after one step. Its max-pools are discrete: a pool window whose two largest values are
// within rounding of each other could pick different inputs on the two sides and route a
// gradient elsewhere. So the images are on a 1/8 grid and the convolutions' weights and
// biases on 2^-6 (conv1) and 2^-7 (conv2) grids: every product and partial sum of the two
// convolutions is then exact in f32 (at most ~21 significant bits), in any summation order,
// so both sides pool identical values (ties resolve alike) and only the linear layers and
// the gradient sums differ by rounding. Under bf16 autocast those values are exact in bf16
// too.
//
// bf16 autocast: the GEMMs and attention run in bf16 on both sides, each product rounded to
// bf16 (2^-8 relative) after f32 accumulation, so a different summation order flips
// roundings; the comparison is per tensor, ||got - want|| <= 3e-2 ||want|| (L2), and the loss
// within 1e-2 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/kernels/dispatch.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/nn/classifiers.h"
#include "paratrain/nn/generate.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/tensor/random.h"

namespace paratrain {
namespace {

const DeviceSpec kGpu0{Device::CUDA, 0};

nn::GPTConfig test_config() {
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-nano");  // 2 layers, 2 heads, C 64, T 64, V 256
  cfg.dropout = 0.0f;  // a GPU draws other masks than the CPU (DropoutOnTheGpu below)
  return cfg;
}

// (B,T) token ids and their next-token targets, fixed seed.
std::pair<Tensor, Tensor> batch(const nn::GPTConfig& cfg, int64_t B, int64_t T) {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int32_t> id(0, static_cast<int32_t>(cfg.vocab_size) - 1);
  std::vector<int32_t> x(static_cast<size_t>(B * T)), y(x.size());
  for (auto& v : x) v = id(rng);
  for (auto& v : y) v = id(rng);
  return {Tensor::from_vector_i32(x, {B, T}), Tensor::from_vector_i32(y, {B, T})};
}

bool on_gpu0(const Tensor& t) { return t.defined() && t.is_cuda() && t.device_index() == 0; }

// Per-element check with the tolerance of the header; reports the worst element.
void expect_close(const std::string& what, const Tensor& got_t, const Tensor& want_t, double rtol, double atol_frac,
                  double atol) {
  ASSERT_EQ(got_t.shape(), want_t.shape()) << what;
  const std::vector<float> got = got_t.to_vector(), want = want_t.to_vector();
  double m = 0;
  for (float w : want) m = std::max(m, std::fabs(static_cast<double>(w)));
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double tol = rtol * std::fabs(static_cast<double>(want[i])) + atol_frac * m + atol;
    if (!(d <= tol)) ++bad;
    if (!(d - tol <= worst_excess)) worst_excess = d - tol, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off (max |want| " << m
                     << "); worst at " << worst << ": got " << got[worst] << ", want " << want[worst];
}

// ||got - want|| <= rel ||want||, L2 over the tensor.
void expect_close_l2(const std::string& what, const Tensor& got_t, const Tensor& want_t, double rel) {
  ASSERT_EQ(got_t.shape(), want_t.shape()) << what;
  const std::vector<float> got = got_t.to_vector(), want = want_t.to_vector();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    diff += d * d;
    norm += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LE(std::sqrt(diff), rel * std::sqrt(norm)) << what << ": ||got - want|| " << std::sqrt(diff)
                                                    << ", ||want|| " << std::sqrt(norm);
}

TEST(TrainOnGpu, GptF32ForwardBackwardAndAdamWMatchTheCpu) {
  PT_REQUIRE_GPU();
  const nn::GPTConfig cfg = test_config();
  nn::GPT cpu_model(cfg, 7), gpu_model(cfg, 7);
  gpu_model.load_state_dict(cpu_model.state_dict());  // the same values, whatever the init does
  const auto before = gpu_model.named_parameters();
  gpu_model.to(kGpu0);
  const auto cpu_params = cpu_model.named_parameters(), gpu_params = gpu_model.named_parameters();
  ASSERT_EQ(gpu_params.size(), cpu_params.size());
  for (size_t i = 0; i < gpu_params.size(); ++i) {
    ASSERT_TRUE(on_gpu0(gpu_params[i].second)) << gpu_params[i].first << " " << gpu_params[i].second.to_string();
    EXPECT_TRUE(gpu_params[i].second.shares_storage(before[i].second)) << gpu_params[i].first;  // same tensor
    EXPECT_TRUE(gpu_params[i].second.requires_grad()) << gpu_params[i].first;
    EXPECT_EQ(gpu_params[i].second.to_vector(), cpu_params[i].second.to_vector()) << gpu_params[i].first;
  }
  EXPECT_TRUE(on_gpu0(gpu_model.wte->weight));  // the layers' own handles moved too
  EXPECT_TRUE(on_gpu0(gpu_model.h[1]->mlp->c_fc->weight));

  auto [tokens, targets] = batch(cfg, 2, 32);
  const Tensor gpu_tokens = tokens.to(kGpu0), gpu_targets = targets.to(kGpu0);

  // Inputs left on the host are refused with the op and both devices named.
  try {
    gpu_model.loss(tokens, targets);
    ADD_FAILURE() << "a model on cuda:0 accepted tokens on the cpu";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is on cuda:0 but tokens is on cpu"), std::string::npos) << e.what();
  }

  optim::AdamWOptions opts;
  opts.lr = 1e-3;
  opts.eps = 1e-3;  // see the header
  opts.weight_decay = 0.1;
  optim::AdamW cpu_opt(cpu_params, opts), gpu_opt(gpu_params, opts);
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    cpu_model.zero_grad();
    gpu_model.zero_grad();
    Tensor cpu_loss = cpu_model.loss(tokens, targets);
    Tensor gpu_loss = gpu_model.loss(gpu_tokens, gpu_targets);
    const double want = cpu_loss.item(), got = gpu_loss.item();
    EXPECT_NEAR(got, want, 1e-4 * std::fabs(want));
    autograd::backward(cpu_loss);
    autograd::backward(gpu_loss);
    for (size_t i = 0; i < gpu_params.size(); ++i) {
      const Tensor g = gpu_params[i].second.grad();
      ASSERT_TRUE(on_gpu0(g)) << gpu_params[i].first << " grad " << (g.defined() ? g.to_string() : "undefined");
      EXPECT_EQ(g.dtype(), DType::F32);
      expect_close(gpu_params[i].first + " grad", g, cpu_params[i].second.grad(), 1e-4, 1e-5, 0.0);
    }
    cpu_opt.step();
    gpu_opt.step();
    for (size_t i = 0; i < gpu_params.size(); ++i) {
      ASSERT_TRUE(on_gpu0(gpu_params[i].second)) << gpu_params[i].first;
      expect_close(gpu_params[i].first, gpu_params[i].second, cpu_params[i].second, 1e-5, 0.0, 5e-6);
    }
  }
  const auto state = gpu_opt.state_dict();
  EXPECT_EQ(state.size(), 2 * gpu_params.size());
  for (const auto& [name, t] : state) EXPECT_TRUE(on_gpu0(t)) << name << " " << t.to_string();
  const auto cpu_state = cpu_opt.state_dict();
  for (const auto& [name, t] : state) expect_close(name, t, cpu_state.at(name), 1e-4, 1e-5, 0.0);

  // Generation with the model on the GPU: greedy picks equal the CPU's.
  nn::GenerateOptions gen;
  gen.temperature = 0;
  gen.max_new_tokens = 4;
  EXPECT_EQ(nn::generate(gpu_model, {1, 2, 3}, gen), nn::generate(cpu_model, {1, 2, 3}, gen));
}

TEST(TrainOnGpu, OpsRefuseInputsOnTwoDevicesNamingBoth) {
  PT_REQUIRE_GPU();
  Tensor x = Tensor::full({4, 8}, 0.5), w = Tensor::full({3, 8}, 0.25, DType::F32, kGpu0);
  try {
    ops::linear(x, w, Tensor(), false);
    ADD_FAILURE() << "linear accepted an input on the cpu and a weight on cuda:0";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("linear: input is on cpu but weight is on cuda:0"), std::string::npos)
        << e.what();
  }
  // The same op on one device allocates its output there.
  Tensor y = ops::linear(x.to(kGpu0), w, Tensor(), false);
  EXPECT_TRUE(on_gpu0(y));
  EXPECT_EQ(y.to_vector(), std::vector<float>(12, 1.0f));  // 8 * 0.5 * 0.25, exact in f32
  // A CPU-only kernel says so by name and device.
  try {
    kernels::kernel(&kernels::Registry::softmax_row_max, Tensor::zeros({1, 4}, DType::F32, kGpu0));
    ADD_FAILURE() << "softmax_row_max has a kernel on cuda:0";
  } catch (const kernels::NoKernelError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax_row_max"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cuda"), std::string::npos) << e.what();
  }
}

// Dropout on a GPU: the mask is drawn there from one 64-bit key of the generator (the
// counter-based dropout_mask), so the output is x * mask * 1/(1-p) with the mask the CPU twin
// of the kernel computes from the same key, bit for bit; the generator moved by one draw; the
// backward uses the same mask; about 1-p of the elements are kept.
TEST(TrainOnGpu, DropoutOnTheGpuDrawsItsMaskThereFromOneKey) {
  PT_REQUIRE_GPU();
  const int64_t n = 100003;
  const float p = 0.1f;
  std::vector<float> xs(n);
  for (int64_t i = 0; i < n; ++i) xs[i] = 0.5f + static_cast<float>(i % 97) * 0.01f;
  Tensor x = Tensor::from_vector(xs, {n}).to(kGpu0).detach();
  x.set_requires_grad(true);
  Generator gen(5), twin(5);
  Tensor y = ops::dropout(x, p, true, gen);
  const uint64_t key = twin.next_u64();
  EXPECT_EQ(gen.next_u64(), twin.next_u64()) << "the op takes exactly one draw";
  std::vector<uint8_t> mask(n);
  kernels::registry().dropout_mask.at(Device::CPU, DType::U8)(mask.data(), key, p, n);
  const float s = 1.0f / (1.0f - p);
  const std::vector<float> got = y.to_vector();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(got[i], xs[i] * static_cast<float>(mask[i]) * s) << "element " << i;
    kept += mask[i];
  }
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.005);  // ~5 sigma at n = 1e5
  autograd::backward(ops::sum(y));
  const std::vector<float> dx = x.grad().to_vector();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(dx[i], static_cast<float>(mask[i]) * s) << "gradient " << i;
}

// A GPT built from `seed` on the CPU and on cuda:0, one forward + loss + backward each under
// autocast in `dtype` (F32: off); the loss and every gradient compared: bf16 by the L2
// tolerance (loss 1e-2), f32 per element (loss 1e-4); every gradient f32 on cuda:0. Returns
// how many half copies of weights the GPU side's autocast made.
size_t expect_gpt_gradients_match_cpu(const nn::GPTConfig& cfg, uint64_t seed, DType dtype) {
  const bool half = dtype != DType::F32;
  nn::GPT cpu_model(cfg, seed), gpu_model(cfg, seed);
  gpu_model.load_state_dict(cpu_model.state_dict());
  gpu_model.to(kGpu0);
  auto [tokens, targets] = batch(cfg, 2, 32);
  autograd::WeightCastCache cpu_cache, gpu_cache;
  Tensor cpu_loss, gpu_loss;
  {
    autograd::AutocastGuard cast(dtype, &cpu_cache);
    cpu_loss = cpu_model.loss(tokens, targets);
  }
  {
    autograd::AutocastGuard cast(dtype, &gpu_cache);
    gpu_loss = gpu_model.loss(tokens.to(kGpu0), targets.to(kGpu0));
  }
  EXPECT_NEAR(gpu_loss.item(), cpu_loss.item(), (half ? 1e-2 : 1e-4) * std::fabs(cpu_loss.item()));
  autograd::backward(cpu_loss);
  autograd::backward(gpu_loss);
  const auto cpu_params = cpu_model.named_parameters(), gpu_params = gpu_model.named_parameters();
  for (size_t i = 0; i < gpu_params.size(); ++i) {
    const Tensor g = gpu_params[i].second.grad();
    EXPECT_TRUE(on_gpu0(g)) << gpu_params[i].first;
    if (!on_gpu0(g)) continue;
    EXPECT_EQ(g.dtype(), DType::F32) << gpu_params[i].first;  // master weights' gradients stay f32
    if (half)
      expect_close_l2(gpu_params[i].first + " grad", g, cpu_params[i].second.grad(), 3e-2);
    else
      expect_close(gpu_params[i].first + " grad", g, cpu_params[i].second.grad(), 1e-4, 1e-5, 0.0);
  }
  return gpu_cache.size();
}

TEST(TrainOnGpu, GptBf16AutocastForwardBackwardMatchesTheCpu) {
  PT_REQUIRE_GPU();
  EXPECT_GT(expect_gpt_gradients_match_cpu(test_config(), 11, DType::BF16), 0u);  // the bf16 copies, on the GPU
}

// The tied head with a vocabulary whose rows are not 16-byte aligned (GPT-2's 50257 is odd;
// here 1001): linear_cross_entropy's logits rows are logits_row_stride(V) = 1024 apart on
// both sides, the CUDA GEMMs and cross-entropy kernels read and write them with that stride.
TEST(TrainOnGpu, GptWithAnUnalignedVocabularyMatchesTheCpu) {
  PT_REQUIRE_GPU();
  nn::GPTConfig cfg = test_config();
  cfg.vocab_size = 1001;
  ASSERT_EQ(ops::logits_row_stride(cfg.vocab_size), 1024);
  for (DType dtype : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    expect_gpt_gradients_match_cpu(cfg, 13, dtype);
  }
}

// A CNN pair built from one seed, the convolutions' parameters on the grids of the header
// (so that both sides' convolutions are exact), the GPU one moved to cuda:0.
struct CnnPair {
  nn::CNNClassifier cpu{5}, gpu{5};
  CnnPair() {
    autograd::NoGradGuard ng;
    auto snap = [](nn::Conv2d& conv, float grid) {
      for (Tensor* p : {&conv.weight, &conv.bias}) {
        std::vector<float> v = p->to_vector();
        for (float& x : v) x = std::nearbyint(x * grid) / grid;
        p->copy_(Tensor::from_vector(v, p->shape()));
      }
    };
    snap(*cpu.conv1, 64.0f);
    snap(*cpu.conv2, 128.0f);
    gpu.load_state_dict(cpu.state_dict());
    gpu.to(kGpu0);
  }
};

// (N,1,28,28) images on a 1/8 grid in [-1, 2] and labels 0..9, fixed seed.
std::pair<Tensor, Tensor> image_batch(int64_t N) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> level(-8, 16), label(0, 9);
  std::vector<float> x(static_cast<size_t>(N * 28 * 28));
  std::vector<int32_t> y(static_cast<size_t>(N));
  for (auto& v : x) v = static_cast<float>(level(rng)) / 8.0f;
  for (auto& v : y) v = label(rng);
  return {Tensor::from_vector(x, {N, 1, 28, 28}), Tensor::from_vector_i32(y, {N})};
}

TEST(TrainOnGpu, CnnF32ForwardBackwardAndAdamWMatchTheCpu) {
  PT_REQUIRE_GPU();
  CnnPair m;
  ASSERT_TRUE(on_gpu0(m.gpu.conv1->weight));
  ASSERT_TRUE(on_gpu0(m.gpu.fc2->bias));
  auto [images, labels] = image_batch(6);
  const auto cpu_params = m.cpu.named_parameters(), gpu_params = m.gpu.named_parameters();
  optim::AdamWOptions opts;
  opts.lr = 1e-3;
  opts.eps = 1e-3;  // see the header
  opts.weight_decay = 0.1;
  optim::AdamW cpu_opt(cpu_params, opts), gpu_opt(gpu_params, opts);
  Tensor cpu_loss = m.cpu.loss(images, labels);
  Tensor gpu_loss = m.gpu.loss(images.to(kGpu0), labels.to(kGpu0));
  ASSERT_TRUE(on_gpu0(gpu_loss));
  EXPECT_NEAR(gpu_loss.item(), cpu_loss.item(), 1e-4 * std::fabs(cpu_loss.item()));
  // The logits too (the accuracy evaluation reads them).
  {
    autograd::NoGradGuard ng;
    expect_close("logits", m.gpu.forward(images.to(kGpu0)), m.cpu.forward(images), 1e-4, 1e-5, 0.0);
  }
  autograd::backward(cpu_loss);
  autograd::backward(gpu_loss);
  ASSERT_EQ(gpu_params.size(), 8u);  // conv1, conv2, fc1, fc2: weight and bias each
  for (size_t i = 0; i < gpu_params.size(); ++i) {
    const Tensor g = gpu_params[i].second.grad();
    ASSERT_TRUE(on_gpu0(g)) << gpu_params[i].first << " grad " << (g.defined() ? g.to_string() : "undefined");
    expect_close(gpu_params[i].first + " grad", g, cpu_params[i].second.grad(), 1e-4, 1e-5, 0.0);
  }
  cpu_opt.step();
  gpu_opt.step();
  for (size_t i = 0; i < gpu_params.size(); ++i)
    expect_close(gpu_params[i].first, gpu_params[i].second, cpu_params[i].second, 1e-5, 0.0, 5e-6);
}

TEST(TrainOnGpu, CnnBf16AutocastForwardBackwardMatchesTheCpu) {
  PT_REQUIRE_GPU();
  CnnPair m;
  auto [images, labels] = image_batch(6);
  autograd::WeightCastCache cpu_cache, gpu_cache;
  Tensor cpu_loss, gpu_loss;
  {
    autograd::AutocastGuard cast(DType::BF16, &cpu_cache);
    cpu_loss = m.cpu.loss(images, labels);
  }
  {
    autograd::AutocastGuard cast(DType::BF16, &gpu_cache);
    gpu_loss = m.gpu.loss(images.to(kGpu0), labels.to(kGpu0));
  }
  EXPECT_NEAR(gpu_loss.item(), cpu_loss.item(), 1e-2 * std::fabs(cpu_loss.item()));
  autograd::backward(cpu_loss);
  autograd::backward(gpu_loss);
  const auto cpu_params = m.cpu.named_parameters(), gpu_params = m.gpu.named_parameters();
  for (size_t i = 0; i < gpu_params.size(); ++i) {
    const Tensor g = gpu_params[i].second.grad();
    ASSERT_TRUE(on_gpu0(g)) << gpu_params[i].first;
    EXPECT_EQ(g.dtype(), DType::F32) << gpu_params[i].first;
    expect_close_l2(gpu_params[i].first + " grad", g, cpu_params[i].second.grad(), 3e-2);
  }
  EXPECT_GT(gpu_cache.size(), 0u);
}

}  // namespace
}  // namespace paratrain
