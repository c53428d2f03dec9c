// DDP gradient compression (grad_compression.h, docs/ddp.md "Compression").
// Unit tests on ranks as threads (shm groups): fp16/bf16 give the mean gradient to 16-bit
// precision; PowerSGD reproduces an exactly rank-r mean gradient; error feedback keeps the
// sum of what was applied within a bounded distance of the sum of the true mean gradients
// (and without it the gap grows); every rank ends with the same gradient; the bytes are
// those of the formula. End to end: gpt-nano trained by `paratrain launch --nproc-per-node 2`
// with each compression reaches a validation loss close to the uncompressed run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "launch/launch_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/store.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/nn/gpt.h"
#include "parallel/ddp_test_util.h"
#include "paratrain/parallel/ddp.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using namespace paratrain::parallel;
namespace fs = std::filesystem;

namespace {

// Ranks as threads with plain (not deterministic) groups.
template <typename Fn>
std::vector<std::string> run_ranks(int n, Fn fn) {
  return paratrain::testing::run_ranks(n, false, fn);
}


void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  Generator g(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(g.normal()) * scale;
  return v;
}

double norm(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x * x;
  return std::sqrt(s);
}

// A bucket of tensors with these shapes laid out one after another in a flat buffer.
struct Bucket {
  Tensor flat;
  std::vector<GradSlot> slots;
  explicit Bucket(const std::vector<Shape>& shapes) {
    int64_t total = 0;
    for (const auto& s : shapes) total += numel_of(s);
    flat = Tensor::zeros({total});
    int64_t off = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const int64_t n = numel_of(shapes[i]);
      slots.push_back({static_cast<int>(i), flat.narrow(0, off, n).view(shapes[i])});
      off += n;
    }
  }
  static int64_t numel_of(const Shape& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
  void set(const std::vector<float>& v) { std::memcpy(flat.data_ptr(), v.data(), v.size() * 4); }
  std::vector<float> get() const { return flat.to_vector(); }
};

// ---------------------------------------------------------------------------------------

TEST(Compression, ParsingAndValidation) {
  EXPECT_EQ(parse_compress("none"), CompressKind::None);
  EXPECT_EQ(parse_compress("fp16"), CompressKind::F16);
  EXPECT_EQ(parse_compress("bf16"), CompressKind::BF16);
  EXPECT_EQ(parse_compress("powersgd"), CompressKind::PowerSGD);
  EXPECT_THROW(parse_compress("zip"), InputError);
  EXPECT_THROW(compress_options("powersgd", 0, 10), InputError);
  EXPECT_THROW(compress_options("powersgd", 2, -1), InputError);
  EXPECT_THROW(compress_options("fp16", 4, 10, 0, /*deterministic=*/true), InputError);
  EXPECT_NO_THROW(compress_options("none", 4, 10, 0, true));
  try {
    compress_options("bf16", 4, 10, 0, true);
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--deterministic"), std::string::npos) << e.what();
  }
}

TEST(Compression, BytesFormula) {
  // 64x192 and 64x64 shrink with r = 4 (r(n+m) = 1024 < 12288, 512 < 4096); a bias and a 3x2
  // matrix (4 x 5 = 20 >= 6) go as they are; a [8, 4, 4] tensor is viewed as 8 x 16.
  std::vector<Shape> shapes = {{64, 192}, {192}, {64, 64}, {3, 2}, {8, 4, 4}};
  CompressOptions o = compress_options("powersgd", 4, 0);
  auto b = compress_bytes(shapes, o);
  const int64_t elems = 64 * 192 + 192 + 64 * 64 + 6 + 128;
  EXPECT_EQ(b.uncompressed, 4 * elems);
  EXPECT_EQ(b.compressed, 4 * (4 * (64 + 192) + 192 + 4 * (64 + 64) + 6 + 4 * (8 + 16)));
  EXPECT_EQ(b.matrices, 3);
  EXPECT_EQ(b.tensors, 5);
  EXPECT_EQ(compress_bytes(shapes, compress_options("fp16", 4, 0)).compressed, 2 * elems);
  EXPECT_EQ(compress_bytes(shapes, compress_options("bf16", 4, 0)).compressed, 2 * elems);
  EXPECT_EQ(compress_bytes(shapes, compress_options("none", 4, 0)).compressed, 4 * elems);
  EXPECT_FALSE(powersgd_compresses({100}, 1));
  EXPECT_FALSE(powersgd_compresses({2, 2}, 1));   // 1 x 4 = 4, not < 4
  EXPECT_TRUE(powersgd_compresses({3, 3}, 1));    // 6 < 9
  EXPECT_FALSE(powersgd_compresses({3, 3}, 2));   // 12 >= 9
  const std::string line = compress_summary(shapes, o);
  EXPECT_EQ(line.rfind("compress powersgd rank 4: ", 0), 0u) << line;
  EXPECT_NE(line.find(" MiB -> "), std::string::npos) << line;
}

TEST(Compression, OrthogonalizeColumns) {
  const int64_t n = 50, r = 4;
  auto P = randn(n * r, 3);
  // Make column 2 nearly a copy of column 0 (Gram-Schmidt must still orthogonalise it).
  for (int64_t i = 0; i < n; ++i) P[i * r + 2] = P[i * r + 0] * 3.0f + 1e-4f * P[i * r + 1];
  orthogonalize_columns(P.data(), n, r);
  for (int64_t a = 0; a < r; ++a)
    for (int64_t b = 0; b < r; ++b) {
      double d = 0;
      for (int64_t i = 0; i < n; ++i) d += double(P[i * r + a]) * P[i * r + b];
      EXPECT_NEAR(d, a == b ? 1.0 : 0.0, 1e-5) << a << "," << b;
    }
  // A zero column (vanishing gradient) stays zero; the others are unit and orthogonal.
  std::vector<float> Z(n * 2, 0.0f);
  for (int64_t i = 0; i < n; ++i) Z[i * 2 + 1] = static_cast<float>(i % 5);
  orthogonalize_columns(Z.data(), n, 2);
  double n0 = 0, n1 = 0;
  for (int64_t i = 0; i < n; ++i) n0 += Z[i * 2] * Z[i * 2], n1 += Z[i * 2 + 1] * Z[i * 2 + 1];
  EXPECT_EQ(n0, 0.0);
  EXPECT_NEAR(n1, 1.0, 1e-6);
  // Through the dispatch table (what the compressor calls): the same function; a negative
  // size is an InputError naming the kernel.
  auto Q = randn(n * r, 3), Q2 = Q;
  orthogonalize_columns(Q.data(), n, r);
  kernels::registry().orthogonalize_columns.at(Device::CPU, DType::F32)(Q2.data(), n, r);
  EXPECT_EQ(Q, Q2);
  try {
    kernels::registry().orthogonalize_columns.at(Device::CPU, DType::F32)(Q2.data(), -1, r);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("orthogonalize_columns: negative size -1 x 4"), std::string::npos) << e.what();
  }
}

