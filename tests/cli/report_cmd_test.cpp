// `paratrain report`: pages made from a real 2-rank run's metrics and from synthetic metrics
// and trace files, opened in headless Chromium; the rendered DOM must hold every chart with
// as many points as the metrics have lines carrying its field, and a "not in this run" note
// where the run lacks the data. Bad input exits 2 naming the file and line.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "paratrain/data/token_file.h"
#include "support/run_binary.h"

using namespace paratrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using paratrain::test::CommandResult;

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool have_chromium() { return paratrain::test::run_shell_line("command -v chromium >/dev/null 2>&1").rc == 0; }

// One chart's container in the dumped DOM: its opening tag and its content up to </div>.
struct Chart {
  std::string tag, body;
  bool found = false;
  std::string attr(const std::string& name) const {
    std::smatch m;
    if (std::regex_search(tag, m, std::regex(" " + name + "=\"([^\"]*)\""))) return m[1].str();
    return "";
  }
  // data-points of the <g class="series" data-series="NAME">, -1 when missing.
  int series_points(const std::string& name) const {
    const std::string key = "data-series=\"" + name + "\" data-points=\"";
    const size_t at = body.find(key);
    return at == std::string::npos ? -1 : std::stoi(body.substr(at + key.size()));
  }
};

Chart chart(const std::string& dom, const std::string& id) {
  Chart c;
  const size_t at = dom.find("id=\"chart-" + id + "\"");
  if (at == std::string::npos) return c;
  const size_t open = dom.rfind('<', at), close = dom.find('>', at), end = dom.find("</div>", close);
  c.tag = dom.substr(open, close - open + 1);
  c.body = dom.substr(close + 1, end - close - 1);
  c.found = true;
  return c;
}

class Report : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_report_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return dir_ + "/" + n; }
  CommandResult paratrain(const std::string& args, int timeout_s = 60) {
    return paratrain::test::run_paratrain(args, timeout_s);
  }
  // The DOM after the page's scripts ran, as headless Chromium prints it.
  std::string render(const std::string& html) {
    CommandResult r = paratrain::test::run_shell_line(
        "timeout 90 chromium --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir=" + path("chrome") +
        " --dump-dom file://" + html + " 2>/dev/null");
    EXPECT_EQ(r.rc, 0) << "chromium failed on " << html;
    return r.out;
  }
  // Counts the lines of a metrics file carrying `key` (training or evaluation lines).
  int lines_with(const std::string& metrics, const std::string& key, bool eval) {
    std::ifstream in(metrics);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const json j = json::parse(line);
      const bool is_eval = j.value("eval", false);
      if (is_eval == eval && j.contains(key) && !j[key].is_null()) ++n;
    }
    return n;
  }
  static void expect_no_url(const std::string& html) {
    EXPECT_EQ(html.find("http://"), std::string::npos);
    EXPECT_EQ(html.find("https://"), std::string::npos);
    EXPECT_EQ(html.find("src="), std::string::npos);  // no external script or image
  }
  static void expect_rendered(const std::string& dom, const std::string& id, int points) {
    const Chart c = chart(dom, id);
    ASSERT_TRUE(c.found) << id;
    EXPECT_EQ(c.attr("data-rendered"), "1") << id << ": " << c.tag << c.body.substr(0, 300);
    EXPECT_EQ(c.attr("data-points"), std::to_string(points)) << id;
    EXPECT_NE(c.body.find("<svg"), std::string::npos) << id;
  }
  static void expect_absent(const std::string& dom, const std::string& id) {
    const Chart c = chart(dom, id);
    ASSERT_TRUE(c.found) << id;
    EXPECT_EQ(c.attr("data-absent"), "1") << id;
    EXPECT_NE(c.body.find("not in this run"), std::string::npos) << id;
    EXPECT_EQ(c.body.find("<svg"), std::string::npos) << id;
  }
  std::string dir_;
};

