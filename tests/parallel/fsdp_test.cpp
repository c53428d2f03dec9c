// ZeRO stage 3 (parallel/fsdp.h) against plain data parallelism (DDP + the same optimizer):
// one thread per rank (shm groups over a HashStore) on 2, 3 and 4 ranks, the tiny GPT's
// blocks as units (padded last blocks, parameters across block borders). SGD to 1e-6
// relative; AdamW with accumulation and active clipping bit for bit in deterministic mode;
// with and without reshard-after-forward and prefetch; memory per rank at 1/W; the whole
// model back from the shards; misuse as InputError.
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/fsdp.h"
#include "paratrain/parallel/zero.h"
#include "parallel/ddp_test_util.h"
#include "support/weights_compare.h"

using namespace paratrain;
using namespace paratrain::parallel;

namespace {

using paratrain::test::bit_identical;
using paratrain::test::max_rel_diff;
using paratrain::test::Weights;
using paratrain::testing::make_rows;
using paratrain::testing::run_ranks;
using paratrain::testing::tiny_gpt;

struct Spec {
  bool fsdp = false;
  int64_t accum = 1;
  int steps = 5;
  bool deterministic = false;
  bool adamw = false;
  double clip = 0.5;  // active: the tiny GPT's gradient norm starts above 1
  FsdpOptions fsdp_options;
};

struct Outcome {
  Weights weights;
  std::vector<double> norms;
  std::vector<float> losses;
  FsdpMemory memory;
  FsdpStepStats stats;
  ZeroMemory zero_memory;
  int64_t optimizer_unsharded_bytes = 0;
  Weights eval_full;  // FSDP: full_state() after training
};

std::unique_ptr<optim::Optimizer> make_optimizer(const optim::NamedParams& params, const Spec& s) {
  if (s.adamw) {
    optim::AdamWOptions ao;
    ao.lr = 3e-3, ao.beta2 = 0.95, ao.weight_decay = 0.1;
    return std::make_unique<optim::AdamW>(params, ao);
  }
  optim::SGDOptions so;
  so.lr = 0.1, so.momentum = 0.9, so.weight_decay = 0.01, so.decay_2d_only = true;
  return std::make_unique<optim::SGD>(params, so);
}

// Rank r takes slice j = k*world + r at micro-step k (the data order of the trainer).
template <typename Wrapper>
void run_steps(Wrapper& w, nn::GPT& model, const std::shared_ptr<comm::ProcessGroup>& pg, const Spec& s,
               const std::function<void(Outcome&)>& step_fn, Outcome& out) {
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  const auto cfg = model.config();
  Tensor seed = Tensor::full({}, w.backward_seed(s.accum));
  for (int step = 0; step < s.steps; ++step) {
    w.zero_grad();
    for (int64_t k = 0; k < s.accum; ++k) {
      std::optional<typename Wrapper::NoSync> ns;
      if (k + 1 < s.accum) ns.emplace(w.no_sync());
      Tensor x, y;
      make_rows(step, (k * world + rank) * 2, 2, cfg.block_size, cfg.vocab_size, x, y);
      Tensor loss = model.loss(x, y);
      out.losses.push_back(static_cast<float>(loss.item()));
      autograd::backward(loss, seed);
    }
    w.finish();
    step_fn(out);
  }
}

Outcome train_tiny(const std::shared_ptr<comm::ProcessGroup>& pg, const Spec& s) {
  const int rank = pg ? pg->rank() : 0;
  nn::GPT model(tiny_gpt(), 100 + static_cast<uint64_t>(rank));  // rank 0's values win
  Outcome out;
  if (!s.fsdp) {
    DdpOptions o;
    o.deterministic = s.deterministic;
    DistributedDataParallel ddp(model, pg, o);
    auto params = model.named_parameters();
    auto opt = make_optimizer(params, s);
    run_steps(ddp, model, pg, s, [&](Outcome& o) {
      const double norm = optim::grad_norm(params);
      optim::clip_grad_norm(params, s.clip, norm);
      opt->step();
      o.norms.push_back(norm);
    }, out);
    for (auto& [name, t] : params) out.weights[name] = t.to_vector();
    for (const auto& [k, t] : opt->state_dict()) out.optimizer_unsharded_bytes += static_cast<int64_t>(t.nbytes());
    return out;
  }
  FsdpOptions fo = s.fsdp_options;
  fo.deterministic = s.deterministic;
  std::vector<nn::Module*> units;
  for (auto& b : model.h) units.push_back(b.get());
  FullyShardedDataParallel fsdp(model, units, pg, fo);
  auto opt = make_optimizer(zero_pieces(fsdp), s);
  ZeroOptimizer zero(fsdp, *opt);
  run_steps(fsdp, model, pg, s, [&](Outcome& o) {
    const double norm = zero.grad_norm();
    zero.clip_grad_norm(s.clip, norm);
    zero.step();
    o.norms.push_back(norm);
    o.stats = fsdp.last_stats();
  }, out);
  out.memory = fsdp.memory();
  out.zero_memory = zero.memory();
  for (auto& [name, t] : fsdp.full_state()) out.weights[name] = t.to_vector();
  return out;
}

std::vector<Outcome> train_ranks(int n, const Spec& s) {
  std::vector<Outcome> got(n);
  auto errs = run_ranks(n, s.deterministic, [&](auto pg) { got[pg->rank()] = train_tiny(pg, s); });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errs[r], "") << "rank " << r;
  return got;
}

class FsdpEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(FsdpEquivalence, SgdWithClippingMatchesPlainDataParallel) {
  const int n = GetParam();
  Spec plain;
  Spec zero3 = plain;
  zero3.fsdp = true;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero3);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(ref[0].norms[0], plain.clip) << "clipping is not active";
  for (int r = 0; r < n; ++r) {
    std::string worst;
    EXPECT_LT(max_rel_diff(got[r].weights, ref[r].weights, &worst), 1e-6) << n << " ranks, rank " << r << ": " << worst;
    for (size_t i = 0; i < ref[r].norms.size(); ++i)
      EXPECT_NEAR(got[r].norms[i], ref[r].norms[i], 1e-6 * ref[r].norms[i]) << "grad norm at step " << i;
    for (size_t i = 0; i < ref[r].losses.size(); ++i) EXPECT_NEAR(got[r].losses[i], ref[r].losses[i], 1e-6) << i;
  }
}

TEST_P(FsdpEquivalence, DeterministicAdamWWithAccumulationAndClippingIsBitIdentical) {
  const int n = GetParam();
  Spec plain;
  plain.deterministic = true, plain.adamw = true, plain.accum = 2;
  Spec zero3 = plain;
  zero3.fsdp = true;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero3);
  ASSERT_FALSE(HasFailure());
  EXPECT_GT(ref[0].norms[0], plain.clip) << "clipping is not active";
  for (int r = 0; r < n; ++r) {
    std::string first;
    EXPECT_TRUE(bit_identical(got[r].weights, ref[r].weights, &first))
        << n << " ranks, rank " << r << " differs from plain DP at " << first << " (max rel "
        << max_rel_diff(got[r].weights, ref[r].weights) << ")";
    EXPECT_EQ(got[r].losses, ref[r].losses) << "rank " << r;
  }
}

