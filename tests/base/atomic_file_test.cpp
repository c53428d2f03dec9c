#include "paratrain/base/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "paratrain/base/error.h"

namespace fs = std::filesystem;
using paratrain::AtomicFileWriter;
using paratrain::write_file_atomic;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() / ("pt_atomic_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  int count() const { return static_cast<int>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST(AtomicFile, WritesWithCallback) {
  TempDir t;
  auto p = (t.dir / "a.txt").string();
  write_file_atomic(p, [](std::ostream& os) { os << "hello " << 42; });
  EXPECT_EQ(slurp(p), "hello 42");
  EXPECT_EQ(t.count(), 1);
}

TEST(AtomicFile, WritesBytesAndReplaces) {
  TempDir t;
  auto p = (t.dir / "b.bin").string();
  write_file_atomic(p, std::string_view("first"));
  write_file_atomic(p, std::string_view("second\0x", 8));
  EXPECT_EQ(slurp(p), std::string("second\0x", 8));
  EXPECT_EQ(t.count(), 1);
}

TEST(AtomicFile, ThrowingWriterLeavesNothingAndKeepsOldFile) {
  TempDir t;
  auto p = (t.dir / "c.txt").string();
  EXPECT_THROW(write_file_atomic(p, [](std::ostream& os) {
                 os << "partial";
                 throw std::runtime_error("boom");
               }),
               std::runtime_error);
  EXPECT_EQ(t.count(), 0);
  write_file_atomic(p, std::string_view("old"));
  EXPECT_THROW(write_file_atomic(p, [](std::ostream& os) {
                 os << "new partial";
                 throw paratrain::InputError("bad");
               }),
               paratrain::InputError);
  EXPECT_EQ(slurp(p), "old");
  EXPECT_EQ(t.count(), 1);
}

TEST(AtomicFile, WriterWithoutCommitLeavesNothing) {
  TempDir t;
  auto p = (t.dir / "d.txt").string();
  {
    AtomicFileWriter w(p);
    w.stream() << "data";
    EXPECT_TRUE(fs::exists(w.temp_path()));
    EXPECT_NE(w.temp_path().find(".tmp." + std::to_string(::getpid())), std::string::npos);
    EXPECT_EQ(fs::path(w.temp_path()).parent_path(), t.dir);
  }
  EXPECT_EQ(t.count(), 0);
  {
    AtomicFileWriter w(p);
    w.write("xyz", 3);
    EXPECT_FALSE(fs::exists(p));
    w.commit();
  }
  EXPECT_EQ(slurp(p), "xyz");
  EXPECT_EQ(t.count(), 1);
}

TEST(AtomicFile, MissingDirectoryIsIoErrorNamingPath) {
  TempDir t;
  auto p = (t.dir / "no" / "such" / "e.txt").string();
  try {
    write_file_atomic(p, std::string_view("x"));
    FAIL() << "expected IoError";
  } catch (const paratrain::IoError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.count(), 0);
}

TEST(AtomicFile, RenameFailureRemovesTemp) {
  TempDir t;
  // The target is an existing non-empty directory: rename() fails.
  auto target = t.dir / "occupied";
  fs::create_directories(target / "inner");
  try {
    write_file_atomic(target.string(), std::string_view("x"));
    FAIL() << "expected IoError";
  } catch (const paratrain::IoError& e) {
    EXPECT_NE(std::string(e.what()).find(target.string()), std::string::npos) << e.what();
  }
  EXPECT_EQ(t.count(), 1);  // only the directory
  EXPECT_TRUE(fs::is_directory(target));
}

TEST(AtomicFile, StreamFailureIsIoError) {
  // A stream that fails (as on a full disk) must give IoError and leave nothing behind.
  TempDir t;
  auto p = (t.dir / "f.txt").string();
  EXPECT_THROW(write_file_atomic(p, [](std::ostream& os) { os.setstate(std::ios::badbit); }),
               paratrain::IoError);
  EXPECT_EQ(t.count(), 0);
}
