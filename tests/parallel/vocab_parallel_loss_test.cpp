// Vocab-parallel cross-entropy: with tp = 1..4 ranks as threads (shm groups), the loss on
// every rank equals ops::cross_entropy of the whole logits and each rank's gradient equals
// the reference gradient's columns, the padding columns (filled with large values) ignored
// and given gradient 0, with the two forward all-reduces the only communication; bf16 and
// f16 logits against the f32 reference of the same values; the same bits on 1 and 2 threads;
// all targets ignored; bad inputs. And, as two real processes (allocator statistics are
// process-wide), that no rank's allocator peak over forward + backward reaches a
// [tokens x vocab] buffer.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu/threads.h"
#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"
#include "paratrain/tensor/random.h"
#include "parallel/ddp_test_util.h"
#include "parallel/train_multirank_util.h"
#include "support/error_of.h"

using namespace paratrain;
using namespace paratrain::parallel;

namespace {

using paratrain::testing::run_ranks;

constexpr int64_t kN = 37;

// Whole logits (N, V) in f32 holding values exact in `dt`, targets, and ops::cross_entropy's
// loss and gradient of them.
struct Problem {
  int64_t N = 0, V = 0;
  Tensor full, targets;
  double loss = 0;
  std::vector<float> grad;  // (N, V)
};

Problem make_problem(int64_t V, DType dt, bool all_ignored = false, int64_t N = kN) {
  Problem p;
  p.N = N;
  p.V = V;
  Generator g(11);
  Tensor f = Tensor::empty({N, V});
  fill_normal(f, g, 0.0f, 2.0f);
  p.full = dt == DType::F32 ? f : f.to(dt).to(DType::F32);
  // Rows 0..V-1 take every id (so every shard holds targets), the rest random; a few ignored.
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = i < V ? static_cast<int32_t>(i) : static_cast<int32_t>(g.below(V));
  for (int64_t i : {4, 17, 30}) ids[i] = -1;
  if (all_ignored) ids.assign(N, -1);
  p.targets = Tensor::from_vector_i32(ids, {N});
  Tensor x = p.full.clone();
  x.set_requires_grad(true);
  Tensor loss = ops::cross_entropy(x, p.targets);
  autograd::backward(loss);
  p.loss = loss.item();
  p.grad = x.grad().to_vector();
  return p;
}

// Rank r's columns [r Vl, (r + 1) Vl) of the whole logits in dtype dt; padding columns (at or
// beyond V) hold large random values, which would dominate the loss if they were counted.
Tensor shard(const Problem& p, int r, int64_t Vl, DType dt) {
  Generator g(500 + static_cast<uint64_t>(r));
  const std::vector<float> full = p.full.to_vector();
  std::vector<float> v(static_cast<size_t>(p.N * Vl));
  for (int64_t i = 0; i < p.N; ++i)
    for (int64_t c = 0; c < Vl; ++c) {
      const int64_t col = r * Vl + c;
      v[i * Vl + c] = col < p.V ? full[i * p.V + col] : 40.0f + 40.0f * g.uniform_f32();
    }
  Tensor t = Tensor::from_vector(v, {p.N, Vl});
  return dt == DType::F32 ? t : t.to(dt);
}

struct RankResult {
  double loss = -1;
  std::vector<float> grad;  // (N, Vl), widened to f32
  DType grad_dtype = DType::U8;
  TpCommStats forward, backward;
};

std::vector<RankResult> run_sharded(const Problem& p, int tp, DType dt) {
  const int64_t Vl = (p.V + tp - 1) / tp;
  std::vector<RankResult> res(tp);
  auto errors = run_ranks(tp, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    auto group = std::make_shared<TpGroup>(pg);
    const int r = group->rank();
    Tensor local = shard(p, r, Vl, dt);
    local.set_requires_grad(true);
    Tensor loss = vocab_parallel_cross_entropy(local, p.targets, r * Vl, p.V, group);
    res[r].forward = group->take_stats();
    autograd::backward(loss);
    res[r].backward = group->take_stats();
    res[r].loss = loss.item();
    res[r].grad = local.grad().to_vector();
    res[r].grad_dtype = local.grad().dtype();
  });
  for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  return res;
}

