#include "paratrain/autograd/profiler.h"

#include <gtest/gtest.h>

using namespace paratrain::autograd;

TEST(Profiler, ReportSortsOpsByTimeWithCallsAndShares) {
  profiler::reset();
  EXPECT_EQ(profiler::report(), "");
  profiler::record("linear", false, 0.003);
  profiler::record("linear", true, 0.006);
  profiler::record("linear", true, 0.002);
  profiler::record("gelu", false, 0.001);
  const std::string r = profiler::report();
  const auto bwd = r.find("linear (backward)"), fwd = r.find("linear  "), gelu = r.find("gelu");
  ASSERT_NE(bwd, std::string::npos) << r;
  ASSERT_NE(fwd, std::string::npos) << r;
  ASSERT_NE(gelu, std::string::npos) << r;
  EXPECT_LT(bwd, fwd);
  EXPECT_LT(fwd, gelu);
  EXPECT_NE(r.find("2 calls"), std::string::npos) << r;
  EXPECT_NE(r.find("66.7%"), std::string::npos) << r;  // 8 of 12 ms
  profiler::reset();
}
