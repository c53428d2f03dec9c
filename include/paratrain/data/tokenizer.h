// Tokenizer: a trained sentencepiece model (written by `paratrain data prepare`), for
// encoding prompts and decoding samples (`paratrain sample`).
//
// Models from text_prepare.h are BPE with byte fallback, so every UTF-8 string encodes
// without <unk>, and decode(encode(s)) == s up to sentencepiece's normalisation (NFKC,
// collapsed whitespace). Ids: <unk> = 0, <s> = 1 (separates documents in the token files),
// </s> = 2, then the 256 byte pieces, then the merged pieces.
//
// Thread-safety: encode/decode are const and may be called from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace paratrain::data {

class Tokenizer {
 public:
  // Loads a model file; InputError naming the file if it is missing or not a model.
  explicit Tokenizer(const std::string& model_path);
  // Loads a model from its serialized bytes (`what` names it in errors).
  static Tokenizer from_bytes(const std::string& serialized, const std::string& what = "tokenizer");
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(const std::string& text) const;
  // Ids outside [0, vocab_size()) are an InputError.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The text of one piece ("▁the", "<0x0A>", ...).
  std::string piece(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // document separator in token files
  int32_t eos_id() const;
  int32_t unk_id() const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace paratrain::data