// fp16 and bf16: the mean over ranks to 16-bit precision, identical on every rank.
class CastCompression : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CastCompression, MeanTo16BitPrecision) {
  const auto [kind, world] = GetParam();
  const std::vector<Shape> shapes = {{40, 30}, {30}, {7}};
  const int64_t total = 40 * 30 + 30 + 7;
  std::vector<std::vector<float>> grads, out(world);
  for (int r = 0; r < world; ++r) {
    grads.push_back(randn(total, 100 + r, 1e-2f));
    grads.back()[5] = 3e-5f * (r + 1);  // small values keep their relative precision in fp16's normal range
  }
  std::vector<int64_t> bytes(world), bytes_f32(world);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    GradCompressor c(compress_options(kind, 1, 0), pg, 30);
    Bucket a({{40, 30}, {30}}), b(std::vector<Shape>{{7}});
    const int r = pg->rank();
    a.set(std::vector<float>(grads[r].begin(), grads[r].begin() + 40 * 30 + 30));
    b.set(std::vector<float>(grads[r].begin() + 40 * 30 + 30, grads[r].end()));
    c.launch(a.flat, a.slots);
    c.launch(b.flat, b.slots);
    c.finish();
    out[r] = a.get();
    auto vb = b.get();
    out[r].insert(out[r].end(), vb.begin(), vb.end());
    bytes[r] = c.bytes_sent(), bytes_f32[r] = c.bytes_uncompressed();
  }));
  // One rounding to 16 bits per rank's contribution, and one per add along the ring.
  const double unit = kind == "fp16" ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  for (int64_t i = 0; i < total; ++i) {
    double mean = 0, mag = 0;
    for (int r = 0; r < world; ++r) mean += grads[r][i] / world, mag += std::fabs(grads[r][i]) / world;
    ASSERT_NEAR(out[0][i], mean, world * unit * (mag + std::fabs(mean))) << kind << " element " << i;
  }
  double err = 0, ref = 0;
  for (int64_t i = 0; i < total; ++i) {
    double mean = 0;
    for (int r = 0; r < world; ++r) mean += grads[r][i] / world;
    err += (out[0][i] - mean) * (out[0][i] - mean), ref += mean * mean;
  }
  EXPECT_GT(std::sqrt(err / ref), 0.0) << "the values did travel as 16-bit";
  EXPECT_LT(std::sqrt(err / ref), 2 * unit);
  for (int r = 1; r < world; ++r) EXPECT_TRUE(out[r] == out[0]) << "rank " << r << " differs from rank 0";
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(bytes[r], 2 * total);
    EXPECT_EQ(bytes_f32[r], 4 * total);
  }
}

