// The pipeline executor on a group that matches messages in posting order and starts them
// only when waited for (nccl's rules, emulated by posting_order_group.h with ranks as
// threads): every schedule completes without a deadlock, every message meets the receive
// its sender meant (the emulation fails a match whose tags differ), and the losses and
// gradients are those of running the micro-batches one after another on one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <exception>
#include <thread>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/parallel/pipeline/executor.h"
#include "posting_order_group.h"

namespace paratrain {
namespace {

using namespace parallel::pipeline;

const Shape kHidden{2, 3, 4};

Tensor values(int salt) {
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + salt)) * 0.9f;
  return Tensor::from_vector(v, kHidden);
}

// Model stage s: x -> tanh(x * w_s); the last one also takes the mean (the loss).
struct Stages {
  std::vector<Tensor> weights;
  explicit Stages(int count) {
    for (int s = 0; s < count; ++s) {
      weights.push_back(values(100 + s));
      weights.back().set_requires_grad(true);
    }
  }
  Tensor forward(int stage, const Tensor& x) const {
    Tensor y = ops::tanh(ops::mul(x, weights[static_cast<size_t>(stage)]));
    return stage + 1 == static_cast<int>(weights.size()) ? ops::mean(y) : y;
  }
};

struct RankResult {
  double loss_sum = 0;
  std::vector<std::vector<float>> grads;  // per model stage (empty: another rank's)
  std::exception_ptr error;
};

void expect_matches_one_rank(const ScheduleSpec& spec) {
  SCOPED_TRACE(std::string(schedule_name(spec.kind)) + " p " + std::to_string(spec.stages) + " m " +
               std::to_string(spec.micro_batches) + " v " + std::to_string(spec.virtual_chunks));
  const Schedule schedule = build_schedule(spec);
  const int p = spec.stages, S = schedule.num_model_stages(), m = spec.micro_batches;
  const Tensor seed = Tensor::full({}, 1.0f / static_cast<float>(m));

  // One rank, the micro-batches one after another.
  Stages one(S);
  double want_loss = 0;
  for (int mb = 0; mb < m; ++mb) {
    Tensor x = values(mb);
    for (int s = 0; s < S; ++s) x = one.forward(s, x);
    want_loss += x.item();
    autograd::backward(x, seed);
  }

  testing::PostingOrderWorld world(p);
  std::vector<RankResult> results(static_cast<size_t>(p));
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      RankResult& res = results[static_cast<size_t>(r)];
      try {
        Stages mine(S);
        PipelineExecutor ex(schedule, world.group(r), r, kHidden);
        StageFunctions fns;
        fns.tokens = [](int mb) { return values(mb); };
        fns.forward = [&](int, int chunk, const Tensor& x) { return mine.forward(chunk * p + r, x); };
        fns.loss_seed = seed;
        res.loss_sum = ex.run_step(fns).loss_sum;
        res.grads.resize(static_cast<size_t>(S));
        for (int s = r; s < S; s += p) res.grads[static_cast<size_t>(s)] = mine.weights[static_cast<size_t>(s)].grad().to_vector();
      } catch (...) {
        res.error = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < p; ++r) {
    const RankResult& res = results[static_cast<size_t>(r)];
    if (res.error) {
      try {
        std::rethrow_exception(res.error);
      } catch (const std::exception& e) {
        FAIL() << "rank " << r << ": " << e.what();
      }
    }
  }
  EXPECT_NEAR(results[static_cast<size_t>((S - 1) % p)].loss_sum, want_loss, 1e-6);
  for (int s = 0; s < S; ++s) {
    const std::vector<float> want = one.weights[static_cast<size_t>(s)].grad().to_vector();
    const std::vector<float>& got = results[static_cast<size_t>(s % p)].grads[static_cast<size_t>(s)];
    ASSERT_EQ(got.size(), want.size()) << "stage " << s;
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "stage " << s << " element " << i;
  }
}

TEST(PipelineInPostingOrder, EveryScheduleCompletesAndMatchesOneRank) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubble})
    for (int p : {2, 3, 4})
      for (int m : {1, 2, 5, 8}) expect_matches_one_rank({kind, p, m, 1});
}

