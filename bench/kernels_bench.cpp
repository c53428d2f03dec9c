// kernels_bench: GEMM GFLOP/s for the gpt-mini shapes (forward and both backward GEMMs of
// every linear layer) at 1 and 2 threads, and the fused attention forward + backward time
// at B=8, NH=6, T=256, hs=64, plus a few elementwise kernels, and the same GEMMs in bf16
// (A, B, C bf16, f32 accumulation) beside f32 with the half GEMM path this CPU takes.
// Prints tables; exits 0.
//
// Usage: kernels_bench [--quick]
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "paratrain/kernels/cpu.h"
#include "paratrain/kernels/cpu/half.h"
#include "paratrain/tensor/dtype.h"

namespace kc = paratrain::kernels::cpu;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Median-free simple timing: warm up, then run for at least min_s seconds; returns s/iter.
double time_it(const std::function<void()>& f, double min_s) {
  f();
  f();
  int iters = 0;
  double t0 = now_s(), t;
  do {
    f();
    ++iters;
    t = now_s();
  } while (t - t0 < min_s);
  return (t - t0) / iters;
}

std::vector<float> randv(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Shape {
  const char* name;
  bool ta, tb;
  int64_t M, N, K;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const double min_s = quick ? 0.05 : 0.3;
  const int64_t BT = 2048, C = 384, V = 4096;
  // gpt-mini GEMMs: forward y = x W (x (BT,in), W (in,out)); backward dx = dy W^T, dW = x^T dy.
  std::vector<Shape> shapes;
  struct Lin { const char* name; int64_t in, out; };
  static std::vector<std::string> names;
  names.reserve(32);
  for (Lin l : {Lin{"c_attn", C, 3 * C}, Lin{"attn.c_proj", C, C}, Lin{"c_fc", C, 4 * C},
                Lin{"mlp.c_proj", 4 * C, C}}) {
    names.push_back(std::string(l.name) + " fwd  x W");
    shapes.push_back({names.back().c_str(), false, false, BT, l.out, l.in});
    names.push_back(std::string(l.name) + " bwd  dy W^T");
    shapes.push_back({names.back().c_str(), false, true, BT, l.in, l.out});
    names.push_back(std::string(l.name) + " bwd  x^T dy");
    shapes.push_back({names.back().c_str(), true, false, l.in, l.out, BT});
  }
  shapes.push_back({"lm_head fwd  x wte^T", false, true, BT, V, C});
  shapes.push_back({"lm_head bwd  dlogits wte", false, false, BT, C, V});
  shapes.push_back({"lm_head bwd  dlogits^T x", true, false, V, C, BT});

  const size_t big = static_cast<size_t>(BT) * V;
  auto A = randv(big, 1), B = randv(big, 2);
  std::vector<float> Cm(big, 0.0f);

  std::printf("paratrain kernels_bench (oneDNN sgemm, OpenMP)\n\n");
  std::printf("%-28s %6s %6s %6s  %12s %12s\n", "GEMM (gpt-mini, M N K)", "M", "N", "K",
              "1 thr GF/s", "2 thr GF/s");
  double step_flops = 0, step_time[2] = {0, 0};
  std::vector<std::array<double, 2>> f32_gf;
  for (const Shape& s : shapes) {
    std::array<double, 2> gf;
    for (int ti = 0; ti < 2; ++ti) {
      kc::set_num_threads(ti + 1);
      const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
      double t = time_it([&] {
        kc::gemm(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, 0.0f, Cm.data(), s.N);
      }, min_s);
      gf[ti] = 2.0 * s.M * s.N * s.K / t * 1e-9;
      // per training step: 6 layers for the block GEMMs, once for the head
      const int mult = std::strncmp(s.name, "lm_head", 7) == 0 ? 1 : 6;
      step_time[ti] += mult * t;
      if (ti == 0) step_flops += mult * 2.0 * s.M * s.N * s.K;
    }
    std::printf("%-28s %6lld %6lld %6lld  %12.1f %12.1f\n", s.name, (long long)s.M, (long long)s.N,
                (long long)s.K, gf[0], gf[1]);
    f32_gf.push_back(gf);
  }
  std::printf("%-28s %27s %12.1f %12.1f\n", "all GEMMs of one step", "",
              step_flops / step_time[0] * 1e-9, step_flops / step_time[1] * 1e-9);
  std::printf("  (one gpt-mini step, micro-batch 8: %.1f GFLOP in GEMMs, %.1f ms at 1 thr, %.1f ms at 2 thr)\n\n",
              step_flops * 1e-9, step_time[0] * 1e3, step_time[1] * 1e3);

  // ---- the same GEMMs in bf16 (inputs, output bf16; f32 accumulation) ----
  {
    using paratrain::DType;
    std::vector<uint16_t> Ah(big), Bh(big), Ch(big, 0);
    kc::f32_to_bf16(Ah.data(), A.data(), static_cast<int64_t>(big));
    kc::f32_to_bf16(Bh.data(), B.data(), static_cast<int64_t>(big));
    std::printf("bf16 GEMM, path: %s (conversions: %s)\n", kc::gemm_path(DType::BF16),
                kc::half_convert_path());
    std::printf("%-28s %12s %12s %12s %12s\n", "GEMM (gpt-mini)", "f32 1 thr", "bf16 1 thr",
                "f32 2 thr", "bf16 2 thr");
    double bf_time[2] = {0, 0};
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& s = shapes[i];
      double gf[2];
      for (int ti = 0; ti < 2; ++ti) {
        kc::set_num_threads(ti + 1);
        const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
        double t = time_it([&] {
          kc::half::gemm<DType::BF16>(s.ta, s.tb, s.M, s.N, s.K, 1.0f, Ah.data(), lda, Bh.data(), ldb,
                                      0.0f, Ch.data(), s.N);
        }, min_s);
        gf[ti] = 2.0 * s.M * s.N * s.K / t * 1e-9;
        bf_time[ti] += (std::strncmp(s.name, "lm_head", 7) == 0 ? 1 : 6) * t;
      }
      std::printf("%-28s %12.1f %12.1f %12.1f %12.1f\n", s.name, f32_gf[i][0], gf[0], f32_gf[i][1], gf[1]);
    }
    std::printf("%-28s %12.1f %12.1f %12.1f %12.1f   GFLOP/s\n\n", "all GEMMs of one step",
                step_flops / step_time[0] * 1e-9, step_flops / bf_time[0] * 1e-9,
                step_flops / step_time[1] * 1e-9, step_flops / bf_time[1] * 1e-9);
  }

  // ---- attention ----
  {
    const int64_t Bb = 8, T = 256, NH = 6, Ca = 384;
    auto qkv = randv(Bb * T * 3 * Ca, 3);
    for (auto& x : qkv) x *= 0.5f;
    auto dout = randv(Bb * T * Ca, 4);
    std::vector<float> out(Bb * T * Ca), lse(Bb * NH * T), dqkv(Bb * T * 3 * Ca, 0.0f);
    // causal attention useful FLOPs: QK^T and PV forward (half of T^2), four GEMMs backward
    const double fwd_flops = 2.0 * 2.0 * Bb * NH * (T * (T + 1) / 2.0) * (Ca / NH);
    std::printf("attention B=8 NH=6 T=256 hs=64   %10s %10s %10s\n", "fwd ms", "bwd ms", "fwd+bwd");
    for (int threads : {1, 2}) {
      kc::set_num_threads(threads);
      double tf = time_it([&] { kc::attention_forward(out.data(), lse.data(), qkv.data(), Bb, T, Ca, NH); }, min_s);
      double tb = time_it([&] {
        kc::attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), Bb, T, Ca, NH);
      }, min_s);
      std::printf("  %d thread%s                        %10.2f %10.2f %10.2f   (%.1f / %.1f GFLOP/s causal)\n",
                  threads, threads > 1 ? "s" : " ", tf * 1e3, tb * 1e3, (tf + tb) * 1e3,
                  fwd_flops / tf * 1e-9, 2.0 * fwd_flops / tb * 1e-9);
    }
    std::printf("\n");
  }

  // ---- a few memory-bound kernels at gpt-mini sizes ----
  {
    const int64_t n = BT * 4 * C;  // the MLP hidden activation
    std::vector<float> x(A.begin(), A.begin() + n), y(n), g(B.begin(), B.begin() + n), d(n, 0.0f);
    std::vector<float> mean(BT), rstd(BT), w(C, 1.0f), bias(C, 0.0f), dw(C), db(C);
    std::vector<uint16_t> xh(n), yh(n);
    kc::f32_to_bf16(xh.data(), x.data(), n);
    std::vector<int32_t> tgt(BT);
    for (int64_t i = 0; i < BT; ++i) tgt[i] = static_cast<int32_t>(i % V);
    std::vector<float> losses(BT), lse(BT);
    // AdamW over gpt-mini's parameter count (~10.9M): p, g, m, v
    const int64_t np = 10'900'000;
    std::vector<float> ap = randv(np, 5), ag = randv(np, 6), am(np, 0.0f), av(np, 0.0f);
    for (auto& v : ag) v *= 1e-2f;
    int64_t astep = 0;
    std::printf("%-44s %10s %10s\n", "memory-bound kernels (gpt-mini sizes)", "1 thr ms", "2 thr ms");
    struct K { const char* name; std::function<void()> f; };
    std::vector<K> ks = {
        {"gelu_forward (2048x1536)", [&] { kc::gelu_forward(y.data(), x.data(), n); }},
        {"gelu_backward (2048x1536)", [&] { kc::gelu_backward(d.data(), g.data(), x.data(), n); }},
        {"layernorm_forward (2048x384)", [&] { kc::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), bias.data(), BT, C); }},
        {"layernorm_backward (2048x384)", [&] { kc::layernorm_backward(d.data(), dw.data(), db.data(), g.data(), x.data(), w.data(), mean.data(), rstd.data(), BT, C); }},
        {"crossentropy_forward (2048x4096)", [&] { kc::crossentropy_forward(losses.data(), lse.data(), A.data(), tgt.data(), BT, V, V); }},
        {"crossentropy_backward (2048x4096)", [&] { kc::crossentropy_backward(Cm.data(), losses.data(), A.data(), lse.data(), tgt.data(), BT, V, V); }},
        {"gelu_forward bf16 (2048x1536)", [&] { kc::half::gelu_forward<paratrain::DType::BF16>(yh.data(), xh.data(), n); }},
        {"cast f32 -> bf16 (2048x1536)", [&] { kc::f32_to_bf16(yh.data(), x.data(), n); }},
        {"cast bf16 -> f32 (2048x1536)", [&] { kc::bf16_to_f32(y.data(), xh.data(), n); }},
        {"adamw_update (10.9M params)", [&] { kc::adamw_update(ap.data(), ag.data(), am.data(), av.data(), np, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, ++astep); }},
    };
    for (auto& k : ks) {
      double t[2];
      for (int ti = 0; ti < 2; ++ti) {
        kc::set_num_threads(ti + 1);
        t[ti] = time_it(k.f, min_s / 2);
      }
      std::printf("%-44s %10.3f %10.3f\n", k.name, t[0] * 1e3, t[1] * 1e3);
    }
  }
  return 0;
}
