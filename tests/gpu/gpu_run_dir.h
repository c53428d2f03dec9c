// For the tests/gpu tests that run the `paratrain` binary: test::GpuRunDir, a fixture with a
// fresh temporary directory (removed afterwards) holding tokens.bin, 40000 tokens of a
// learnable pattern over a 256-token vocabulary (gpt-nano's), and path(name) inside it.
// Thread-safety: one test's fixture, its thread only.
#pragma once

#include <gtest/gtest.h>

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "paratrain/data/token_file.h"

namespace paratrain::test {

class GpuRunDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_gpu_run_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    std::vector<uint16_t> t(40000);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint16_t>((i * 7 + (i / 13)) % 256);
    data::write_token_file(path("tokens.bin"), t);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& n) const { return dir_ + "/" + n; }
  std::string dir_;
};

}  // namespace paratrain::test