// Interleaving deadlocks under these rules (both ranks of a pair start a batch with a send
// whose receive the other posts in a later one): the executor refuses it by name.
TEST(PipelineInPostingOrder, TheInterleavedScheduleIsRefused) {
  testing::PostingOrderWorld world(2);
  try {
    PipelineExecutor ex(build_schedule({ScheduleKind::Interleaved, 2, 4, 2}), world.group(0), 0, kHidden);
    FAIL() << "interleaved was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("interleaved schedule does not run on a posting-order (test) pipeline group"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineInPostingOrder, ForwardOnlyGoesThroughEveryStage) {
  const int p = 3, S = p;
  const Schedule schedule = build_schedule({ScheduleKind::OneFOneB, p, 2, 1});
  Stages one(S);
  Tensor want = values(7);
  for (int s = 0; s < S; ++s) want = one.forward(s, want);
  testing::PostingOrderWorld world(p);
  std::vector<double> got(p, -1);
  std::vector<std::string> errors(p);
  std::vector<std::thread> threads;
  for (int r = 0; r < p; ++r)
    threads.emplace_back([&, r] {
      try {
        Stages mine(S);
        PipelineExecutor ex(schedule, world.group(r), r, kHidden);
        StageFunctions fns;
        fns.tokens = [](int) { return values(7); };
        fns.forward = [&](int, int chunk, const Tensor& x) { return mine.forward(chunk * p + r, x); };
        const Tensor out = ex.forward_only(fns);
        got[static_cast<size_t>(r)] = out.defined() ? out.item() : -1;
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < p; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(got[(S - 1) % p], want.item());
}

// The emulation is strict: receives posted in another order than the sends fail by name
// instead of exchanging data.
TEST(PipelineInPostingOrder, TheEmulationFailsReceivesPostedOutOfOrder) {
  testing::PostingOrderWorld world(2, std::chrono::seconds(5));
  float a = 1, b = 2, x = 0, y = 0;
  std::string error;
  std::thread sender([&] {
    auto g = world.group(0);
    auto w1 = g->send(&a, 1, DType::F32, 1, 10);
    auto w2 = g->send(&b, 1, DType::F32, 1, 11);
    try {
      w1->wait();
      w2->wait();
    } catch (const std::exception&) {
    }
  });
  auto g = world.group(1);
  auto r2 = g->recv(&y, 1, DType::F32, 0, 11);
  auto r1 = g->recv(&x, 1, DType::F32, 0, 10);
  try {
    r2->wait();
  } catch (const std::exception& e) {
    error = e.what();
  }
  try {
    r1->wait();
  } catch (const std::exception&) {
  }
  sender.join();
  EXPECT_NE(error.find("sent with tag 10"), std::string::npos) << error;
  EXPECT_NE(error.find("received as tag 11"), std::string::npos) << error;
}

}  // namespace
}  // namespace paratrain

namespace paratrain {
namespace {

// ... and a deadlock under nccl's rules (two neighbours each starting a batch with a lone
// send) fails at the deadline, naming what each rank's running batch waits for.
TEST(PipelineInPostingOrder, TheEmulationReportsADeadlockAtTheDeadline) {
  testing::PostingOrderWorld world(2, std::chrono::milliseconds(500));
  float out[2] = {1, 2}, in[2] = {0, 0};
  std::string errors[2];
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto g = world.group(r);
      try {
        g->send(&out[r], 1, DType::F32, 1 - r, 0)->wait();  // its own batch: waits for a recv
        g->recv(&in[r], 1, DType::F32, 1 - r, 0)->wait();   // never posted in time
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    EXPECT_NE(errors[r].find("send #0 to " + std::to_string(1 - r) + ", tag 0 did not complete within 500 ms"),
              std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("rank " + std::to_string(r) + ": send#0>" + std::to_string(1 - r)), std::string::npos)
        << errors[r];
  }
  EXPECT_EQ(in[0], 0.0f);
  EXPECT_EQ(in[1], 0.0f);
}

}  // namespace
}  // namespace paratrain