// Every rank's loss within loss_rel of the reference; its gradient within grad_tol(ref) of the
// reference's columns, exactly 0 in the padding.
template <typename Tol>
void expect_matches(const Problem& p, const std::vector<RankResult>& res, DType dt, double loss_rel, Tol grad_tol) {
  const int tp = static_cast<int>(res.size());
  const int64_t Vl = (p.V + tp - 1) / tp;
  for (int r = 0; r < tp; ++r) {
    SCOPED_TRACE("tp " + std::to_string(tp) + " V " + std::to_string(p.V) + " rank " + std::to_string(r) + " " +
                 dtype_name(dt));
    EXPECT_NEAR(res[r].loss, p.loss, loss_rel * std::fabs(p.loss));
    ASSERT_EQ(res[r].grad.size(), static_cast<size_t>(p.N * Vl));
    EXPECT_EQ(res[r].grad_dtype, dt);
    int bad = 0, bad_padding = 0;
    std::string first;
    for (int64_t i = 0; i < p.N; ++i)
      for (int64_t c = 0; c < Vl; ++c) {
        const int64_t col = r * Vl + c;
        const float got = res[r].grad[i * Vl + c];
        if (col >= p.V) {
          bad_padding += got != 0.0f;
          continue;
        }
        const float want = p.grad[i * p.V + col];
        if (!(std::fabs(got - want) <= grad_tol(want))) {
          if (!bad++)
            first = "row " + std::to_string(i) + " col " + std::to_string(col) + ": " + std::to_string(got) +
                    " vs " + std::to_string(want);
        }
      }
    EXPECT_EQ(bad, 0) << "first: " << first;
    EXPECT_EQ(bad_padding, 0);
  }
}

TEST(VocabParallelCrossEntropy, MatchesCrossEntropyOfWholeLogits) {
  // V = 12 splits evenly over 1..4 ranks; V = 10 pads to 2 x 5, 3 x 4 and 4 x 3 = 12; V = 9
  // with tp = 4 (4 x 3) leaves the last rank nothing but padding.
  for (int64_t V : {12, 10, 9}) {
    const Problem p = make_problem(V, DType::F32);
    for (int tp = 1; tp <= 4; ++tp) {
      const auto res = run_sharded(p, tp, DType::F32);
      expect_matches(p, res, DType::F32, 1e-6, [](float) { return 1e-6f; });
      for (const auto& r : res) {
        // Forward: one MAX all-reduce of N floats and one SUM all-reduce of 2N; backward none.
        EXPECT_EQ(r.forward.calls, tp > 1 ? 2 : 0);
        EXPECT_EQ(r.forward.bytes, tp > 1 ? 3 * p.N * 4 : 0);
        EXPECT_EQ(r.backward.calls, 0);
      }
    }
  }
}

TEST(VocabParallelCrossEntropy, HalfLogitsMatchF32ReferenceOfSameValues) {
  // The gradient is rounded to the logits' dtype once: within half an ulp of the f32 one
  // (2^-9 relative for bf16, 2^-12 for f16), with 2^-8 / 2^-11 as the bound.
  for (DType dt : {DType::BF16, DType::F16}) {
    const int ulp_bits = dt == DType::BF16 ? 8 : 11;
    for (int64_t V : {12, 10}) {
      const Problem p = make_problem(V, dt);
      for (int tp : {1, 2, 3}) {
        const auto res = run_sharded(p, tp, dt);
        expect_matches(p, res, dt, 1e-5,
                       [ulp_bits](float want) { return std::ldexp(std::fabs(want), -ulp_bits) + 1e-6f; });
      }
    }
  }
}

TEST(VocabParallelCrossEntropy, ThreadCountDoesNotChangeResult) {
  // 64 x 1024 logits per rank: enough for the rows to be split over two threads.
  const int before = kernels::cpu::num_threads();
  for (DType dt : {DType::F32, DType::BF16}) {
    const Problem p = make_problem(2047, dt, false, 64);
    kernels::cpu::set_num_threads(1);
    const auto one = run_sharded(p, 2, dt);
    kernels::cpu::set_num_threads(3);
    const auto three = run_sharded(p, 2, dt);
    kernels::cpu::set_num_threads(before);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(one[r].loss, three[r].loss) << dtype_name(dt) << " rank " << r;
      EXPECT_TRUE(one[r].grad == three[r].grad) << dtype_name(dt) << " rank " << r;
    }
    if (dt == DType::F32) expect_matches(p, three, dt, 1e-6, [](float) { return 1e-6f; });
    else expect_matches(p, three, dt, 1e-5, [](float want) { return std::ldexp(std::fabs(want), -8) + 1e-6f; });
  }
}

