// Text preparation for language models: `paratrain data prepare`.
//
// prepare_text() reads documents (one non-empty line = one document; trailing whitespace
// and '\r' stripped), splits them into train and validation deterministically, trains a
// sentencepiece BPE tokenizer on the training documents, encodes both splits and writes
//   out_dir/train.bin, out_dir/val.bin   (llm.c token files, token_file.h)
//   out_dir/tokenizer.model              (sentencepiece model, tokenizer.h)
// each atomically. Token stream: for each document in input order, <s> (bos_id = 1) then
// the document's pieces, so <s> separates documents.
//
// Split: a Generator seeded with `seed` draws one uniform_f64() per document in input order;
// the document goes to validation when the draw is < val_fraction. Tokenizer training: BPE,
// byte_fallback, vocab_size pieces, at most input_sentence_size training sentences (a
// seeded sample when there are more), seeded with `seed`, so the same inputs and options
// give byte-identical outputs.
//
// WordNet: wordnet_glosses() extracts the gloss text of data.{noun,verb,adj,adv} (lines that
// start with two spaces are the licence header and are skipped; the gloss is the text after
// the first "| "), one document per synset, in file order noun, verb, adj, adv.
//
// Bad input (no documents, unreadable file, vocab size out of range or too large for the
// corpus, bad fraction) throws InputError before anything is written.
// Thread-safety: the functions keep no state between calls (prepare_text runs its own
// tokenizer threads, num_threads); concurrent calls must write different out_dirs.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <span>
#include <string>
#include <vector>

namespace paratrain::data {

constexpr const char* kWordNetDir = "/usr/share/wordnet";

struct PrepareOptions {
  std::vector<std::string> text_files;  // UTF-8 text, one document per line
  bool wordnet = false;                 // also use the WordNet glosses from wordnet_dir
  std::string wordnet_dir = kWordNetDir;
  int32_t vocab_size = 4096;            // in [kMinVocabSize, 65536]
  std::string out_dir;                  // created if missing
  double val_fraction = 0.05;           // in [0, 1)
  uint64_t seed = 1337;
  int32_t num_threads = 0;              // 0 = hardware concurrency (tokenizer training and encoding)
  int64_t input_sentence_size = 1000000;  // cap on tokenizer training sentences
};

// Smallest vocabulary accepted: 3 special pieces + 256 byte pieces + a few merges.
constexpr int32_t kMinVocabSize = 260;

struct PrepareSummary {
  int64_t documents_train = 0, documents_val = 0;
  int64_t bytes_train = 0, bytes_val = 0;      // UTF-8 text bytes
  int64_t tokens_train = 0, tokens_val = 0;    // including the <s> separators
  int32_t vocab_size = 0;
  double unigram_entropy_nats = 0;             // of the train tokens (unigram_entropy)
  double train_tokenizer_seconds = 0, total_seconds = 0;
  std::string train_path, val_path, tokenizer_path;
};

// Runs the whole preparation. Progress lines go to `log` when not null.
PrepareSummary prepare_text(const PrepareOptions& options, std::ostream* log = nullptr);

// Human-readable summary, several lines (what `paratrain data prepare` prints).
std::string format_summary(const PrepareSummary& summary);

// The documents of a text file (non-empty lines); InputError if unreadable.
std::vector<std::string> read_text_documents(const std::string& path);
// The WordNet gloss corpus (see above); InputError if a data file is missing.
std::vector<std::string> wordnet_glosses(const std::string& dir = kWordNetDir);
// Extracts the gloss of one data.* line; empty for header lines and lines without "| ".
std::string wordnet_gloss(const std::string& line);

// -sum_v p_v ln p_v over the empirical token distribution (nats); 0 for no tokens. A model
// that ignores context cannot beat this cross-entropy on the same data.
double unigram_entropy(std::span<const uint16_t> tokens);

}  // namespace paratrain::data
