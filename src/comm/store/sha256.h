// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), used by the store's challenge-response.
// Small and self-contained so the store needs no crypto library. Not constant-time beyond
// what the digest itself is; comparisons of MACs use constant_time_equal.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace paratrain::comm::store {

using Digest = std::array<uint8_t, 32>;

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  Digest finish();

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_ = 0;
};

Digest sha256(std::string_view data);
Digest hmac_sha256(std::string_view key, std::string_view message);
bool constant_time_equal(const Digest& a, const Digest& b);
std::string to_hex(const Digest& d);

}  // namespace paratrain::comm::store