TEST_P(FsdpEquivalence, ModelStateIsCutInWAndOnlyTheUnitsInFlightAreWhole) {
  const int n = GetParam();
  Spec plain;
  plain.adamw = true, plain.steps = 2;
  Spec zero3 = plain;
  zero3.fsdp = true;
  const auto ref = train_ranks(n, plain);
  const auto got = train_ranks(n, zero3);
  ASSERT_FALSE(HasFailure());
  int64_t params = 0, grads = 0, optim_bytes = 0;
  const int64_t units = 3;  // the tiny GPT's 2 blocks and the root
  for (int r = 0; r < n; ++r) {
    const FsdpMemory& m = got[r].memory;
    params += m.parameter_shard_bytes, grads += m.gradient_shard_bytes, optim_bytes += got[r].zero_memory.optimizer_bytes;
    // 1/W each, give or take the padding of each unit's last block (at most W-1 floats a unit).
    EXPECT_NEAR(static_cast<double>(m.parameter_shard_bytes * n) / static_cast<double>(m.parameter_bytes), 1.0, 0.02)
        << "rank " << r;
    EXPECT_EQ(m.gradient_shard_bytes, m.parameter_shard_bytes);
    EXPECT_EQ(m.gathered_bytes, 0) << "nothing stays gathered between steps";
    EXPECT_EQ(m.gradient_bytes, m.gradient_shard_bytes) << "no full gradient buffer stays between steps";
    // The root (embeddings, ln_f, tied head), the unit computing and the one prefetched.
    EXPECT_LE(got[r].stats.peak_gathered_units, 3);
    EXPECT_GE(got[r].stats.peak_gathered_units, 2);
    EXPECT_LT(got[r].stats.peak_gathered_bytes, m.parameter_bytes + n * 3 * 4);
    // Two gathers per block (forward, backward) and one of the root; one reduce-scatter each.
    EXPECT_EQ(got[r].stats.gathers, 2 * (units - 1) + 1);
    EXPECT_EQ(got[r].stats.reduce_scatters, units);
    EXPECT_GT(got[r].stats.gather_ms, 0.0);
    EXPECT_GT(got[r].stats.reduce_scatter_ms, 0.0);
    // Each unit's whole flat buffer is reduce-scattered once: the parameters plus at most
    // W-1 floats of padding per unit.
    EXPECT_GE(got[r].stats.reduce_scatter_bytes, m.parameter_bytes);
    EXPECT_LE(got[r].stats.reduce_scatter_bytes, m.parameter_bytes + units * (n - 1) * 4);
  }
  const double whole = static_cast<double>(got[0].memory.parameter_bytes);
  EXPECT_NEAR(static_cast<double>(params) / whole, 1.0, 0.02) << "the shards partition the parameters";
  EXPECT_NEAR(static_cast<double>(grads) / whole, 1.0, 0.02);
  EXPECT_EQ(optim_bytes, ref[0].optimizer_unsharded_bytes) << "the pieces partition the optimizer state exactly";
}

INSTANTIATE_TEST_SUITE_P(World, FsdpEquivalence, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return "w" + std::to_string(info.param); });

TEST(Fsdp, KeepingUnitsGatheredAndNoPrefetchChangeNothing) {
  Spec plain;
  plain.deterministic = true, plain.adamw = true, plain.accum = 2;
  const auto ref = train_ranks(2, plain);
  for (const auto& [reshard, prefetch] : std::vector<std::pair<bool, int>>{{false, 1}, {true, 0}, {true, 2}}) {
    Spec zero3 = plain;
    zero3.fsdp = true;
    zero3.fsdp_options.reshard_after_forward = reshard;
    zero3.fsdp_options.prefetch = prefetch;
    const auto got = train_ranks(2, zero3);
    ASSERT_FALSE(HasFailure());
    for (int r = 0; r < 2; ++r) {
      std::string first;
      EXPECT_TRUE(bit_identical(got[r].weights, ref[r].weights, &first))
          << "reshard " << reshard << " prefetch " << prefetch << ": rank " << r << " differs at " << first;
    }
    // Without resharding, every block stays gathered from its forward to its backward.
    if (!reshard) EXPECT_EQ(got[0].stats.peak_gathered_units, 3);
    if (!reshard) EXPECT_EQ(got[0].stats.gathers, 3 * plain.accum) << "one gather per unit and pass";
    if (prefetch == 0) EXPECT_LE(got[0].stats.peak_gathered_units, 2);
  }
}

TEST(Fsdp, SixteenBitCommunicationHalvesTheBytesAndStaysCloseToPlainDataParallel) {
  Spec plain;
  plain.adamw = true, plain.accum = 2;
  Spec f32 = plain;
  f32.fsdp = true;
  const auto ref = train_ranks(2, plain);
  const auto full = train_ranks(2, f32);
  for (DType dt : {DType::BF16, DType::F16}) {
    Spec half = f32;
    half.fsdp_options.comm_dtype = dt;
    const auto got = train_ranks(2, half);
    ASSERT_FALSE(HasFailure());
    EXPECT_EQ(got[0].stats.gather_bytes * 2, full[0].stats.gather_bytes) << dtype_name(dt);
    EXPECT_EQ(got[0].stats.reduce_scatter_bytes * 2, full[0].stats.reduce_scatter_bytes) << dtype_name(dt);
    // Rounded parameters and gradients: the same training to 16-bit precision, not bit for bit.
    // (Worst tensor, per tensor ||a-b||/||b||: the zero-initialised biases, whose whole value
    // is five Adam steps, move most.)
    const double rel = max_rel_diff(got[0].weights, ref[0].weights);
    std::printf("  comm %s: weights within %.2e of plain DP after %d AdamW steps\n", dtype_name(dt), rel, plain.steps);
    EXPECT_LT(rel, dt == DType::BF16 ? 6e-2 : 1e-2) << dtype_name(dt);
    EXPECT_GT(rel, 0.0) << dtype_name(dt) << ": the 16-bit path was not taken";
    for (size_t i = 0; i < ref[0].losses.size(); ++i)
      EXPECT_NEAR(got[0].losses[i], ref[0].losses[i], 1e-2 * ref[0].losses[i]) << dtype_name(dt) << " loss " << i;
    std::string first;
    EXPECT_TRUE(bit_identical(got[1].weights, got[0].weights, &first)) << "the ranks disagree at " << first;
  }
}

