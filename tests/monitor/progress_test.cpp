#include "paratrain/monitor/progress.h"

#include <gtest/gtest.h>

#include <sstream>

#include "paratrain/monitor/metrics.h"

using namespace paratrain::monitor;

TEST(ProgressLine, TerminalRewritesOneLineInPlace) {
  std::ostringstream out;
  ProgressLine p(out, 3, /*is_terminal=*/true);
  for (int s = 0; s < 3; ++s) p.update(s, "step " + std::to_string(s + 1));
  p.finish();
  EXPECT_EQ(out.str(), "\rstep 1   \rstep 2   \rstep 3   \n");
}

TEST(ProgressLine, LogsGetWholeLinesAtMostTwentyTimes) {
  std::ostringstream out;
  ProgressLine p(out, 100, /*is_terminal=*/false);
  for (int s = 0; s < 100; ++s) p.update(s, "step " + std::to_string(s + 1));
  p.finish();
  const std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  int lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 21);  // the first step, then every 5th (5, 10, ..., 100)
  EXPECT_EQ(text.rfind("step 100\n"), text.size() - 9);
  EXPECT_EQ(text.find("step 1\n"), 0u);
}

TEST(FormatDuration, Units) {
  EXPECT_EQ(format_duration(45), "45s");
  EXPECT_EQ(format_duration(65), "1m05s");
  EXPECT_EQ(format_duration(7380), "2h03m");
  EXPECT_EQ(format_duration(-1), "?");
}
