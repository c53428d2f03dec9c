// The pipeline executor on a group that matches messages in posting order and starts them
// only when waited for (nccl's rules, emulated by posting_order_group.h with ranks as
// threads): every schedule completes without a deadlock, every message meets the receive
// its sender meant (the emulation fails a match whose tags differ), and the losses and
// gradients are those of running the micro-batches one after another on one rank; the
// interleaved schedule too, whose messages the executor posts in rounds (p2p_rounds.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <set>
#include <tuple>
#include <thread>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/parallel/pipeline/executor.h"
#include "paratrain/parallel/pipeline/p2p_rounds.h"
#include "pipeline_emulation.h"
#include "posting_order_group.h"

namespace paratrain {
namespace {

using namespace parallel::pipeline;

using testing::expect_matches_one_rank;
using testing::kHidden;
using testing::Stages;
using testing::values;

TEST(PipelineInPostingOrder, EveryScheduleCompletesAndMatchesOneRank) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubble})
    for (int p : {2, 3, 4})
      for (int m : {1, 2, 5, 8}) expect_matches_one_rank({kind, p, m, 1});
}

// The interleaved schedule, whose two directions between a pair cross (posted as each rank's
// order reaches them, both ranks start a batch with a send the other receives only in a later
// one): in message rounds it completes too, with 2 and 3 chunks per rank.
TEST(PipelineInPostingOrder, TheInterleavedScheduleCompletesAndMatchesOneRank) {
  for (int p : {2, 3, 4})
    for (int v : {2, 3})
      for (int k : {1, 2}) expect_matches_one_rank({ScheduleKind::Interleaved, p, k * p, v});
}

// The rounds every rank derives alike: rank r's receives of round k are exactly the messages
// its peers' actions of round k send it, in each sender's order; a rank's actions of a round
// need only messages of earlier rounds; every message is received once.
TEST(PipelineInPostingOrder, MessageRoundsPairEachBatchWithThePeersBatchOfTheSameRound) {
  const std::vector<ScheduleSpec> specs = {{ScheduleKind::OneFOneB, 4, 8, 1},
                                           {ScheduleKind::ZeroBubble, 3, 5, 1},
                                           {ScheduleKind::Interleaved, 2, 4, 2},
                                           {ScheduleKind::Interleaved, 4, 8, 3}};
  for (const ScheduleSpec& spec : specs) {
    SCOPED_TRACE(std::string(schedule_name(spec.kind)) + " p " + std::to_string(spec.stages));
    const Schedule sc = build_schedule(spec);
    const auto plan = plan_p2p_rounds(sc);
    const int p = spec.stages;
    ASSERT_EQ(plan.size(), static_cast<size_t>(p));
    const size_t rounds = plan[0].size();
    for (const auto& r : plan) ASSERT_EQ(r.size(), rounds);
    std::vector<std::vector<std::vector<P2pMessage>>> sent(rounds, std::vector<std::vector<P2pMessage>>(p));
    std::set<std::tuple<int, int, bool>> received_before;  // (stage, micro-batch, gradient), by earlier rounds
    size_t messages = 0, receives = 0;
    std::vector<size_t> begin(static_cast<size_t>(p), 0);
    for (size_t k = 0; k < rounds; ++k) {
      for (int q = 0; q < p; ++q) {
        const auto& actions = sc.ranks[static_cast<size_t>(q)];
        for (size_t i = begin[q]; i < plan[q][k].end_action; ++i) {
          const Action& a = actions[i];
          const int stage = a.chunk * p + q;
          if (a.kind == ActionKind::SendF) sent[k][a.peer].push_back({q, a.micro_batch, stage + 1, false}), ++messages;
          if (a.kind == ActionKind::SendB) sent[k][a.peer].push_back({q, a.micro_batch, stage - 1, true}), ++messages;
          if (a.kind == ActionKind::Forward && stage > 0 && (stage - 1) % p != q)
            EXPECT_TRUE(received_before.count({stage, a.micro_batch, false})) << "rank " << q << " action " << i;
          const bool backward = a.kind == ActionKind::Backward || a.kind == ActionKind::BackwardInput;
          if (backward && stage + 1 < sc.num_model_stages() && (stage + 1) % p != q)
            EXPECT_TRUE(received_before.count({stage, a.micro_batch, true})) << "rank " << q << " action " << i;
        }
        begin[q] = plan[q][k].end_action;
      }
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(plan[r][k].receives, sent[k][r]) << "rank " << r << " round " << k;
        for (const P2pMessage& m : plan[r][k].receives) received_before.insert({m.to_stage, m.micro_batch, m.gradient});
        receives += plan[r][k].receives.size();
      }
    }
    for (int q = 0; q < p; ++q) EXPECT_EQ(begin[q], sc.ranks[static_cast<size_t>(q)].size()) << "rank " << q;
    EXPECT_EQ(receives, messages);
    EXPECT_GT(messages, 0u);
  }
}

// A schedule whose rank waits for a message no rank sends (rank 0's SEND_F of micro-batch 0
// taken out) cannot be put in rounds: an Error naming each waiting rank, its action and stage
// (rank 1's forward waits for the activations, rank 0's backward for rank 1's gradient).
TEST(PipelineInPostingOrder, MessageRoundsOfAScheduleThatCannotCompleteAreAnError) {
  Schedule sc = build_schedule({ScheduleKind::OneFOneB, 2, 2, 1});
  auto& r0 = sc.ranks[0];
  const auto send = std::find_if(r0.begin(), r0.end(), [](const Action& a) {
    return a.kind == ActionKind::SendF && a.micro_batch == 0;
  });
  ASSERT_NE(send, r0.end());
  r0.erase(send);
  try {
    plan_p2p_rounds(sc);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline schedule 1f1b: rank 0's B of micro-batch 0 (stage 0), rank 1's F "
                                         "of micro-batch 0 (stage 1) wait for messages no rank sends"),
              std::string::npos)
        << e.what();
  }
}

TEST(PipelineInPostingOrder, ForwardOnlyGoesThroughEveryStage) {
  for (const int v : {1, 2}) {
    const int p = 3, S = p * v;
    const Schedule schedule =
        build_schedule({v == 1 ? ScheduleKind::OneFOneB : ScheduleKind::Interleaved, p, v == 1 ? 2 : 3, v});
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
    for (int r = 0; r < p; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r << ", v " << v;
    EXPECT_EQ(got[(S - 1) % p], want.item()) << "v " << v;
  }
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