INSTANTIATE_TEST_SUITE_P(KindsAndWorlds, CastCompression,
                         ::testing::Combine(::testing::Values("fp16", "bf16"), ::testing::Values(2, 3)));

// PowerSGD on a mean gradient of rank exactly r reproduces it; 1-D tensors and matrices too
// small to shrink are averaged exactly; bytes are r(n+m) per matrix plus the rest.
TEST(PowerSgd, ExactlyRankRGradientIsReproduced) {
  const int world = 2;
  const int64_t n = 24, m = 40, r = 2;
  // Rank w's matrix: U V_w^T with U shared, so the mean U mean(V)^T has rank r.
  const auto U = randn(n * r, 7);
  std::vector<std::vector<float>> mats(world), bias(world), small(world);
  for (int w = 0; w < world; ++w) {
    auto V = randn(m * r, 20 + w);
    mats[w].assign(n * m, 0.0f);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        for (int64_t k = 0; k < r; ++k) mats[w][i * m + j] += U[i * r + k] * V[j * r + k];
    bias[w] = randn(m, 40 + w);
    small[w] = randn(6, 50 + w);
  }
  std::vector<std::vector<float>> out(world);
  std::vector<int64_t> bytes(world);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    const int w = pg->rank();
    GradCompressor c(compress_options("powersgd", r, 0), pg, 30);
    Bucket b({{n, m}, {m}, {3, 2}});
    for (int step = 0; step < 3; ++step) {  // the warm-started steps must stay exact (no residual)
      std::vector<float> v = mats[w];
      v.insert(v.end(), bias[w].begin(), bias[w].end());
      v.insert(v.end(), small[w].begin(), small[w].end());
      b.set(v);
      c.launch(b.flat, b.slots);
      c.finish();
    }
    out[w] = b.get();
    bytes[w] = c.bytes_sent();
  }));
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n * m; ++i) {
    const double mean = (double(mats[0][i]) + mats[1][i]) / 2;
    err += (out[0][i] - mean) * (out[0][i] - mean), ref += mean * mean;
  }
  EXPECT_LT(std::sqrt(err / ref), 1e-5) << "rank-" << r << " mean not reproduced";
  for (int64_t j = 0; j < m; ++j) EXPECT_FLOAT_EQ(out[0][n * m + j], (bias[0][j] + bias[1][j]) / 2);
  for (int64_t j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(out[0][n * m + m + j], (small[0][j] + small[1][j]) / 2);
  EXPECT_TRUE(out[1] == out[0]) << "ranks differ";
  EXPECT_EQ(bytes[0], 4 * (r * (n + m) + m + 6));
}

