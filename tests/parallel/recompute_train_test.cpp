// `paratrain train --recompute full` through the real binary: the same weights byte for byte
// and the same losses as without it (dropout on, so the masks must repeat), under data
// parallelism, tensor parallelism and ZeRO 3, with the forward keeping far less; bad values
// exit 2 with one line.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "parallel/train_multirank_util.h"

using namespace paratrain;

namespace {

using paratrain::test::max_rel_diff;
using paratrain::test::read_text;
using paratrain::test::Result;
using paratrain::test::TrainMultiRank;

class RecomputeTrain : public TrainMultiRank {
 protected:
  void train(int n, const std::string& extra) {
    Result r = launch(n, "train --model gpt-nano --data t.bin --n-head 4 --dropout 0.1 --micro-batch 2 --grad-accum 2 "
                         "--steps 6 --threads 1 --quiet --deterministic " + extra, 120);
    ASSERT_TRUE(r.ok()) << r.output;
  }
};

TEST_F(RecomputeTrain, FullRecomputeIsBitIdenticalUnderEveryLayoutAndKeepsLess) {
  for (const std::string& layout : {std::string("--dp 2"), std::string("--tp 2"), std::string("--dp 2 --zero 3")}) {
    train(2, layout + " --save-final a.st --metrics a.jsonl");
    train(2, layout + " --recompute full --save-final b.st --metrics b.jsonl");
    EXPECT_TRUE(read_text(path("b.st")) == read_text(path("a.st")))
        << layout << ": --recompute full changed the weights (max rel " << max_rel_diff(path("b.st"), path("a.st")) << ")";
    const auto a = steps_of("a.jsonl"), b = steps_of("b.jsonl");
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(b[i]["loss"], a[i]["loss"]) << layout << " step " << i;
    const double kept = b.back()["mem_activation_bytes"].get<double>(), plain = a.back()["mem_activation_bytes"].get<double>();
    std::printf("  %s: the forward keeps %.2f MiB, %.2f MiB with --recompute full\n", layout.c_str(), plain / (1 << 20),
                kept / (1 << 20));
    EXPECT_LT(kept, 0.5 * plain) << layout;
    EXPECT_EQ(b.back()["recompute"], "full");
  }
}

TEST_F(RecomputeTrain, BadValuesExitTwoWithOneLine) {
  for (const auto& [args, says] : std::vector<std::pair<std::string, std::string>>{
           {"--model mlp --dataset fashion-mnist --data-dir nowhere --recompute selective",
            "--recompute selective recomputes the GPT models"},
           {"--model gpt-nano --data t.bin --recompute some", "--recompute"},
           {"--model mlp --dataset fashion-mnist --data-dir nowhere --recompute full", "recomputes the GPT models"}}) {
    Result r = single("train --steps 1 --quiet " + args);
    ASSERT_EQ(r.codes[0], 2) << args << "\n" << r.output;
    EXPECT_NE(r.output.find(says), std::string::npos) << args << "\n" << r.output;
    const std::string body = r.output.substr(r.output.find('\n') + 1);
    EXPECT_EQ(std::count(body.begin(), body.end(), '\n'), 1) << "one line: " << body;
  }
}

}  // namespace
