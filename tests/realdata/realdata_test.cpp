// Training on real data, end to end through the `paratrain` binary, to quality floors:
//  - the CNN on Fashion-MNIST (Debian's dataset-fashion-mnist) reaches >= 90% test accuracy
//    within 3 epochs, in one process and with 2 data-parallel ranks under `paratrain launch`;
//  - a GPT on the WordNet gloss corpus (Debian's wordnet-base, tokenized by `data prepare`)
//    brings the validation loss well below the unigram entropy of the tokens (the loss of a
//    model that ignores context), and `paratrain sample` prints text made of real words; 2
//    data-parallel ranks at the same global batch reach the same validation loss.
// These take minutes; they carry a longer timeout (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include "support/run_binary.h"
#include <sys/wait.h>

#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "paratrain/data/text_prepare.h"

namespace fs = std::filesystem;

namespace {

using Result = paratrain::test::CommandResult;

Result run(const std::string& args, int timeout_s = 120) {
  return paratrain::test::run_paratrain(args, timeout_s);
}

std::vector<nlohmann::json> eval_lines(const std::string& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream f(metrics);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.value("eval", false)) out.push_back(j);
  }
  return out;
}

class RealData : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_realdata_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

}  // namespace

TEST_F(RealData, CnnFashionMnistReaches90PercentIn3Epochs) {
  Result r = run("train --model cnn --dataset fashion-mnist --epochs 3 --micro-batch 64 --threads 1 --quiet --metrics " +
                     dir_ + "/m.jsonl",
                 1400);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto evals = eval_lines(dir_ + "/m.jsonl");
  ASSERT_FALSE(evals.empty());
  const double acc = evals.back()["accuracy"];
  std::printf("  CNN test accuracy after 3 epochs: %.4f\n", acc);
  EXPECT_GE(acc, 0.90);
}

TEST_F(RealData, CnnFashionMnistTwoRanksReaches90PercentIn3Epochs) {
  // The same global batch of 64 as the one-process run: 2 ranks x 32 images.
  Result r = run("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                     " train --model cnn --dataset fashion-mnist --epochs 3 --micro-batch 32 --threads 1 --quiet "
                     "--metrics " + dir_ + "/m.jsonl",
                 1400);
  ASSERT_EQ(r.rc, 0) << r.out;
  auto evals = eval_lines(dir_ + "/m.jsonl");
  ASSERT_FALSE(evals.empty());
  const double acc = evals.back()["accuracy"];
  std::printf("  CNN test accuracy after 3 epochs on 2 ranks: %.4f\n", acc);
  EXPECT_GE(acc, 0.90);
}

TEST_F(RealData, GptOnWordNetBeatsUnigramEntropyAndSamplesRealWords) {
  Result p = run("data prepare --wordnet --vocab-size 4096 --out " + dir_ + "/data", 600);
  ASSERT_EQ(p.rc, 0) << p.out;
  const auto pos = p.out.find("unigram entropy of train tokens: ");
  ASSERT_NE(pos, std::string::npos) << p.out;
  const double entropy = std::stod(p.out.substr(pos + 33));

  Result t = run("train --model gpt --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --vocab-size 4096 --data " +
                     dir_ + "/data/train.bin --val-data " + dir_ +
                     "/data/val.bin --micro-batch 16 --steps 600 --lr 2e-3 --warmup-steps 20 --eval-batches 40 "
                     "--threads 1 --quiet --metrics " +
                     dir_ + "/m.jsonl --save-final " + dir_ + "/model.safetensors",
                 1200);
  ASSERT_EQ(t.rc, 0) << t.out;
  auto evals = eval_lines(dir_ + "/m.jsonl");
  ASSERT_FALSE(evals.empty());
  const double val = evals.back()["val_loss"];
  std::printf("  validation loss %.3f nats, unigram entropy %.3f nats\n", val, entropy);
  EXPECT_LT(val, entropy - 1.0) << "the model should beat a context-free model by a wide margin";

  // The same run on 2 data-parallel ranks (global batch 2 x 8 = 16 sequences, as above).
  Result t2 = run("launch --nproc-per-node 2 -- " + std::string(PARATRAIN_BIN) +
                      " train --model gpt --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --vocab-size 4096 "
                      "--data " + dir_ + "/data/train.bin --val-data " + dir_ +
                      "/data/val.bin --micro-batch 8 --steps 600 --lr 2e-3 --warmup-steps 20 --eval-batches 40 "
                      "--threads 1 --quiet --metrics " + dir_ + "/m2.jsonl",
                  1200);
  ASSERT_EQ(t2.rc, 0) << t2.out;
  auto evals2 = eval_lines(dir_ + "/m2.jsonl");
  ASSERT_FALSE(evals2.empty());
  const double val2 = evals2.back()["val_loss"];
  std::printf("  validation loss on 2 ranks %.4f nats, on 1 rank %.4f nats\n", val2, val);
  EXPECT_NEAR(val2, val, 0.03) << "2 ranks at the same global batch should reach the same validation loss";

  Result s = run("sample --model " + dir_ + "/model.safetensors --tokenizer " + dir_ +
                     "/data/tokenizer.model --prompt \"a small\" --max-tokens 60 --temperature 0.7 --seed 7",
                 300);
  ASSERT_EQ(s.rc, 0) << s.out;
  std::printf("  sample: %s", s.out.c_str());
  // Real words: most words of the sample occur in the WordNet glosses.
  std::set<std::string> vocab;
  for (const std::string& gloss : paratrain::data::wordnet_glosses("/usr/share/wordnet")) {
    std::string w;
    for (char c : gloss + " ") {
      if (std::isalpha(static_cast<unsigned char>(c))) {
        w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
      } else if (!w.empty()) {
        vocab.insert(w);
        w.clear();
      }
    }
  }
  int words = 0, known = 0;
  std::string w;
  for (char c : s.out + " ") {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      w.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    } else if (!w.empty()) {
      words++;
      known += vocab.count(w) > 0;
      w.clear();
    }
  }
  std::printf("  %d of %d sampled words are WordNet gloss words\n", known, words);
  EXPECT_GE(words, 15);
  EXPECT_GE(known, words * 85 / 100);
}