// Error feedback: the gradient has a fixed full-rank part G plus per-rank, per-step noise;
// rank 1 captures only part of it each step. The residual e keeps what was left out, so the
// sum of the applied approximations tracks the sum of the true mean gradients within a
// bounded gap (it equals the mean residual). Without error feedback the gap would grow by
// about ||G - rank-1 part|| every step; the first check makes sure it would be large here.
TEST(PowerSgd, ErrorFeedbackKeepsTheSumOfUpdatesOnTrack) {
  const int world = 2, steps = 60;
  const int64_t n = 16, m = 12, r = 1;
  const auto G = randn(n * m, 11);
  std::vector<std::vector<double>> gap_at(world);   // ||sum true - sum applied|| after each step
  std::vector<double> true_norm(world);
  std::vector<std::vector<float>> last(world);
  expect_no_errors(run_ranks(world, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    const int w = pg->rank();
    GradCompressor c(compress_options("powersgd", r, 0), pg, 30);
    Bucket b(std::vector<Shape>{{n, m}});
    std::vector<double> sum_true(n * m, 0.0), sum_applied(n * m, 0.0);
    for (int t = 0; t < steps; ++t) {
      std::vector<std::vector<float>> g(world);
      for (int v = 0; v < world; ++v) {
        g[v] = randn(n * m, 1000 + t * 10 + v, 0.3f);
        for (int64_t i = 0; i < n * m; ++i) g[v][i] += G[i];
      }
      for (int64_t i = 0; i < n * m; ++i) sum_true[i] += (double(g[0][i]) + g[1][i]) / 2;
      b.set(g[w]);
      c.launch(b.flat, b.slots);
      c.finish();
      auto a = b.get();
      std::vector<double> gap(n * m);
      for (int64_t i = 0; i < n * m; ++i) sum_applied[i] += a[i], gap[i] = sum_true[i] - sum_applied[i];
      gap_at[w].push_back(norm(gap));
      last[w] = a;
    }
    true_norm[w] = norm(sum_true);
  }));
  std::vector<double> g(G.begin(), G.end());
  const double gn = norm(g);
  // Rank 1 of a random 16 x 12 matrix leaves most of it out: without feedback the gap would
  // grow by about ||G - G_1|| (most of ||G||) every step.
  double max_early = 0, max_late = 0;  // the largest gap in the first and the second half
  for (int t = 0; t < steps; ++t) {
    double& mx = t < steps / 2 ? max_early : max_late;
    mx = std::max(mx, gap_at[0][t]);
  }
  EXPECT_GT(true_norm[0], 50 * gn);
  // Measured: the gap levels off at about 7 ||G|| after 20 steps (the residual holds the
  // directions rank 1 has not sent yet), while the true sum reaches about 60 ||G||.
  EXPECT_LT(gap_at[0].back(), 10 * gn) << "sum of applied updates drifted from the true sum";
  EXPECT_LT(gap_at[0].back(), 0.2 * true_norm[0]);
  EXPECT_LT(max_late, 1.25 * max_early) << "the gap keeps growing (a linear drift would double it)";
  EXPECT_TRUE(last[1] == last[0]) << "ranks differ";
  EXPECT_EQ(gap_at[1], gap_at[0]);
}

