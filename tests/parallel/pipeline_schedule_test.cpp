// Pipeline schedules as data (parallel/pipeline/schedule.h): every schedule for p in 1..8 and
// m in 1..16 passes the checker (no deadlock, each micro-batch's forward before its backward
// on every stage, every receive matched by a send); the activations each stage holds are
// REFERENCE.md's (GPipe m, 1F1B at most p - s, zb1p as 1F1B); the simulated bubble is the
// theory's for gpipe, 1f1b and interleaved, and zb1p's is below 1f1b's; broken schedules are
// named; bad input is an InputError.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/parallel/pipeline/schedule.h"

using namespace paratrain;
using namespace paratrain::parallel::pipeline;

namespace {

ScheduleCheck checked(ScheduleKind kind, int p, int m, int v = 1) {
  const Schedule s = build_schedule({kind, p, m, v});
  ScheduleCheck c = check_schedule(s);
  EXPECT_TRUE(c.ok) << schedule_name(kind) << " p=" << p << " m=" << m << " v=" << v << ": " << c.problem << "\n"
                    << format_schedule(s);
  return c;
}

TEST(PipelineSchedule, GPipeAndOneFOneBHoldWhatTheTheorySaysAndHaveItsBubble) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const ScheduleCheck g = checked(ScheduleKind::GPipe, p, m), f = checked(ScheduleKind::OneFOneB, p, m);
      for (int s = 0; s < p; ++s) {
        EXPECT_EQ(g.peak_activations[s], m) << "gpipe p=" << p << " m=" << m << " stage " << s;
        EXPECT_EQ(f.peak_activations[s], std::min(p - s, m)) << "1f1b p=" << p << " m=" << m << " stage " << s;
      }
      const double theory = theoretical_bubble({ScheduleKind::OneFOneB, p, m, 1});
      EXPECT_NEAR(g.bubble_fraction, theory, 1e-9) << "gpipe p=" << p << " m=" << m;
      EXPECT_NEAR(f.bubble_fraction, theory, 1e-9) << "1f1b p=" << p << " m=" << m;
      EXPECT_NEAR(theory, (p - 1.0) / (m + p - 1.0), 1e-12);
    }
}

TEST(PipelineSchedule, ZeroBubbleKeepsOneFOneBsMemoryAndShrinksItsBubble) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const ScheduleCheck z = checked(ScheduleKind::ZeroBubble, p, m), f = checked(ScheduleKind::OneFOneB, p, m);
      for (int s = 0; s < p; ++s) EXPECT_LE(z.peak_activations[s], f.peak_activations[s]) << "p=" << p << " m=" << m;
      if (p > 1) EXPECT_LT(z.bubble_fraction, f.bubble_fraction) << "p=" << p << " m=" << m;
      EXPECT_NEAR(z.bubble_fraction, theoretical_bubble({ScheduleKind::ZeroBubble, p, m, 1}), 1e-9) << "p=" << p << " m=" << m;
    }
  // With unit F, I, W: 1F1B idles (p-1) x 3 of 3m + 3(p-1); zb1p (p-1) x 2 of 3m + 2(p-1).
  EXPECT_NEAR(theoretical_bubble({ScheduleKind::ZeroBubble, 4, 8, 1}), 6.0 / 30.0, 1e-12);
}

TEST(PipelineSchedule, InterleavedHasTheSmallerBubbleOfVChunks) {
  for (int p = 1; p <= 8; ++p)
    for (int m = p; m <= 16; m += p)
      for (int v : {2, 3}) {
        const ScheduleCheck c = checked(ScheduleKind::Interleaved, p, m, v);
        const double theory = theoretical_bubble({ScheduleKind::Interleaved, p, m, v});
        EXPECT_NEAR(theory, (p - 1.0) / (v * m + p - 1.0), 1e-12);
        EXPECT_LE(c.bubble_fraction, theory + 1e-9) << "p=" << p << " m=" << m << " v=" << v;
        if (p > 1) EXPECT_LT(c.bubble_fraction, checked(ScheduleKind::OneFOneB, p, m).bubble_fraction);
        for (int s = 0; s < p; ++s)  // Megatron's warm-up: 2(p - s - 1) + (v - 1)p chunks, plus the one in flight
          EXPECT_LE(c.peak_activations[s], std::min(2 * (p - s - 1) + (v - 1) * p + 1, v * m)) << "p=" << p;
      }
}

