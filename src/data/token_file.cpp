#include "paratrain/data/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/error.h"

namespace paratrain::data {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; big-endian hosts are unsupported");

TokenFile::TokenFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    PT_THROW(InputError, "cannot open token file ", path, ": ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    PT_THROW(InputError, "token file ", path, " is not a regular file");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < kTokenFileHeaderBytes) {
    ::close(fd);
    PT_THROW(InputError, "token file ", path, " is truncated: ", bytes, " bytes, shorter than the ",
             kTokenFileHeaderBytes, "-byte header");
  }
  void* m = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (m == MAP_FAILED) PT_THROW(InputError, "cannot map token file ", path, ": ", std::strerror(err));
  map_ = m;
  map_bytes_ = bytes;

  int32_t header[3];
  std::memcpy(header, m, sizeof(header));
  try {
    if (header[0] != kTokenFileMagic)
      PT_THROW(InputError, "token file ", path, " has wrong magic ", header[0], " (expected ", kTokenFileMagic,
               "; not an llm.c .bin token file)");
    if (header[1] != kTokenFileVersion)
      PT_THROW(InputError, "token file ", path, " has unsupported version ", header[1], " (expected ",
               kTokenFileVersion, ")");
    if (header[2] < 0) PT_THROW(InputError, "token file ", path, " has a negative token count ", header[2]);
    const size_t expect = kTokenFileHeaderBytes + 2 * static_cast<size_t>(header[2]);
    if (bytes < expect)
      PT_THROW(InputError, "token file ", path, " is truncated: header says ", header[2], " tokens (", expect,
               " bytes) but the file has ", bytes, " bytes");
    if (bytes > expect)
      PT_THROW(InputError, "token file ", path, " has ", bytes - expect, " bytes after its ", header[2],
               " tokens (header and size disagree)");
  } catch (...) {
    release();
    throw;
  }
  count_ = header[2];
  tokens_ = reinterpret_cast<const uint16_t*>(static_cast<const char*>(m) + kTokenFileHeaderBytes);
  if (count_ > 0) ::madvise(m, bytes, MADV_WILLNEED);
}

TokenFile::~TokenFile() { release(); }

void TokenFile::release() {
  if (map_) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  tokens_ = nullptr;
  count_ = 0;
}

TokenFile::TokenFile(TokenFile&& o) noexcept
    : path_(std::move(o.path_)), map_(o.map_), map_bytes_(o.map_bytes_), tokens_(o.tokens_), count_(o.count_),
      max_token_(o.max_token_) {
  o.map_ = nullptr;
  o.map_bytes_ = 0;
  o.tokens_ = nullptr;
  o.count_ = 0;
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    release();
    path_ = std::move(o.path_);
    map_ = std::exchange(o.map_, nullptr);
    map_bytes_ = std::exchange(o.map_bytes_, 0);
    tokens_ = std::exchange(o.tokens_, nullptr);
    count_ = std::exchange(o.count_, 0);
    max_token_ = o.max_token_;
  }
  return *this;
}

int32_t TokenFile::max_token() const {
  if (max_token_ == -2) {
    int32_t m = -1;
    if (count_ > 0) m = *std::max_element(tokens_, tokens_ + count_);
    max_token_ = m;
  }
  return max_token_;
}

void write_token_file(const std::string& path, std::span<const uint16_t> tokens) {
  if (tokens.size() > static_cast<size_t>(INT32_MAX))
    PT_THROW(InputError, "cannot write ", path, ": ", tokens.size(), " tokens exceed the .bin format's int32 count");
  int32_t header[kTokenFileHeaderInts] = {};
  header[0] = kTokenFileMagic;
  header[1] = kTokenFileVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  AtomicFileWriter w(path);
  w.write(header, sizeof(header));
  w.write(tokens.data(), tokens.size_bytes());
  w.commit();
}

}  // namespace paratrain::data
