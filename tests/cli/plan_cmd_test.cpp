// `paratrain plan --print-schedule` through the real binary: the schedule of each rank, the
// check, the bubble against the theory and the held activations; bad input exits 2 with one
// line; without --print-schedule it says the layout planner is not built yet.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "support/run_binary.h"

namespace {

using paratrain::test::run_paratrain;

TEST(PlanCommand, PrintsAndChecksAPipelineSchedule) {
  auto r = run_paratrain("plan --print-schedule --pp 2 --micro-batches 2 --pp-schedule 1f1b");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("rank 0: F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1: RECV_F0<0 F0 B0 SEND_B0>0 RECV_F1<0 F1 B1 SEND_B1>0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("check: ok"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.333 of the step (theory 0.333)"), std::string::npos) << r.out;  // (p-1)/(m+p-1)
  EXPECT_NE(r.out.find("per rank: 2 1\n"), std::string::npos) << r.out;
  r = run_paratrain("plan --print-schedule --pp 4 --micro-batches 8 --pp-schedule interleaved --pp-virtual 2");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("F0.c1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.158"), std::string::npos) << r.out;  // 3/19
  r = run_paratrain("plan --print-schedule --pp 4 --micro-batches 8 --pp-schedule zb1p");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find(" I0 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bubble: 0.200"), std::string::npos) << r.out;
}

TEST(PlanCommand, BadInputExitsTwoWithOneLine) {
  for (const std::string& args :
       {std::string("plan --print-schedule --pp 4 --micro-batches 6 --pp-schedule interleaved --pp-virtual 2"),
        std::string("plan --print-schedule --pp-schedule pipedream"), std::string("plan --print-schedule --pp 0"),
        std::string("plan")}) {
    auto r = run_paratrain(args);
    EXPECT_EQ(r.rc, 2) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << ": one line\n" << r.out;
  }
  EXPECT_NE(run_paratrain("plan").out.find("not built yet"), std::string::npos);
  EXPECT_NE(run_paratrain("plan --print-schedule --pp 4 --micro-batches 6 --pp-schedule interleaved --pp-virtual 2")
                .out.find("multiple of --pp 4"),
            std::string::npos);
}

}  // namespace
