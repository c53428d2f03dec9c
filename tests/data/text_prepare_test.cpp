#include "paratrain/data/text_prepare.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"
#include "paratrain/data/token_file.h"
#include "paratrain/data/tokenizer.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using paratrain::testing::read_bytes;
using paratrain::testing::TempDir;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

// A deterministic corpus of `n` lines built from a small vocabulary (plain lower-case ASCII
// with single spaces, so sentencepiece's normalisation leaves it unchanged).
std::vector<std::string> make_corpus(int n) {
  const char* words[] = {"the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "house", "in", "garden",
                         "quickly", "slowly", "bird", "sang", "song", "tree", "green", "water", "of", "and",
                         "small", "large", "river", "stone", "light", "dark", "wind", "over"};
  Generator g(5);
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    std::string s;
    const int len = 4 + static_cast<int>(g.below(10));
    for (int w = 0; w < len; ++w) {
      if (w) s += ' ';
      s += words[g.below(30)];
    }
    lines.push_back(s);
  }
  return lines;
}

std::string write_corpus(const TempDir& d, const std::string& name, const std::vector<std::string>& lines) {
  std::ofstream out(d.path(name));
  for (const auto& l : lines) out << l << "\n\n";  // blank lines are skipped
  return d.path(name);
}

PrepareOptions small_options(const std::string& text, const std::string& out) {
  PrepareOptions o;
  o.text_files = {text};
  o.vocab_size = 320;
  o.out_dir = out;
  o.val_fraction = 0.1;
  o.seed = 11;
  o.num_threads = 2;
  return o;
}

}  // namespace

TEST(TextPrepare, WordNetGlossLine) {
  EXPECT_EQ(wordnet_gloss("  1 This software and database is being provided"), "");
  EXPECT_EQ(wordnet_gloss("00001740 03 n 01 entity 0 003 ~ 00001930 n 0000 | that which is perceived; \"an entity\"  "),
            "that which is perceived; \"an entity\"");
  EXPECT_EQ(wordnet_gloss("no gloss here"), "");
}

TEST(TextPrepare, WordNetDir) {
  TempDir d;
  for (const char* pos : {"noun", "verb", "adj", "adv"}) {
    std::ofstream out(d.path(std::string("data.") + pos));
    out << "  1 licence line | with a bar\n";
    out << "00000001 00 x 01 w 0 000 | gloss of " << pos << "\n";
  }
  auto g = wordnet_glosses(d.dir.string());
  EXPECT_EQ(g, (std::vector<std::string>{"gloss of noun", "gloss of verb", "gloss of adj", "gloss of adv"}));
  fs::remove(d.path("data.adv"));
  auto msg = error_of<InputError>([&] { wordnet_glosses(d.dir.string()); });
  EXPECT_THAT(msg, HasSubstr(d.path("data.adv")));
}

TEST(TextPrepare, UnigramEntropy) {
  std::vector<uint16_t> u = {1, 2, 3, 4, 1, 2, 3, 4};
  EXPECT_NEAR(unigram_entropy(u), std::log(4.0), 1e-12);
  std::vector<uint16_t> one = {7, 7, 7};
  EXPECT_EQ(unigram_entropy(one), 0.0);
  EXPECT_EQ(unigram_entropy({}), 0.0);
}

TEST(TextPrepare, PreparesTokenFilesAndTokenizer) {
  TempDir d;
  auto lines = make_corpus(1500);
  auto text = write_corpus(d, "corpus.txt", lines);
  auto opt = small_options(text, d.path("out"));
  auto s = prepare_text(opt);
  EXPECT_EQ(s.documents_train + s.documents_val, 1500);
  EXPECT_GT(s.documents_val, 100);
  EXPECT_LT(s.documents_val, 200);
  EXPECT_EQ(s.vocab_size, 320);
  EXPECT_EQ(fs::path(s.train_path), fs::path(d.path("out/train.bin")));

  TokenFile train(s.train_path), val(s.val_path);
  EXPECT_EQ(train.size(), s.tokens_train);
  EXPECT_EQ(val.size(), s.tokens_val);
  EXPECT_LT(train.max_token(), 320);
  EXPECT_GT(s.unigram_entropy_nats, 2.0);
  EXPECT_LT(s.unigram_entropy_nats, std::log(320.0));
  EXPECT_NEAR(s.unigram_entropy_nats, unigram_entropy(train.tokens()), 1e-12);

  // The stream is <s> doc <s> doc ...; decoding recovers the documents in order.
  Tokenizer tok(s.tokenizer_path);
  EXPECT_EQ(tok.vocab_size(), 320);
  EXPECT_EQ(tok.bos_id(), 1);
  ASSERT_EQ(train[0], 1);
  std::vector<std::string> docs;
  std::vector<int32_t> cur;
  for (int64_t i = 1; i <= train.size(); ++i) {
    if (i == train.size() || train[i] == 1) {
      docs.push_back(tok.decode(cur));
      cur.clear();
    } else {
      cur.push_back(train[i]);
    }
  }
  ASSERT_EQ(static_cast<int64_t>(docs.size()), s.documents_train);
  // Train documents are the corpus minus the validation ones, in order.
  size_t j = 0;
  for (const auto& doc : docs) {
    while (j < lines.size() && lines[j] != doc) ++j;
    ASSERT_LT(j, lines.size()) << "document not in the corpus: " << doc;
    ++j;
  }
  EXPECT_EQ(tok.decode(tok.encode("the cat sat on a mat")), "the cat sat on a mat");
  // Byte fallback: characters never seen still round-trip.
  EXPECT_EQ(tok.decode(tok.encode("zebra \xc3\xa9\xe2\x82\xac")), "zebra \xc3\xa9\xe2\x82\xac");
  EXPECT_NE(format_summary(s).find("unigram entropy"), std::string::npos);
}

