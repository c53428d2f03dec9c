// The fixture of the install tests: `cmake --install` of this build into a fresh temporary
// prefix per test, and helpers to configure and build a consumer project against that prefix
// only and to run its programs under `timeout`. Each test file in tests/install/ uses it
// (every test runs as its own process under ctest, so each installs once).
#pragma once

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "support/run_binary.h"

namespace paratrain::install_test {

namespace fs = std::filesystem;


inline const char* const kLayers[] = {"base",   "tensor",     "kernels", "autograd", "nn",       "optim", "comm",
                               "data",   "amp",        "checkpoint", "monitor", "parallel", "train", "launch"};

using Cmd = paratrain::test::CommandResult;

// Runs `cmd` through the shell under `timeout -k 5 timeout_s`, stdout and stderr together.
inline Cmd run(const std::string& cmd, int timeout_s) {
  return paratrain::test::run_shell_line("timeout -k 5 " + std::to_string(timeout_s) + " sh -c '" + cmd + "' 2>&1");
}

inline bool have(const std::string& tool) { return run("command -v " + tool, 10).rc == 0; }

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// The numbers after "loss " in a program's output, in order.
inline std::vector<double> losses(const std::string& out) {
  std::vector<double> v;
  std::regex re("loss ([0-9.eE+-]+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    v.push_back(std::stod((*it)[1].str()));
  return v;
}

// The build tree these tests belong to: the parent of tests/.
inline fs::path build_dir() { return fs::path(PARATRAIN_TEST_BIN_DIR).parent_path(); }
inline fs::path source_dir() { return fs::path(PARATRAIN_SOURCE_DIR); }

// Each test installs the build into its own fresh prefix (tests may run in parallel).
class Install : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_install_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    prefix_ = tmp_ / "prefix";
    Cmd r = run("cmake --install " + build_dir().string() + " --prefix " + prefix_.string(), 120);
    ASSERT_EQ(r.rc, 0) << r.out;
    // lib/, or lib/<multiarch> when the build was configured for /usr (GNUInstallDirs).
    libdir_ = prefix_ / "lib";
    for (const auto& e : fs::recursive_directory_iterator(prefix_))
      if (e.path().filename() == "libparatrain_base.a") libdir_ = e.path().parent_path();
    // cmake configure/build of the consumer projects: Release, Ninja and ccache when there.
    // CCACHE_BASEDIR makes the temporary paths relative, so repeated runs hit the cache.
    generator_ = have("ninja") ? " -G Ninja" : "";
    launcher_ = have("ccache") ? " -DCMAKE_CXX_COMPILER_LAUNCHER=ccache" : "";
    env_ = "CCACHE_BASEDIR=" + tmp_.string() + " ";
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(tmp_);
    else std::printf("kept %s\n", tmp_.c_str());
  }
  // Configures (and, when `build`, builds) a CMake project against the prefix only; with a
  // `target`, builds that target alone (e.g. one example: "example_train_gpt").
  Cmd cmake_project(const fs::path& src, const fs::path& bin, const std::string& extra, bool build,
                    const std::string& target = "") {
    Cmd r = run(env_ + "cmake -S " + src.string() + " -B " + bin.string() + generator_ + launcher_ +
                    " -DCMAKE_BUILD_TYPE=Release -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_PREFIX_PATH=" +
                    prefix_.string() + extra,
                120);
    if (r.rc != 0 || !build) return r;
    Cmd b = run(env_ + "cmake --build " + bin.string() + " -j 2" + (target.empty() ? "" : " --target " + target), 240);
    b.out = r.out + b.out;
    return b;
  }
  fs::path tmp_, prefix_, libdir_;
  std::string generator_, launcher_, env_;
};

}  // namespace paratrain::install_test