// Through DDP: every rank ends with the same gradient, close to the uncompressed mean for
// fp16/bf16, bytes as the formula; PowerSGD sends f32 for the first start_iter steps.
TEST(PowerSgd, ThroughDdpRanksAgreeAndBytesAreCounted) {
  nn::GPTConfig cfg{2, 2, 32, 16, 64, 0.0f};
  const int world = 2;
  // kind -> per rank: every gradient concatenated after step 0 (and, for PowerSGD, the last step)
  std::map<std::string, std::vector<std::vector<float>>> grads;
  std::map<std::string, std::vector<int64_t>> bytes;  // kind -> per step (rank 0)
  std::map<std::string, int64_t> f32_bytes;
  auto all_grads = [](const nn::Module& model) {
    std::vector<float> all;
    for (auto& [name, t] : model.named_parameters()) {
      auto v = t.grad().to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  for (std::string kind : {"none", "fp16", "bf16", "powersgd"}) {
    auto& first = grads[kind];
    auto& last = grads[kind + "-last"];
    auto& step_bytes = bytes[kind];
    int64_t& f32_step = f32_bytes[kind];
    first.resize(world), last.resize(world);
    expect_no_errors(run_ranks(world, [&](std::shared_ptr<comm::ProcessGroup> pg) {
      nn::GPT model(cfg, 5);
      DdpOptions o;
      o.compress = compress_options(kind, 2, 2);
      o.first_bucket_bytes = 16 << 10;  // several buckets
      o.bucket_bytes = 32 << 10;
      DistributedDataParallel ddp(model, pg, o);
      for (int step = 0; step < 4; ++step) {
        ddp.zero_grad();
        // Two random sequences per rank and step.
        std::vector<int32_t> xs, ys;
        Generator g(77 + pg->rank() * 1000 + step);
        for (int row = 0; row < 2; ++row) {
          std::vector<int32_t> w(cfg.block_size + 1);
          for (auto& t : w) t = static_cast<int32_t>(g.below(64));
          xs.insert(xs.end(), w.begin(), w.end() - 1);
          ys.insert(ys.end(), w.begin() + 1, w.end());
        }
        Tensor x = Tensor::from_vector_i32(xs, {2, cfg.block_size}), y = Tensor::from_vector_i32(ys, {2, cfg.block_size});
        autograd::backward(model.loss(x, y), Tensor::full({}, 1.0f));
        ddp.finish();
        if (pg->rank() == 0) step_bytes.push_back(ddp.last_stats().bytes), f32_step = ddp.last_stats().bytes_uncompressed;
        if (step == 0) first[pg->rank()] = all_grads(model);
      }
      last[pg->rank()] = all_grads(model);  // PowerSGD: compressed steps (2 and 3)
    }));
  }
  nn::GPT shapes_model(cfg, 5);
  std::vector<Shape> shapes;
  for (auto& [name, t] : shapes_model.named_parameters()) shapes.push_back(t.shape());
  const int64_t f32 = compress_bytes(shapes, compress_options("none", 2, 2)).uncompressed;
  for (const auto& [kind, per_rank] : grads) EXPECT_TRUE(per_rank[1] == per_rank[0]) << kind << ": ranks differ";
  for (const auto& [kind, b] : bytes) {
    EXPECT_EQ(f32_bytes[kind], f32) << kind;
    const int64_t want = compress_bytes(shapes, compress_options(kind, 2, 2)).compressed;
    for (size_t s = 0; s < b.size(); ++s)
      EXPECT_EQ(b[s], kind == "powersgd" && s < 2 ? f32 : want) << kind << " step " << s;
  }
  EXPECT_LT(compress_bytes(shapes, compress_options("powersgd", 2, 2)).compressed, f32 / 3);
  // fp16/bf16 (step 0) against the uncompressed mean; PowerSGD's step 0 is the f32 all-reduce.
  auto rel = [&](const std::string& k) {
    double d = 0, n = 0;
    for (size_t i = 0; i < grads["none"][0].size(); ++i) {
      const double a = grads[k][0][i], b = grads["none"][0][i];
      d += (a - b) * (a - b), n += b * b;
    }
    return std::sqrt(d / n);
  };
  EXPECT_LT(rel("fp16"), 1e-3);
  EXPECT_LT(rel("bf16"), 8e-3);
  EXPECT_LT(rel("powersgd"), 1e-6);
}

TEST(PowerSgd, DdpRejectsCompressionWithDeterministicOrZero) {
  nn::GPT model(nn::GPTConfig{1, 1, 8, 8, 16, 0.0f}, 1);
  DdpOptions o;
  o.deterministic = true;
  o.compress.kind = CompressKind::PowerSGD;
  EXPECT_THROW(DistributedDataParallel(model, nullptr, o), InputError);
  o.deterministic = false;
  o.zero_stage = 1;  // ZeRO reduce-scatters f32 shards: the two do not combine
  EXPECT_THROW(DistributedDataParallel(model, nullptr, o), InputError);
}

// ---------------------------------------------------------------------------------------
// End to end: `paratrain launch --nproc-per-node 2 -- paratrain train --compress X`.

class CompressTrain : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("paratrain_compress_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A noisy bigram language over 64 tokens: the next token is perm[current] with probability
    // 0.75, else uniform. Entropy floor about 1.6 nats, start ln 64 = 4.16.
    std::mt19937 gen(11);
    std::vector<int> perm(64);
    for (int i = 0; i < 64; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), gen);
    auto write = [&](const std::string& name, int32_t n) {
      std::vector<int32_t> header(256, 0);
      header[0] = 20240520, header[1] = 1, header[2] = n;
      std::vector<uint16_t> toks(n);
      int cur = 0;
      for (int32_t i = 0; i < n; ++i) {
        cur = (gen() % 4 != 0) ? perm[cur] : static_cast<int>(gen() % 64);
        toks[i] = static_cast<uint16_t>(cur);
      }
      std::ofstream f(dir_ + "/" + name, std::ios::binary);
      f.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
      f.write(reinterpret_cast<const char*>(toks.data()), n * 2);
    };
    write("train.bin", 60000);
    write("val.bin", 8000);
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  struct Run {
    launch::testing::RunResult res;
    double val_loss = -1, first_loss = -1;
    std::vector<nlohmann::json> steps;
  };
  static Run train(const std::string& compress) {
    const std::string metrics = dir_ + "/" + compress + ".jsonl";
    Run run;
    run.res = launch::testing::run(
        {PARATRAIN_BIN, "launch", "--nproc-per-node", "2", "--", PARATRAIN_BIN, "train", "--model", "gpt-nano",
         "--vocab-size", "64", "--block-size", "32", "--data", dir_ + "/train.bin", "--val-data", dir_ + "/val.bin",
         "--eval-batches", "25", "--micro-batch", "8", "--steps", std::to_string(kSteps), "--lr", "3e-3",
         "--warmup-steps", "10", "--quiet", "--threads", "1", "--compress", compress, "--metrics", metrics},
        120);
    std::ifstream f(metrics);
    for (std::string line; std::getline(f, line);) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("eval"))
        run.val_loss = j["val_loss"].get<double>();
      else
        run.steps.push_back(j);
    }
    if (!run.steps.empty()) run.first_loss = run.steps.front()["loss"].get<double>();
    return run;
  }
  static constexpr int kSteps = 150;
  static std::string dir_;
};
std::string CompressTrain::dir_;

