#include "paratrain/data/text_prepare.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <thread>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/error.h"
#include "paratrain/data/token_file.h"
#include "paratrain/tensor/random.h"

// sentencepiece's log threshold (exported by libsentencepiece, not declared in its public
// headers). Training logs every step at INFO to stderr; we keep warnings and errors only.
namespace sentencepiece::logging {
int GetMinLogLevel();
void SetMinLogLevel(int v);
}  // namespace sentencepiece::logging

namespace paratrain::data {

namespace {

// Raises sentencepiece's log threshold for the lifetime of the guard.
class QuietSentencepiece {
 public:
  QuietSentencepiece() : saved_(sentencepiece::logging::GetMinLogLevel()) {
    sentencepiece::logging::SetMinLogLevel(std::max(saved_, 1));
  }
  ~QuietSentencepiece() { sentencepiece::logging::SetMinLogLevel(saved_); }

 private:
  int saved_;
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void rstrip(std::string& s) {
  while (!s.empty() && (s.back() == '\r' || s.back() == '\n' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
}

// Feeds the training documents to sentencepiece without a temporary file.
class DocIterator : public sentencepiece::SentenceIterator {
 public:
  explicit DocIterator(const std::vector<const std::string*>& docs) : docs_(docs) {}
  bool done() const override { return i_ >= docs_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return *docs_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<const std::string*>& docs_;
  size_t i_ = 0;
};

// Encodes documents in parallel; the stream is <s> doc0 <s> doc1 ... in input order.
std::vector<uint16_t> encode_documents(const sentencepiece::SentencePieceProcessor& sp,
                                       const std::vector<const std::string*>& docs, int threads) {
  const size_t n = docs.size();
  const size_t nt = std::max<size_t>(1, std::min<size_t>(threads, n / 64 + 1));
  std::vector<std::vector<uint16_t>> parts(nt);
  std::vector<std::string> errors(nt);
  const int bos = sp.bos_id();
  auto work = [&](size_t t) {
    const size_t lo = n * t / nt, hi = n * (t + 1) / nt;
    std::vector<int> ids;
    auto& out = parts[t];
    for (size_t i = lo; i < hi; ++i) {
      auto st = sp.Encode(*docs[i], &ids);
      if (!st.ok()) {
        errors[t] = st.ToString();
        return;
      }
      out.push_back(static_cast<uint16_t>(bos));
      for (int id : ids) out.push_back(static_cast<uint16_t>(id));
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < nt; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (!e.empty()) PT_THROW(InputError, "cannot encode the corpus: ", e);
  std::vector<uint16_t> all;
  size_t total = 0;
  for (auto& p : parts) total += p.size();
  all.reserve(total);
  for (auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > (v < 0 ? 1 : 0); i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

}  // namespace

std::vector<std::string> read_text_documents(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    PT_THROW(InputError, "cannot read text file ", path, ": ",
             std::filesystem::exists(path, ec) ? "not a regular file" : "No such file or directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) PT_THROW(InputError, "cannot read text file ", path);
  std::vector<std::string> docs;
  std::string line;
  while (std::getline(in, line)) {
    rstrip(line);
    if (!line.empty()) docs.push_back(std::move(line));
  }
  if (in.bad()) PT_THROW(InputError, "error reading text file ", path);
  return docs;
}

std::string wordnet_gloss(const std::string& line) {
  if (line.size() >= 2 && line[0] == ' ' && line[1] == ' ') return {};  // licence header
  auto bar = line.find("| ");
  if (bar == std::string::npos) return {};
  std::string g = line.substr(bar + 2);
  rstrip(g);
  return g;
}

std::vector<std::string> wordnet_glosses(const std::string& dir) {
  std::vector<std::string> docs;
  for (const char* pos : {"noun", "verb", "adj", "adv"}) {
    const std::string path = dir + "/data." + pos;
    std::ifstream in(path, std::ios::binary);
    if (!in)
      PT_THROW(InputError, "cannot read WordNet file ", path,
               " (install Debian's wordnet-base, or pass --text FILE...)");
    std::string line;
    while (std::getline(in, line)) {
      std::string g = wordnet_gloss(line);
      if (!g.empty()) docs.push_back(std::move(g));
    }
  }
  if (docs.empty()) PT_THROW(InputError, "no WordNet glosses found in ", dir);
  return docs;
}

double unigram_entropy(std::span<const uint16_t> tokens) {
  if (tokens.empty()) return 0.0;
  std::vector<int64_t> counts(65536, 0);
  for (uint16_t t : tokens) ++counts[t];
  const double n = static_cast<double>(tokens.size());
  double h = 0;
  for (int64_t c : counts)
    if (c > 0) {
      const double p = static_cast<double>(c) / n;
      h -= p * std::log(p);
    }
  return h;
}

PrepareSummary prepare_text(const PrepareOptions& opt, std::ostream* log) {
  const auto t0 = Clock::now();
  // ---- validate everything before writing anything ----
  if (opt.vocab_size < kMinVocabSize || opt.vocab_size > 65536)
    PT_THROW(InputError, "--vocab-size ", opt.vocab_size, " out of range [", kMinVocabSize,
             ", 65536] (token files store uint16 ids; the byte fallback needs 259 pieces)");
  if (!(opt.val_fraction >= 0.0 && opt.val_fraction < 1.0))
    PT_THROW(InputError, "--val-fraction ", opt.val_fraction, " out of range [0, 1)");
  if (opt.out_dir.empty()) PT_THROW(InputError, "no output directory (--out DIR)");
  if (opt.text_files.empty() && !opt.wordnet) PT_THROW(InputError, "no input text (--text FILE... or --wordnet)");
  if (opt.input_sentence_size < 1) PT_THROW(InputError, "input_sentence_size must be positive");
  {
    std::error_code ec;
    if (std::filesystem::exists(opt.out_dir, ec) && !std::filesystem::is_directory(opt.out_dir, ec))
      PT_THROW(InputError, "--out ", opt.out_dir, " exists and is not a directory");
  }

  std::vector<std::string> docs;
  if (opt.wordnet) docs = wordnet_glosses(opt.wordnet_dir);
  for (const auto& f : opt.text_files) {
    auto d = read_text_documents(f);
    docs.insert(docs.end(), std::make_move_iterator(d.begin()), std::make_move_iterator(d.end()));
  }
  if (docs.empty()) PT_THROW(InputError, "the input text has no non-empty lines");

  // ---- split ----
  PrepareSummary s;
  std::vector<const std::string*> train, val;
  Generator g(opt.seed);
  for (const auto& d : docs) {
    if (g.uniform_f64() < opt.val_fraction) {
      val.push_back(&d);
      s.bytes_val += static_cast<int64_t>(d.size());
    } else {
      train.push_back(&d);
      s.bytes_train += static_cast<int64_t>(d.size());
    }
  }
  if (train.empty()) PT_THROW(InputError, "no training documents left after the validation split");
  s.documents_train = static_cast<int64_t>(train.size());
  s.documents_val = static_cast<int64_t>(val.size());
  if (log)
    *log << "corpus: " << with_commas(static_cast<int64_t>(docs.size())) << " documents, "
         << with_commas(s.bytes_train + s.bytes_val) << " bytes; train " << with_commas(s.documents_train)
         << ", val " << with_commas(s.documents_val) << std::endl;

  // ---- tokenizer ----
  const int threads =
      opt.num_threads > 0 ? opt.num_threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const auto t1 = Clock::now();
  std::string model;
  {
    sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned>(opt.seed ^ (opt.seed >> 32)));
    std::ostringstream args;
    args << "--model_type=bpe --vocab_size=" << opt.vocab_size << " --byte_fallback=true"
         << " --character_coverage=0.9995 --input_sentence_size=" << opt.input_sentence_size
         << " --shuffle_input_sentence=true --num_threads=" << threads << " --unk_id=0 --bos_id=1 --eos_id=2"
         << " --pad_id=-1 --max_sentence_length=16384";
    DocIterator it(train);
    QuietSentencepiece quiet;
    if (log) *log << "training a BPE tokenizer (vocab " << opt.vocab_size << ") on " << with_commas(s.documents_train)
                  << " documents..." << std::endl;
    auto st = sentencepiece::SentencePieceTrainer::Train(args.str(), &it, &model);
    if (!st.ok()) PT_THROW(InputError, "training the tokenizer failed: ", st.ToString());
  }
  s.train_tokenizer_seconds = seconds_since(t1);
  sentencepiece::SentencePieceProcessor sp;
  {
    auto st = sp.LoadFromSerializedProto(model);
    if (!st.ok()) PT_THROW(InternalError, "the trained tokenizer does not load: ", st.ToString());
  }
  s.vocab_size = sp.GetPieceSize();
  if (log) *log << "tokenizer trained in " << std::fixed << std::setprecision(1) << s.train_tokenizer_seconds
                << " s; encoding..." << std::defaultfloat << std::endl;

  // ---- encode ----
  auto train_tokens = encode_documents(sp, train, threads);
  auto val_tokens = encode_documents(sp, val, threads);
  s.tokens_train = static_cast<int64_t>(train_tokens.size());
  s.tokens_val = static_cast<int64_t>(val_tokens.size());
  s.unigram_entropy_nats = unigram_entropy(train_tokens);

  // ---- write ----
  {
    std::error_code ec;
    std::filesystem::create_directories(opt.out_dir, ec);
    if (ec) PT_THROW(IoError, "cannot create output directory ", opt.out_dir, ": ", ec.message());
  }
  const std::string dir = opt.out_dir.back() == '/' ? opt.out_dir : opt.out_dir + "/";
  s.train_path = dir + "train.bin";
  s.val_path = dir + "val.bin";
  s.tokenizer_path = dir + "tokenizer.model";
  write_token_file(s.train_path, train_tokens);
  write_token_file(s.val_path, val_tokens);
  write_file_atomic(s.tokenizer_path, model);
  s.total_seconds = seconds_since(t0);
  return s;
}

std::string format_summary(const PrepareSummary& s) {
  std::ostringstream os;
  os << std::fixed;
  os << "documents:  train " << with_commas(s.documents_train) << " (" << with_commas(s.bytes_train)
     << " bytes), val " << with_commas(s.documents_val) << " (" << with_commas(s.bytes_val) << " bytes)\n";
  os << "tokenizer:  BPE, vocab " << s.vocab_size << ", trained in " << std::setprecision(1)
     << s.train_tokenizer_seconds << " s -> " << s.tokenizer_path << "\n";
  os << "train:      " << with_commas(s.tokens_train) << " tokens";
  if (s.tokens_train > 0)
    os << " (" << std::setprecision(2) << static_cast<double>(s.bytes_train) / static_cast<double>(s.tokens_train)
       << " bytes/token)";
  os << " -> " << s.train_path << "\n";
  os << "val:        " << with_commas(s.tokens_val) << " tokens -> " << s.val_path << "\n";
  os << "unigram entropy of train tokens: " << std::setprecision(4) << s.unigram_entropy_nats
     << " nats (the loss of a model that ignores context)\n";
  os << "done in " << std::setprecision(1) << s.total_seconds << " s\n";
  return os.str();
}

}  // namespace paratrain::data
