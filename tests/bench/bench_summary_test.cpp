// make bench's bookkeeping (bench/bench_results.py, bench/summary.py): the steady-state window
// taken from paratrain's metrics, pass/fail against a floor, and the summary JSON. The
// benchmarks themselves measure and are not run here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

const std::string kBench = std::string(PARATRAIN_SOURCE_DIR) + "/bench";

class BenchSummary : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_bench_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Runs a Python snippet with bench/ on sys.path; returns its exit code.
  int python(const std::string& code) {
    const std::string script = dir_ + "/snippet.py";
    std::ofstream(script) << "import sys\nsys.path.insert(0, '" << kBench << "')\n" << code;
    return std::system(("cd " + dir_ + " && timeout 60 /usr/bin/python3 " + script + " > " + dir_ +
                        "/out.txt 2>&1").c_str());
  }
  std::string dir_;
};

TEST_F(BenchSummary, FloorsDecidePassAndTheJsonHoldsEveryRow) {
  ASSERT_EQ(python("import os\n"
                   "os.environ['BENCH_RESULTS_DIR'] = 'rows'\n"
                   "from bench_results import row, record\n"
                   "record('a', [row('train', 'tokens/s', 150, 100, 'torch', 1.2),\n"
                   "             row('train', 'memory', 50, 100, 'torch', 1.0, 'lower'),\n"
                   "             row('ddp', 'scaling', 0.90, 0.80, 'torch', 0.95, judge='ours'),\n"
                   "             row('ddp', 'mfu', 0.5, 0.4, 'torch', None)])\n"),
            0);
  const std::string out = dir_ + "/latest.json";
  ASSERT_EQ(std::system(("timeout 60 /usr/bin/python3 " + kBench + "/summary.py " + dir_ + "/rows " + out +
                         " comm_allreduce.sh > " + dir_ + "/table.txt").c_str()),
            0);
  nlohmann::json j = nlohmann::json::parse(std::ifstream(out));
  ASSERT_EQ(j["rows"].size(), 4u);
  EXPECT_EQ(j["rows"][0]["pass"], true);   // 1.5x >= 1.2x
  EXPECT_DOUBLE_EQ(j["rows"][0]["ratio"].get<double>(), 1.5);
  EXPECT_EQ(j["rows"][1]["pass"], true);   // 0.5x <= 1.0x, lower is better
  EXPECT_EQ(j["rows"][2]["pass"], false);  // the floor is on ours: 0.90 < 0.95, though 1.125x the peer
  EXPECT_TRUE(j["rows"][3]["pass"].is_null());
  EXPECT_EQ(j["failed"], nlohmann::json::array({"comm_allreduce.sh"}));
  EXPECT_FALSE(j["cpu"]["model"].get<std::string>().empty());
  std::ifstream t(dir_ + "/table.txt");
  std::string table((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  EXPECT_NE(table.find("2 passed, 1 below their floor, 1 benchmarks failed to run"), std::string::npos) << table;
}

TEST_F(BenchSummary, SteadyStateStartsWhenPageFaultsStop) {
  // Steps 0-4 fault (first touch), step 5 is quiet, 6 faults again, 7 and 8 are quiet: warm-up
  // ends after two quiet steps in a row (the PyTorch peers' rule too), so the timed steps are
  // 9, 10, 11.
  std::ofstream m(dir_ + "/m.jsonl");
  const int faults[] = {9000, 5000, 3000, 1000, 800, 10, 4000, 0, 0, 0, 0, 0, 0};
  for (int s = 0; s < 13; ++s) m << nlohmann::json{{"step", s}, {"step_ms", 100.0 + s}, {"page_faults", faults[s]}}.dump() << "\n";
  m << nlohmann::json{{"step", 12}, {"eval", true}, {"val_loss", 1.0}}.dump() << "\n";
  m.close();
  ASSERT_EQ(python("from bench_results import steady_steps, spread\n"
                   "lines, warm = steady_steps('m.jsonl', 3)\n"
                   "assert warm == 9, warm\n"
                   "assert [l['step'] for l in lines] == [9, 10, 11], lines\n"
                   "med, slow, fast = spread([100.0, 300.0, 200.0], 1000)\n"
                   "assert abs(med - 5000) < 1e-9 and abs(slow - 1000 / 0.3) < 1e-9 and fast == 10000, (med, slow, fast)\n"
                   "try:\n"
                   "    steady_steps('m.jsonl', 5)\n"
                   "    sys.exit(3)\n"
                   "except SystemExit as e:\n"
                   "    assert 'fewer than' in str(e), e\n"),
            0)
      << std::ifstream(dir_ + "/out.txt").rdbuf();
}

}  // namespace