TEST(TextPrepare, DeterministicGivenSeed) {
  TempDir d;
  auto text = write_corpus(d, "corpus.txt", make_corpus(800));
  auto a = small_options(text, d.path("a"));
  auto b = small_options(text, d.path("b"));
  prepare_text(a);
  prepare_text(b);
  for (const char* f : {"train.bin", "val.bin", "tokenizer.model"})
    EXPECT_TRUE(read_bytes(d.path(std::string("a/") + f)) == read_bytes(d.path(std::string("b/") + f))) << f;
  // The thread count changes nothing but the number recorded in the model's trainer spec.
  auto t = small_options(text, d.path("t"));
  t.num_threads = 1;
  prepare_text(t);
  for (const char* f : {"train.bin", "val.bin"})
    EXPECT_TRUE(read_bytes(d.path(std::string("a/") + f)) == read_bytes(d.path(std::string("t/") + f))) << f;
  auto c = small_options(text, d.path("c"));
  c.seed = 12;
  prepare_text(c);
  EXPECT_TRUE(read_bytes(d.path("a/val.bin")) != read_bytes(d.path("c/val.bin")));
}

TEST(TextPrepare, NoValidation) {
  TempDir d;
  auto text = write_corpus(d, "corpus.txt", make_corpus(500));
  auto o = small_options(text, d.path("out"));
  o.val_fraction = 0;
  auto s = prepare_text(o);
  EXPECT_EQ(s.documents_val, 0);
  EXPECT_EQ(TokenFile(s.val_path).size(), 0);
}

TEST(TextPrepare, BadInputWritesNothing) {
  TempDir d;
  auto text = write_corpus(d, "corpus.txt", make_corpus(300));
  auto out = d.path("out");
  auto o = small_options(text, out);

  auto v = o;
  v.vocab_size = 100;
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(v); }), HasSubstr("--vocab-size 100 out of range"));
  v.vocab_size = 70000;
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(v); }), HasSubstr("--vocab-size 70000 out of range"));

  auto f = o;
  f.val_fraction = 1.0;
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(f); }), HasSubstr("--val-fraction 1 out of range"));

  auto m = o;
  m.text_files = {d.path("missing.txt")};
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(m); }), HasSubstr(d.path("missing.txt")));

  auto e = o;
  e.text_files = {d.path("empty.txt")};
  paratrain::testing::write_bytes(d.path("empty.txt"), "\n\n  \n");
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(e); }), HasSubstr("no non-empty lines"));

  auto n = o;
  n.text_files.clear();
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(n); }), HasSubstr("no input text"));

  auto big = o;
  big.vocab_size = 60000;  // far more pieces than this corpus can make
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(big); }), HasSubstr("training the tokenizer failed"));

  EXPECT_FALSE(fs::exists(out));

  paratrain::testing::write_bytes(d.path("file"), "x");
  auto fo = small_options(text, d.path("file"));
  EXPECT_THAT(error_of<InputError>([&] { prepare_text(fo); }), HasSubstr("exists and is not a directory"));
}

TEST(Tokenizer, BadModelFiles) {
  TempDir d;
  EXPECT_THAT(error_of<InputError>([&] { Tokenizer t(d.path("none.model")); }), HasSubstr("cannot open tokenizer model"));
  paratrain::testing::write_bytes(d.path("bad.model"), "this is not a protobuf");
  EXPECT_THAT(error_of<InputError>([&] { Tokenizer t(d.path("bad.model")); }), HasSubstr("is not a sentencepiece model"));
}

TEST(Tokenizer, DecodeRejectsOutOfRangeIds) {
  TempDir d;
  auto text = write_corpus(d, "corpus.txt", make_corpus(300));
  auto s = prepare_text(small_options(text, d.path("out")));
  Tokenizer tok(s.tokenizer_path);
  EXPECT_THAT(error_of<InputError>([&] { tok.decode({5, 320}); }), HasSubstr("token id 320 at position 1"));
  EXPECT_THAT(error_of<InputError>([&] { tok.piece(-1); }), HasSubstr("token id -1"));
  EXPECT_EQ(tok.piece(1), "<s>");
  auto moved = std::move(tok);
  EXPECT_EQ(moved.vocab_size(), 320);
}