TEST(VocabParallelCrossEntropy, AllTargetsIgnoredGiveZeroLossAndGradient) {
  const Problem p = make_problem(10, DType::F32, /*all_ignored=*/true);
  EXPECT_EQ(p.loss, 0.0);
  for (int tp : {1, 2}) {
    const auto res = run_sharded(p, tp, DType::F32);
    for (const auto& r : res) {
      EXPECT_EQ(r.loss, 0.0);
      for (float g : r.grad) ASSERT_EQ(g, 0.0f);
    }
  }
}

// The head in one op (what VocabParallelEmbedding::tied_loss runs): on every rank the same loss
// and gradients, hidden's and its weight rows', as the rank's logits matmul(hidden, w^T) then
// vocab_parallel_cross_entropy, bit for bit, in f32 and under bf16 autocast; V = 77 cut into
// 77, 39 and 26 rows a rank (logits rows of 128, 64 and 64), the padding rows zero.
TEST(VocabParallelCrossEntropy, TheHeadAndLossInOneOpAreTheTwoOpsBitForBit) {
  const int64_t V = 77, C = 16;
  Generator g(7);
  Tensor hidden = Tensor::empty({kN, C}), whole = Tensor::empty({V, C});
  fill_normal(hidden, g, 0.0f, 1.0f);
  fill_normal(whole, g, 0.0f, 0.5f);
  const Problem p = make_problem(V, DType::F32);  // its targets: every id, a few ignored
  for (int tp = 1; tp <= 3; ++tp)
    for (bool bf16 : {false, true}) {
      const int64_t Vl = (V + tp - 1) / tp;
      auto errors = run_ranks(tp, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
        auto group = std::make_shared<TpGroup>(pg);
        const int r = group->rank();
        std::vector<float> rows(static_cast<size_t>(Vl * C), 0.0f);  // this rank's rows, zero past V
        const std::vector<float> all = whole.to_vector();
        for (int64_t i = 0; i < Vl && r * Vl + i < V; ++i)
          std::copy(all.begin() + (r * Vl + i) * C, all.begin() + (r * Vl + i + 1) * C, rows.begin() + i * C);
        Tensor loss[2], dh[2], dw[2];
        for (int fused = 0; fused < 2; ++fused) {
          Tensor h = hidden.clone(), w = Tensor::from_vector(rows, {Vl, C});
          h.set_requires_grad(true);
          w.set_requires_grad(true);
          {
            autograd::AutocastGuard cast(bf16 ? DType::BF16 : DType::F32);
            loss[fused] = fused ? vocab_parallel_linear_cross_entropy(h, w, p.targets, r * Vl, V, group)
                                : vocab_parallel_cross_entropy(ops::matmul(h, w, true), p.targets, r * Vl, V, group);
          }
          autograd::backward(loss[fused]);
          dh[fused] = h.grad(), dw[fused] = w.grad();
        }
        const std::string what = "tp " + std::to_string(tp) + " rank " + std::to_string(r) + (bf16 ? " bf16" : " f32");
        EXPECT_EQ(loss[1].item(), loss[0].item()) << what;
        EXPECT_GT(loss[1].item(), 1.0f) << what;  // a real loss: logits of spread ~2 over 77 classes
        EXPECT_EQ(dh[1].to_vector(), dh[0].to_vector()) << what;
        EXPECT_EQ(dw[1].to_vector(), dw[0].to_vector()) << what;
      });
      for (int r = 0; r < tp; ++r) EXPECT_EQ(errors[r], "") << "tp " << tp << " rank " << r;
    }
}