// 4 ranks' synthetic metrics: every field, busbw per group on 6 of the 8 steps.
void write_synthetic_metrics(const std::string& path) {
  std::ofstream f(path);
  for (int s = 0; s < 8; ++s) {
    json j = {{"step", s},
              {"loss", 5.0 - 0.3 * s},
              {"lr", 1e-3},
              {"grad_norm", 1.0},
              {"tokens_per_s", 1000.0 + 10 * s},
              {"step_ms", 100.0},
              {"compute_ms", 90.0},
              {"comm_ms", 20.0},
              {"exposed_comm_ms", 10.0},
              {"mfu", 0.2},
              {"loss_scale", 1.0},
              {"bubble_fraction", 0.25},
              {"data_wait_ms", 2.0},
              {"mem_peak_bytes", {1 << 20, 2 << 20, 3 << 20, 4 << 20}},
              {"step_ms_per_rank", {90.0, 95.0, 100.0, 100.0 + s}},
              {"some_future_key", {{"nested", true}}}};
    if (s >= 2) j["busbw_gbps"] = {{"dp", 1.5 + 0.1 * s}, {"tp", 3.0}};
    f << j.dump() << "\n";
    if (s == 3 || s == 7) f << json{{"step", s}, {"eval", true}, {"val_loss", 5.1 - 0.3 * s}}.dump() << "\n";
  }
}

// Per-rank trace files of 2 ranks, 3 steps each (each: a "step" span holding forward, a
// backward B/E pair and the optimizer on tid 1, an all-reduce on tid 2), plus a counter event
// and track names. The middle step holds 5 spans per rank.
void write_synthetic_trace(const std::string& dir) {
  fs::create_directories(dir);
  for (int rank = 0; rank < 2; ++rank) {
    json ev = json::array();
    ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
    ev.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", 2}, {"args", {{"name", "comm"}}}});
    for (int s = 0; s < 3; ++s) {
      const double t = 10000.0 * s;
      ev.push_back({{"name", "step"}, {"ph", "X"}, {"ts", t}, {"dur", 9000}, {"tid", 1}, {"args", {{"step", s}}}});
      ev.push_back({{"name", "forward"}, {"cat", "compute"}, {"ph", "X"}, {"ts", t + 100}, {"dur", 3000}, {"tid", 1}});
      ev.push_back({{"name", "backward"}, {"cat", "compute"}, {"ph", "B"}, {"ts", t + 3200}, {"tid", 1}});
      ev.push_back({{"name", "backward"}, {"ph", "E"}, {"ts", t + 7200}, {"tid", 1}});
      ev.push_back({{"name", "allreduce bucket 0"}, {"cat", "comm"}, {"ph", "X"}, {"ts", t + 5000}, {"dur", 2500},
                    {"tid", 2}, {"args", {{"bytes", 1 << 20}, {"busbw_gbps", 1.2}}}});
      ev.push_back({{"name", "optimizer"}, {"cat", "optim"}, {"ph", "X"}, {"ts", t + 7600}, {"dur", 1200}, {"tid", 1}});
      ev.push_back({{"name", "mem"}, {"ph", "C"}, {"ts", t}, {"args", {{"bytes", 1}}}});
    }
    std::ofstream(dir + "/rank" + std::to_string(rank) + ".trace.json") << json{{"traceEvents", ev}}.dump();
  }
}

}  // namespace

TEST_F(Report, RealTwoRankRunRendersEveryChartItHasData) {
  if (!have_chromium()) GTEST_SKIP() << "chromium is not installed (scripts/install_deps.sh installs it)";
  std::vector<uint16_t> t(20000);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + i / 13) % 256);
  data::write_token_file(path("t.bin"), t);
  const std::string metrics = path("m.jsonl");
  CommandResult train = paratrain(
      "launch --nproc-per-node 2 -- " PARATRAIN_BIN " train --model gpt-nano --data " + path("t.bin") +
          " --val-data " + path("t.bin") + " --steps 6 --eval-every 3 --eval-batches 1 --micro-batch 2 --quiet"
          " --metrics " + metrics, 120);
  ASSERT_EQ(train.rc, 0) << train.out;
  const std::string html = path("report.html");
  CommandResult r = paratrain("report " + metrics + " -o " + html);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("6 steps"), std::string::npos) << r.out;
  expect_no_url(read_text(html));

  const int steps = lines_with(metrics, "loss", false), evals = lines_with(metrics, "val_loss", true);
  ASSERT_EQ(steps, 6);
  ASSERT_GE(evals, 2);
  const std::string dom = render(html);
  ASSERT_NE(dom.find("data-report-rendered=\"1\""), std::string::npos) << dom.substr(0, 2000);
  expect_rendered(dom, "loss", steps + evals);
  EXPECT_EQ(chart(dom, "loss").series_points("loss"), steps);
  EXPECT_EQ(chart(dom, "loss").series_points("val_loss"), evals);
  expect_rendered(dom, "throughput", lines_with(metrics, "tokens_per_s", false) + lines_with(metrics, "mfu", false));
  EXPECT_EQ(chart(dom, "throughput").series_points("tokens_per_s"), steps);
  expect_rendered(dom, "split", lines_with(metrics, "step_ms", false));
  expect_rendered(dom, "memory", 2);  // one bar per rank
  expect_rendered(dom, "step_time", 2);
  EXPECT_EQ(chart(dom, "step_time").series_points("max ms"), 2);
  // The trainer has no pipeline here: the split says the bubble is not in this run.
  EXPECT_NE(dom.find("pipeline bubble: not in this run"), std::string::npos);
  if (const int bw = lines_with(metrics, "busbw_gbps", false); bw > 0) expect_rendered(dom, "busbw", bw);
  else expect_absent(dom, "busbw");
  expect_absent(dom, "timeline");  // no --trace given
  EXPECT_NE(dom.find("id=\"summary\""), std::string::npos);
}