TEST(PipelineSchedule, TableForFourStages) {
  // What the simulation gives for p = 4 (printed; the other tests pin the values).
  for (int m : {4, 8, 16}) {
    const double g = checked(ScheduleKind::GPipe, 4, m).bubble_fraction, f = checked(ScheduleKind::OneFOneB, 4, m).bubble_fraction,
                 i = checked(ScheduleKind::Interleaved, 4, m, 2).bubble_fraction,
                 z = checked(ScheduleKind::ZeroBubble, 4, m).bubble_fraction;
    std::printf("  p=4 m=%2d bubble: gpipe %.3f  1f1b %.3f  interleaved(v=2) %.3f  zb1p %.3f\n", m, g, f, i, z);
    EXPECT_LT(i, f);
    EXPECT_LT(z, f);
    EXPECT_EQ(g, f);
  }
  const ScheduleCheck c = checked(ScheduleKind::OneFOneB, 4, 8), gp = checked(ScheduleKind::GPipe, 4, 8);
  EXPECT_EQ(c.peak_activations, (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(gp.peak_activations, (std::vector<int>{8, 8, 8, 8}));
}

TEST(PipelineSchedule, PrintsOneLinePerRankWithItsSendsAndReceives) {
  const Schedule s = build_schedule({ScheduleKind::OneFOneB, 2, 2, 1});
  EXPECT_EQ(format_schedule(s),
            "rank 0: F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1\n"
            "rank 1: RECV_F0<0 F0 B0 SEND_B0>0 RECV_F1<0 F1 B1 SEND_B1>0\n");
  const Schedule i = build_schedule({ScheduleKind::Interleaved, 2, 2, 2});
  EXPECT_NE(format_schedule(i).find("F0.c1"), std::string::npos) << format_schedule(i);
  const Schedule z = build_schedule({ScheduleKind::ZeroBubble, 2, 1, 1});
  EXPECT_EQ(format_schedule(z), "rank 0: F0 SEND_F0>1 RECV_B0<1 I0 W0\nrank 1: RECV_F0<0 F0 I0 SEND_B0>0 W0\n");
}

TEST(PipelineSchedule, BrokenSchedulesAreNamed) {
  // Rank 0 waits for the gradient before it sends the activation the gradient depends on.
  Schedule s = build_schedule({ScheduleKind::OneFOneB, 2, 1, 1});
  auto& r0 = s.ranks[0];  // F0 SEND_F0 RECV_B0 B0
  std::swap(r0[1], r0[2]);
  ScheduleCheck c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("deadlocks"), std::string::npos) << c.problem;
  // A backward before its forward.
  s = build_schedule({ScheduleKind::GPipe, 1, 2, 1});  // F0 F1 B0 B1
  std::swap(s.ranks[0][1], s.ranks[0][3]);             // F0 B1 B0 F1
  c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("B of micro-batch 1 (stage 0) runs before its forward"), std::string::npos) << c.problem;
  // A micro-batch left out.
  s = build_schedule({ScheduleKind::GPipe, 1, 2, 1});
  s.ranks[0].pop_back();
  c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("micro-batch 1"), std::string::npos) << c.problem;
  // A forward whose input never arrives.
  s = build_schedule({ScheduleKind::GPipe, 2, 1, 1});
  s.ranks[1].erase(s.ranks[1].begin());  // drop RECV_F
  c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("has no RECV_F"), std::string::npos) << c.problem;
  // Twice the same action.
  s = build_schedule({ScheduleKind::GPipe, 1, 1, 1});
  s.ranks[0].push_back(s.ranks[0].back());
  c = check_schedule(s);
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.problem.find("appears twice"), std::string::npos) << c.problem;
}

TEST(PipelineSchedule, BadInputIsAnInputError) {
  EXPECT_THROW(parse_schedule("pipedream"), InputError);
  EXPECT_EQ(parse_schedule("zb1p"), ScheduleKind::ZeroBubble);
  EXPECT_THROW(build_schedule({ScheduleKind::Interleaved, 4, 6, 2}), InputError);  // m not a multiple of p
  EXPECT_THROW(build_schedule({ScheduleKind::OneFOneB, 2, 4, 2}), InputError);     // chunks without interleaving
  EXPECT_THROW(build_schedule({ScheduleKind::GPipe, 0, 4, 1}), InputError);
  EXPECT_THROW(build_schedule({ScheduleKind::GPipe, 2, 0, 1}), InputError);
  try {
    build_schedule({ScheduleKind::Interleaved, 4, 6, 2});
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("multiple of --pp 4"), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

// Stages of unequal work: rank 1 computes twice as long. GPipe, p = 2, m = 4 (F = 1, B = 2 on
// rank 0; 2 and 4 on rank 1): rank 1's forwards end at 3, 5, 7, 9, its backwards at 13, 17,
// 21, 25; rank 0's backwards follow each (2 long), the last ending at 27. Busy 12 + 24 of
// 2 x 27: the bubble is 1/3, against 1/5 with equal stages.
TEST(PipelineSchedule, RankFactorsSimulateStagesOfUnequalWork) {
  const Schedule s = build_schedule({ScheduleKind::GPipe, 2, 4, 1});
  ScheduleCost equal, skewed;
  equal.rank_scale = {1.0, 1.0};
  skewed.rank_scale = {1.0, 2.0};
  EXPECT_NEAR(check_schedule(s, equal).bubble_fraction, 0.2, 1e-12);
  const ScheduleCheck c = check_schedule(s, skewed);
  ASSERT_TRUE(c.ok) << c.problem;
  EXPECT_NEAR(c.makespan, 27.0, 1e-12);
  EXPECT_NEAR(c.bubble_fraction, 1.0 / 3.0, 1e-12);
  ScheduleCost wrong;
  wrong.rank_scale = {1.0};
  EXPECT_THROW(check_schedule(s, wrong), InputError);
  wrong.rank_scale = {1.0, 0.0};
  EXPECT_THROW(check_schedule(s, wrong), InputError);
}

}  // namespace