// The head in one op names what is wrong before any communication.
TEST(VocabParallelCrossEntropy, TheHeadInOneOpNamesBadInputs) {
  auto one = std::make_shared<TpGroup>(nullptr);  // one rank
  const Tensor hidden = Tensor::zeros({4, 8}), weight = Tensor::zeros({6, 8});
  const Tensor targets = Tensor::from_vector_i32({0, 5, -1, 2}, {4});
  EXPECT_NO_THROW(vocab_parallel_linear_cross_entropy(hidden, weight, targets, 0, 6, one));
  auto message = [](const Tensor& h, const Tensor& w, const Tensor& t, int64_t start, int64_t size,
                    std::shared_ptr<TpGroup> tp) {
    return paratrain::testing::error_of<InputError>(
        [&] { vocab_parallel_linear_cross_entropy(h, w, t, start, size, tp); });
  };
  const std::string op = "vocab_parallel_linear_cross_entropy: ";
  for (const auto& [got, want] : std::vector<std::pair<std::string, std::string>>{
           {message(hidden, weight, targets, 0, 6, nullptr), op + "no tensor-parallel group"},
           {message(hidden, Tensor::zeros({48}), targets, 0, 6, one),
            op + "needs hidden states and a 2-D weight (this rank's vocabulary rows)"},
           {message(hidden, Tensor::zeros({0, 8}), targets, 0, 6, one),
            op + "needs hidden states and a 2-D weight (this rank's vocabulary rows)"},
           {message(Tensor::zeros({4, 7}), weight, targets, 0, 6, one),
            op + "hidden [4, 7] does not fit weight [6, 8]"},
           {message(hidden, weight, Tensor::from_vector_i32({0, 1, 2}, {3}), 0, 6, one),
            op + "3 targets for 4 rows of hidden states [4, 8]"},
           {message(hidden, weight, targets, 6, 6, one), op + "vocab_start 6 on tp rank 0 with 6 columns per rank"},
           {message(hidden, weight, targets, 0, 7, one), op + "vocab_size 7 does not fit 1 ranks x 6 columns"},
           {message(hidden, weight, targets, 0, 5, one), "target 5 at position 1 is outside [0, 5)"},
       })
    EXPECT_NE(got.find(want), std::string::npos) << "want: " << want << "\ngot:  " << got;
}