TEST_F(CompressTrain, Fp16Bf16AndPowerSgdConvergeLikeUncompressed) {
  std::map<std::string, Run> runs;
  for (std::string kind : {"none", "fp16", "bf16", "powersgd"}) {
    runs[kind] = train(kind);
    const Run& r = runs[kind];
    ASSERT_EQ(r.res.status, 0) << kind << ":\n" << r.res.out << r.res.err;
    ASSERT_EQ(r.steps.size(), static_cast<size_t>(kSteps)) << kind;
    ASSERT_GT(r.val_loss, 0) << kind;
  }
  const double base = runs["none"].val_loss;
  // Learned: from ln 64 = 4.16 to well below it (the data's floor is about 1.6).
  EXPECT_GT(runs["none"].first_loss, 4.0);
  EXPECT_LT(base, 2.6) << "the uncompressed run did not learn, so the comparison means nothing";
  for (std::string kind : {"fp16", "bf16", "powersgd"}) {
    const Run& r = runs[kind];
    // fp16/bf16 only round the gradient (measured: the same loss to 4 digits). PowerSGD rank 4
    // changes the updates (measured +1.2%); rank 1 misses the bound (+8% on data of this kind).
    const double tol = kind == "powersgd" ? 0.05 : 0.01;
    EXPECT_LT(r.val_loss, base * (1 + tol)) << kind << " val loss " << r.val_loss << " vs uncompressed " << base;
    std::cerr << "[compress] " << kind << ": val_loss " << r.val_loss << " (uncompressed " << base << ")\n";
  }
  // The start-up line and the metrics' byte counts.
  const std::string psgd_log = runs["powersgd"].res.out + runs["powersgd"].res.err;
  const std::string fp16_log = runs["fp16"].res.out + runs["fp16"].res.err;
  EXPECT_NE(psgd_log.find("compress powersgd rank 4: "), std::string::npos) << psgd_log;
  EXPECT_NE(fp16_log.find("compress fp16: "), std::string::npos) << fp16_log;
  nn::GPTConfig g = nn::GPTConfig::preset("gpt-nano");
  g.vocab_size = 64, g.block_size = 32;
  nn::GPT model(g, 1);
  std::vector<Shape> shapes;
  for (auto& [name, t] : model.named_parameters()) shapes.push_back(t.shape());
  for (std::string kind : {"none", "fp16", "bf16", "powersgd"}) {
    const auto want = compress_bytes(shapes, compress_options(kind, 4, 10));
    const auto& steps = runs[kind].steps;
    for (int s = 0; s < kSteps; ++s) {
      ASSERT_EQ(steps[s]["comm_bytes_uncompressed"].get<int64_t>(), want.uncompressed) << kind << " step " << s;
      const int64_t expect = kind == "powersgd" && s < 10 ? want.uncompressed : want.compressed;
      ASSERT_EQ(steps[s]["comm_bytes"].get<int64_t>(), expect) << kind << " step " << s;
    }
  }
}

TEST_F(CompressTrain, BadValuesAreUsageErrors) {
  for (const std::string& bad : {"--compress zip", "--powersgd-rank 0", "--powersgd-start-iter -1",
                                 "--compress fp16 --deterministic", "--compress powersgd --zero 1"}) {
    std::vector<std::string> argv = {PARATRAIN_BIN, "train", "--model", "gpt-nano", "--data", dir_ + "/train.bin",
                                     "--steps", "1"};
    std::istringstream is(bad);
    for (std::string w; is >> w;) argv.push_back(w);
    auto r = launch::testing::run(argv, 60);
    EXPECT_EQ(r.status, 2) << bad << ": " << r.err;
    EXPECT_FALSE(r.err.empty()) << bad;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
}

}  // namespace
