// base/log.h: PARATRAIN_LOG parsing (levels, per-tag levels, malformed values), the filter,
// the line format, and whole lines from many threads at once (stderr redirected to a file).
#include "paratrain/base/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>
#include <vector>

using namespace paratrain;
using log::Level;
using log::Tag;

namespace {

// Runs fn with fd 2 pointing at a temporary file; returns what was written to it.
template <typename Fn>
std::string capture_stderr(Fn fn) {
  char path[] = "/tmp/pt_log_test_XXXXXX";
  int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  int saved = ::dup(2);
  ::dup2(fd, 2);
  fn();
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  std::filesystem::remove(path);
  return ss.str();
}

// Restores the environment-derived configuration after each test.
class Log : public ::testing::Test {
 protected:
  void TearDown() override {
    ::unsetenv("PARATRAIN_LOG");
    log::set_config(log::Config{}, -1);
  }
};

}  // namespace

TEST_F(Log, ParsesALevelAndPerTagLevels) {
  log::Config d = log::parse("");
  for (size_t t = 0; t < log::kTagCount; ++t) EXPECT_EQ(d.least[t], Level::kInfo);
  log::Config w = log::parse("warn");
  EXPECT_EQ(w.least_for(Tag::kComm), Level::kWarn);
  EXPECT_EQ(w.least_for(Tag::kTrain), Level::kWarn);
  log::Config m = log::parse("error,comm=debug,launch=info");
  EXPECT_EQ(m.least_for(Tag::kComm), Level::kDebug);
  EXPECT_EQ(m.least_for(Tag::kLaunch), Level::kInfo);
  EXPECT_EQ(m.least_for(Tag::kTrain), Level::kError);
  EXPECT_EQ(m.least_for(Tag::kCheckpoint), Level::kError);
  log::Config only_tag = log::parse("data=debug");  // the others keep the default, info
  EXPECT_EQ(only_tag.least_for(Tag::kData), Level::kDebug);
  EXPECT_EQ(only_tag.least_for(Tag::kComm), Level::kInfo);
}

TEST_F(Log, MalformedValuesAreInputErrorsNamingTheVariable) {
  for (const char* bad : {"bogus", "verbose", "info,", ",info", "info,warn", "comm=loud", "network=debug",
                          "comm=debug,comm=info", "INFO", "comm"}) {
    try {
      log::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const InputError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("PARATRAIN_LOG='" + std::string(bad) + "'"), std::string::npos) << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << what;  // one line
    }
  }
  ::setenv("PARATRAIN_LOG", "bogus", 1);
  EXPECT_THROW(log::configure_from_env(), InputError);
}

TEST_F(Log, LevelsFilterPerTag) {
  log::set_config(log::parse("warn,comm=debug"), 3);
  EXPECT_TRUE(log::enabled(Tag::kComm, Level::kDebug));
  EXPECT_TRUE(log::enabled(Tag::kComm, Level::kError));
  EXPECT_FALSE(log::enabled(Tag::kTrain, Level::kInfo));
  EXPECT_FALSE(log::enabled(Tag::kTrain, Level::kDebug));
  EXPECT_TRUE(log::enabled(Tag::kTrain, Level::kWarn));
  EXPECT_TRUE(log::enabled(Tag::kLaunch, Level::kError));
  int formatted = 0;
  auto counted = [&formatted] {
    ++formatted;
    return "x";
  };
  const std::string out = capture_stderr([&] {
    PT_LOG_INFO(kTrain, "hidden ", counted());  // not shown: its parts are never formatted
    PT_LOG_DEBUG(kComm, "shown ", counted());
    PT_LOG_WARN(kTrain, "also shown");
  });
  EXPECT_EQ(formatted, 1);
  EXPECT_EQ(out, "[rank 3 comm] debug: shown x\n[rank 3 train] warn: also shown\n");
}

TEST_F(Log, TheLineFormat) {
  EXPECT_EQ(log::format_line(Tag::kComm, Level::kInfo, 1, "hello"), "[rank 1 comm] info: hello\n");
  EXPECT_EQ(log::format_line(Tag::kLaunch, Level::kDebug, -1, "spawned"), "[launch] debug: spawned\n");
  EXPECT_EQ(log::format_line(Tag::kCheckpoint, Level::kError, 0, "two\nlines"), "[rank 0 checkpoint] error: two lines\n");
  EXPECT_EQ(log::name(Tag::kParallel), "parallel");
  EXPECT_EQ(log::name(Level::kWarn), "warn");
}

TEST_F(Log, ConfiguresFromTheEnvironmentWithTheRank) {
  ::setenv("PARATRAIN_LOG", "error,data=debug", 1);
  ::setenv("RANK", "5", 1);
  log::configure_from_env();
  ::unsetenv("RANK");
  EXPECT_TRUE(log::enabled(Tag::kData, Level::kDebug));
  EXPECT_FALSE(log::enabled(Tag::kComm, Level::kWarn));
  const std::string out = capture_stderr([] { PT_LOG_DEBUG(kData, "token file t.bin"); });
  EXPECT_EQ(out, "[rank 5 data] debug: token file t.bin\n");
}

TEST_F(Log, LinesFromManyThreadsNeverInterleave) {
  log::set_config(log::parse("debug"), 0);
  constexpr int kThreads = 8, kLines = 300;
  const std::string pad(200, 'p');  // long lines make a torn write likely if writes were split
  const std::string out = capture_stderr([&] {
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < kLines; ++i) PT_LOG_INFO(kParallel, "thread ", t, " line ", i, " ", pad, " end");
      });
    for (auto& th : ts) th.join();
  });
  const std::regex line_re("\\[rank 0 parallel\\] info: thread ([0-9]+) line ([0-9]+) p{200} end");
  std::vector<std::vector<bool>> seen(kThreads, std::vector<bool>(kLines, false));
  std::istringstream in(out);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "torn line: " << line.substr(0, 120);
    const int t = std::stoi(m[1]), i = std::stoi(m[2]);
    ASSERT_FALSE(seen[t][i]) << line.substr(0, 60);
    seen[t][i] = true;
    ++n;
  }
  EXPECT_EQ(n, kThreads * kLines);
}
