#include "paratrain/data/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>

#include "paratrain/base/error.h"

namespace paratrain::data {

Tokenizer::Tokenizer() : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

Tokenizer::Tokenizer(const std::string& model_path) : Tokenizer() {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec))
    PT_THROW(InputError, "cannot open tokenizer model ", model_path, ": No such file");
  auto st = sp_->Load(model_path);
  if (!st.ok()) PT_THROW(InputError, "tokenizer model ", model_path, " is not a sentencepiece model: ", st.ToString());
}

Tokenizer Tokenizer::from_bytes(const std::string& serialized, const std::string& what) {
  Tokenizer t;
  auto st = t.sp_->LoadFromSerializedProto(serialized);
  if (!st.ok()) PT_THROW(InputError, what, " is not a sentencepiece model: ", st.ToString());
  return t;
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  if (!st.ok()) PT_THROW(InputError, "cannot encode text: ", st.ToString());
  return std::vector<int32_t>(ids.begin(), ids.end());
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const int32_t v = vocab_size();
  std::vector<int> in(ids.begin(), ids.end());
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i] < 0 || in[i] >= v)
      PT_THROW(InputError, "token id ", in[i], " at position ", i, " outside the tokenizer's vocabulary [0, ", v, ")");
  std::string out;
  auto st = sp_->Decode(in, &out);
  if (!st.ok()) PT_THROW(InputError, "cannot decode tokens: ", st.ToString());
  return out;
}

std::string Tokenizer::piece(int32_t id) const {
  if (id < 0 || id >= vocab_size())
    PT_THROW(InputError, "token id ", id, " outside the tokenizer's vocabulary [0, ", vocab_size(), ")");
  return sp_->IdToPiece(id);
}

int32_t Tokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t Tokenizer::bos_id() const { return sp_->bos_id(); }
int32_t Tokenizer::eos_id() const { return sp_->eos_id(); }
int32_t Tokenizer::unk_id() const { return sp_->unk_id(); }

}  // namespace paratrain::data