TEST(Fsdp, OneProcessIsBitIdenticalToNoSharding) {
  Spec plain;
  plain.adamw = true, plain.accum = 2;
  Spec zero3 = plain;
  zero3.fsdp = true;
  std::string first;
  EXPECT_TRUE(bit_identical(train_tiny(nullptr, zero3).weights, train_tiny(nullptr, plain).weights, &first))
      << "differs at " << first;
}

TEST(Fsdp, EvaluationWithoutGradientsGathersAndFreesEachUnit) {
  nn::GPT model(tiny_gpt(), 7);
  nn::GPT ref(tiny_gpt(), 7);
  std::vector<nn::Module*> units;
  for (auto& b : model.h) units.push_back(b.get());
  FullyShardedDataParallel fsdp(model, units, nullptr);
  Tensor x, y;
  make_rows(0, 0, 2, tiny_gpt().block_size, tiny_gpt().vocab_size, x, y);
  autograd::NoGradGuard ng;
  const float got = static_cast<float>(model.loss(x, y).item());
  EXPECT_EQ(got, static_cast<float>(ref.loss(x, y).item()));
  EXPECT_EQ(fsdp.memory().gathered_bytes, 0);
  // The pieces of one process are the whole parameters; load_full_state puts them back.
  auto whole = ref.state_dict();
  for (auto& [name, piece] : fsdp.parameter_pieces()) EXPECT_EQ(piece.numel(), whole.at(name).numel()) << name;
  std::map<std::string, Tensor> other;
  for (auto& [name, t] : whole) {
    std::vector<float> v = t.to_vector();
    for (float& f : v) f *= 0.5f;
    other[name] = Tensor::from_vector(v, t.shape());
  }
  fsdp.load_full_state(other);
  for (auto& [name, t] : fsdp.full_state()) EXPECT_EQ(t.to_vector(), other.at(name).to_vector()) << name;
  other.erase("wte.weight");
  EXPECT_THROW(fsdp.load_full_state(other), InputError);
}

TEST(Fsdp, MisuseIsAnInputError) {
  nn::GPT model(tiny_gpt(), 1), stranger(tiny_gpt(), 2);
  EXPECT_THROW(FullyShardedDataParallel(model, {stranger.h[0].get()}, nullptr), InputError);
  EXPECT_THROW(FullyShardedDataParallel(model, {model.h[0].get(), model.h[0].get()}, nullptr), InputError);
  EXPECT_THROW(FullyShardedDataParallel(model, {model.h[0]->ln_1.get()}, nullptr), InputError);  // runs no wrappers
  FsdpOptions bad;
  bad.prefetch = -1;
  EXPECT_THROW(FullyShardedDataParallel(model, {}, nullptr, bad), InputError);
  FsdpOptions half_deterministic;
  half_deterministic.comm_dtype = DType::BF16, half_deterministic.deterministic = true;
  EXPECT_THROW(FullyShardedDataParallel(model, {}, nullptr, half_deterministic), InputError);
  FsdpOptions int_comm;
  int_comm.comm_dtype = DType::I32;
  EXPECT_THROW(FullyShardedDataParallel(model, {}, nullptr, int_comm), InputError);
  // A step in which a unit got no gradient names the parameters.
  std::vector<nn::Module*> units;
  for (auto& b : model.h) units.push_back(b.get());
  FullyShardedDataParallel fsdp(model, units, nullptr);
  fsdp.zero_grad();
  EXPECT_THROW(fsdp.finish(), InputError);
}

}  // namespace
