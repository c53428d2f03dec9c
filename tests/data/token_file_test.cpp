#include "paratrain/data/token_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using paratrain::testing::TempDir;
using ::testing::HasSubstr;

namespace {

std::string header_bytes(int32_t magic, int32_t version, int32_t count) {
  std::vector<int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = count;
  return std::string(reinterpret_cast<const char*>(h.data()), 1024);
}

std::string token_bytes(const std::vector<uint16_t>& t) {
  return std::string(reinterpret_cast<const char*>(t.data()), t.size() * 2);
}

}  // namespace

TEST(TokenFile, RoundTrip) {
  TempDir d;
  std::vector<uint16_t> toks = {0, 1, 2, 65535, 300, 7};
  write_token_file(d.path("a.bin"), toks);
  EXPECT_EQ(d.count(), 1);
  TokenFile f(d.path("a.bin"));
  ASSERT_EQ(f.size(), 6);
  EXPECT_EQ(std::vector<uint16_t>(f.tokens().begin(), f.tokens().end()), toks);
  EXPECT_EQ(f[3], 65535);
  EXPECT_EQ(f.max_token(), 65535);
  EXPECT_EQ(f.path(), d.path("a.bin"));
}

TEST(TokenFile, ExactBytesMatchLlmc) {
  TempDir d;
  write_token_file(d.path("a.bin"), std::vector<uint16_t>{5, 258});
  std::string want = header_bytes(20240520, 1, 2) + token_bytes({5, 258});
  EXPECT_EQ(paratrain::testing::read_bytes(d.path("a.bin")), want);
}

TEST(TokenFile, EmptyFileIsValid) {
  TempDir d;
  write_token_file(d.path("e.bin"), std::vector<uint16_t>{});
  TokenFile f(d.path("e.bin"));
  EXPECT_EQ(f.size(), 0);
  EXPECT_EQ(f.max_token(), -1);
}

TEST(TokenFile, MoveKeepsMapping) {
  TempDir d;
  write_token_file(d.path("a.bin"), std::vector<uint16_t>{9, 8, 7});
  TokenFile a(d.path("a.bin"));
  TokenFile b(std::move(a));
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(b[2], 7);
  TokenFile c(d.path("a.bin"));
  c = std::move(b);
  EXPECT_EQ(c[0], 9);
}

TEST(TokenFile, MissingFile) {
  TempDir d;
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("nope.bin")); });
  EXPECT_THAT(msg, HasSubstr(d.path("nope.bin")));
  EXPECT_THAT(msg, HasSubstr("No such file"));
  EXPECT_EQ(msg.find('\n'), std::string::npos);
}

TEST(TokenFile, Directory) {
  TempDir d;
  auto msg = error_of<InputError>([&] { TokenFile f(d.dir.string()); });
  EXPECT_THAT(msg, HasSubstr("not a regular file"));
}

TEST(TokenFile, ShorterThanHeader) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("s.bin"), header_bytes(20240520, 1, 0).substr(0, 100));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("s.bin")); });
  EXPECT_THAT(msg, HasSubstr(d.path("s.bin")));
  EXPECT_THAT(msg, HasSubstr("truncated: 100 bytes, shorter than the 1024-byte header"));
}

TEST(TokenFile, WrongMagic) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("m.bin"), header_bytes(12345, 1, 1) + token_bytes({1}));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("m.bin")); });
  EXPECT_THAT(msg, HasSubstr(d.path("m.bin")));
  EXPECT_THAT(msg, HasSubstr("wrong magic 12345 (expected 20240520"));
}

TEST(TokenFile, WrongVersion) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("v.bin"), header_bytes(20240520, 2, 1) + token_bytes({1}));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("v.bin")); });
  EXPECT_THAT(msg, HasSubstr("unsupported version 2 (expected 1)"));
}

TEST(TokenFile, NegativeCount) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("n.bin"), header_bytes(20240520, 1, -5));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("n.bin")); });
  EXPECT_THAT(msg, HasSubstr("negative token count -5"));
}

TEST(TokenFile, Truncated) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("t.bin"), header_bytes(20240520, 1, 10) + token_bytes({1, 2, 3}));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("t.bin")); });
  EXPECT_THAT(msg, HasSubstr(d.path("t.bin")));
  EXPECT_THAT(msg, HasSubstr("truncated: header says 10 tokens (1044 bytes) but the file has 1030 bytes"));
}

TEST(TokenFile, TrailingBytes) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("x.bin"), header_bytes(20240520, 1, 1) + token_bytes({1, 2}));
  auto msg = error_of<InputError>([&] { TokenFile f(d.path("x.bin")); });
  EXPECT_THAT(msg, HasSubstr("2 bytes after its 1 tokens"));
}

TEST(TokenFile, WriteIntoMissingDirectoryIsIoErrorAndWritesNothing) {
  TempDir d;
  EXPECT_THROW(write_token_file(d.path("no/dir/a.bin"), std::vector<uint16_t>{1}), IoError);
  EXPECT_EQ(d.count(), 0);
}