TEST_F(Report, SyntheticMetricsAndTraceRenderBusbwBubbleAndTimeline) {
  if (!have_chromium()) GTEST_SKIP() << "chromium is not installed (scripts/install_deps.sh installs it)";
  write_synthetic_metrics(path("m.jsonl"));
  write_synthetic_trace(path("trace"));
  const std::string html = path("report.html");
  CommandResult r = paratrain("report " + path("m.jsonl") + " --trace " + path("trace") + " -o " + html);
  ASSERT_EQ(r.rc, 0) << r.out;
  expect_no_url(read_text(html));
  const std::string dom = render(html);
  expect_rendered(dom, "loss", 8 + 2);
  expect_rendered(dom, "throughput", 16);
  expect_rendered(dom, "split", 8);
  const Chart split = chart(dom, "split");
  for (const char* part : {"compute", "exposed comm", "bubble", "data wait", "other"})
    EXPECT_EQ(split.series_points(part), 8) << part;
  expect_rendered(dom, "memory", 4);
  expect_rendered(dom, "step_time", 4);
  expect_rendered(dom, "busbw", 12);  // 6 lines x 2 groups
  EXPECT_EQ(chart(dom, "busbw").series_points("dp"), 6);
  EXPECT_EQ(chart(dom, "busbw").series_points("tp"), 6);
  // The middle step: 5 spans per rank (step, forward, backward, all-reduce, optimizer).
  expect_rendered(dom, "timeline", 10);
  const Chart tl = chart(dom, "timeline");
  EXPECT_NE(tl.body.find("rank 1 / comm"), std::string::npos);
  EXPECT_NE(tl.body.find("step 1 (span 2 of 3 on rank 0)"), std::string::npos);
  const size_t note = dom.find("not in this run");
  EXPECT_EQ(note, std::string::npos) << "every field is present, yet: "
                                     << dom.substr(note == std::string::npos ? 0 : note - 200, 300);
}

TEST_F(Report, BadInputExitsTwoNamingTheLine) {
  {
    std::ofstream f(path("bad.jsonl"));
    f << R"({"step": 0, "loss": 1.0})" << "\n\n" << R"({"step": 1, "loss": )" << "\n";
  }
  CommandResult r = paratrain("report " + path("bad.jsonl") + " -o " + path("r.html"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("bad.jsonl:3"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_FALSE(fs::exists(path("r.html")));

  std::ofstream(path("empty.jsonl")).close();
  r = paratrain("report " + path("empty.jsonl") + " -o " + path("r.html"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("empty"), std::string::npos) << r.out;
  r = paratrain("report " + path("missing.jsonl") + " -o " + path("r.html"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("missing.jsonl"), std::string::npos) << r.out;

  std::ofstream(path("ok.jsonl")) << R"({"step": 0, "loss": 1.0})" << "\n";
  fs::create_directories(path("notrace"));
  r = paratrain("report " + path("ok.jsonl") + " --trace " + path("notrace") + " -o " + path("r.html"));
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("trace.json"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(path("r.html")));

  r = paratrain("report --help");
  EXPECT_EQ(r.rc, 0);
  EXPECT_NE(r.out.find("--trace"), std::string::npos) << r.out;
  r = paratrain("report");
  EXPECT_EQ(r.rc, 2) << r.out;
}