TEST(VocabParallelCrossEntropy, RejectsBadInputs) {
  auto one = std::make_shared<TpGroup>(nullptr);  // one rank
  Tensor logits = Tensor::zeros({4, 6});
  Tensor targets = Tensor::from_vector_i32({0, 5, -1, 2}, {4});
  EXPECT_NO_THROW(vocab_parallel_cross_entropy(logits, targets, 0, 6, one));
  EXPECT_NO_THROW(vocab_parallel_cross_entropy(logits, targets, 0, 5 + 1, one));
  auto call = [&](const Tensor& l, const Tensor& t, int64_t start, int64_t size) {
    vocab_parallel_cross_entropy(l, t, start, size, one);
  };
  EXPECT_THROW(call(logits, Tensor::from_vector_i32({0, 1, 2}, {3}), 0, 6), InputError);   // 3 targets, 4 rows
  EXPECT_THROW(call(logits, targets, 6, 6), InputError);                                     // rank 0 starts at 0
  EXPECT_THROW(call(logits, targets, 0, 7), InputError);                                     // more than 1 x 6
  EXPECT_THROW(call(logits, targets, 0, 0), InputError);
  EXPECT_THROW(call(logits, targets, 0, 5), InputError);                                     // target 5 >= 5
  EXPECT_THROW(call(logits, Tensor::from_vector_i32({0, 1, -2, 2}, {4}), 0, 6), InputError);  // -2
  EXPECT_THROW(call(Tensor::zeros({4, 6}, DType::I32), targets, 0, 6), InputError);          // integer logits
  EXPECT_THROW(call(logits, Tensor::zeros({4}), 0, 6), InputError);                          // f32 targets
  EXPECT_THROW(call(Tensor::zeros({4, 0}), targets, 0, 6), InputError);                      // no columns
  EXPECT_THROW(vocab_parallel_cross_entropy(logits, targets, 0, 6, nullptr), InputError);

  // Two ranks, each with a start that is not rank x Vl: both throw before communicating.
  std::vector<int> threw(2, 0);
  auto errors = run_ranks(2, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    auto tp = std::make_shared<TpGroup>(pg);
    const int r = tp->rank();
    try {
      vocab_parallel_cross_entropy(logits, targets, r * 6 + 1, 12, tp);
    } catch (const InputError& e) {
      threw[r] = std::string(e.what()).find("vocab_start") != std::string::npos ? 1 : 2;
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(errors[r], "");
    EXPECT_EQ(threw[r], 1) << "rank " << r;
  }
}

// ---- two processes: allocator peaks ----

using paratrain::test::free_port;
using paratrain::test::read_text;

struct Proc {
  int code = -1000;  // exit code, -signal if killed
  std::string out, err;
};

// Runs the helper as n ranks (rank 0 hosts the TCP store on a free port); kills every process
// (its process group) still running after timeout_s.
std::vector<Proc> spawn_ranks(int n, const std::vector<std::string>& args, double timeout_s) {
  const std::string helper = std::string(PARATRAIN_TEST_BIN_DIR) + "/vocab_parallel_loss_helper";
  const int port = free_port();
  std::vector<pid_t> pids;
  std::vector<Proc> res(n);
  const std::string log = "/tmp/paratrain_vploss_" + std::to_string(::getpid()) + "_";
  // Everything the child needs is built before fork (only async-signal-safe calls after it).
  std::vector<std::string> outs, errs;
  std::vector<std::vector<std::string>> envs(n);
  for (int r = 0; r < n; ++r) {
    outs.push_back(log + std::to_string(r) + ".out");
    errs.push_back(log + std::to_string(r) + ".err");
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (key != "RANK" && key != "LOCAL_RANK" && key != "WORLD_SIZE" && key != "LOCAL_WORLD_SIZE" &&
          key != "MASTER_ADDR" && key != "MASTER_PORT" && key != "PARATRAIN_TOKEN")
        envs[r].push_back(kv);
    }
    for (std::string kv : {"RANK=" + std::to_string(r), "LOCAL_RANK=" + std::to_string(r),
                           "WORLD_SIZE=" + std::to_string(n), "LOCAL_WORLD_SIZE=" + std::to_string(n),
                           std::string("MASTER_ADDR=127.0.0.1"), "MASTER_PORT=" + std::to_string(port),
                           std::string("PARATRAIN_TOKEN=vploss-test")})
      envs[r].push_back(kv);
  }
  std::vector<char*> argv{const_cast<char*>(helper.c_str())};
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (int r = 0; r < n; ++r) {
    std::vector<char*> envp;
    for (auto& kv : envs[r]) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      int fo = ::open(outs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int fe = ::open(errs[r].c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fo, 1);
      ::dup2(fe, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      int st = 0;
      if (res[r].code == -1000 && ::waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        res[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
        --left;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r)
        if (res[r].code == -1000) {
          ::kill(-pids[r], SIGKILL);
          ::kill(pids[r], SIGKILL);
          int st = 0;
          ::waitpid(pids[r], &st, 0);
          res[r].code = -SIGKILL;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int r = 0; r < n; ++r) {
    res[r].out = read_text(outs[r]);
    res[r].err = read_text(errs[r]);
    ::unlink(outs[r].c_str());
    ::unlink(errs[r].c_str());
  }
  return res;
}

TEST(VocabParallelCrossEntropy, NoRankAllocatesTokensByVocab) {
  constexpr int64_t N = 512, V = 8192;
  constexpr int kRanks = 2;
  constexpr int64_t kSlack = 256 << 10;  // the N-float statistics, a Vl-wide row per thread, scalars
  const auto procs = spawn_ranks(kRanks, {std::to_string(N), std::to_string(V)}, 60);
  std::vector<std::string> losses[2];
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(procs[r].code, 0) << "rank " << r << " stderr:\n" << procs[r].err << "stdout:\n" << procs[r].out;
    std::istringstream lines(procs[r].out);
    std::string line;
    int seen = 0;
    while (std::getline(lines, line)) {
      int rank = -1;
      char dtype[8] = {0}, loss[64] = {0};
      long long extra = -1, grad = -1;
      if (std::sscanf(line.c_str(), "vploss rank %d dtype %7s extra_peak_bytes %lld grad_bytes %lld loss %63s", &rank,
                      dtype, &extra, &grad, loss) != 5)
        continue;
      ++seen;
      const std::string dt = dtype;
      const int64_t esz = dt == "f32" ? 4 : 2;
      const int64_t full = N * V * esz, bound = full / kRanks + kSlack;
      std::cout << "[ vploss ] rank " << rank << " " << dt << ": extra allocator peak over forward + backward "
                << extra << " bytes (its gradient " << grad << "; one [tokens x vocab] buffer " << full
                << ", bound " << bound << ")\n";
      EXPECT_EQ(rank, r);
      EXPECT_EQ(grad, full / kRanks);
      EXPECT_GT(extra, 0);
      EXPECT_LT(extra, bound) << "rank " << r << " " << dt;
      losses[dt == "f32" ? 0 : 1].push_back(loss);
    }
    EXPECT_EQ(seen, 2) << procs[r].out;
  }
  for (const auto& l : losses) {
    ASSERT_EQ(l.size(), size_t(kRanks));
    EXPECT_EQ(l[0], l[1]) << "the ranks' losses differ";
  }
}

}  // namespace
