// Token files in llm.c's .bin format, read through a memory map.
//
// Format (REFERENCE.md, docs/data.md): a header of 256 little-endian int32 -- [0] = 20240520
// (magic), [1] = 1 (version), [2] = number of tokens, the rest zero -- then the tokens as
// little-endian uint16. The file size must be exactly 1024 + 2 x count bytes.
//
// TokenFile validates on open and throws InputError with one line naming the file and the
// problem: missing/unreadable, shorter than the header, wrong magic, wrong version, negative
// count, truncated (shorter than the header says) or trailing bytes (longer). A TokenFile
// is read-only and may be shared between threads. write_token_file() writes atomically.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace paratrain::data {

constexpr int32_t kTokenFileMagic = 20240520;
constexpr int32_t kTokenFileVersion = 1;
constexpr size_t kTokenFileHeaderInts = 256;
constexpr size_t kTokenFileHeaderBytes = kTokenFileHeaderInts * sizeof(int32_t);

class TokenFile {
 public:
  // Maps and validates `path`; InputError naming the file and the problem otherwise.
  explicit TokenFile(const std::string& path);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;
  TokenFile(TokenFile&& other) noexcept;
  TokenFile& operator=(TokenFile&& other) noexcept;

  const std::string& path() const { return path_; }
  int64_t size() const { return count_; }  // number of tokens
  // The tokens (a view of the mapping; valid while this TokenFile lives).
  std::span<const uint16_t> tokens() const { return {tokens_, static_cast<size_t>(count_)}; }
  uint16_t operator[](int64_t i) const { return tokens_[i]; }
  // Largest token id in the file (one pass over the data on the first call, then cached);
  // -1 for an empty file. Trainers compare it with the model's vocabulary size.
  int32_t max_token() const;

 private:
  void release();
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint16_t* tokens_ = nullptr;
  int64_t count_ = 0;
  mutable int32_t max_token_ = -2;  // -2 = not computed yet
};

// Writes `tokens` as an llm.c .bin file, atomically (base/atomic_file.h).
void write_token_file(const std::string& path, std::span<const uint16_t> tokens);

}  // namespace paratrain::data
