// The GPU scripts' paths that run without a GPU (bench/gpu_kit.sh, bench/gpu_check.sh,
// bench/lib.sh's bench_python): usage and missing-kit errors exit 2 naming the problem, a kit's
// check of its sources against the checkout's, a
// machine without nvidia-smi gets gpu_check.sh's one-line refusal, and bench_python finds a
// Python that has a module and none for a module nobody has. The GPU runs themselves need a
// GPU (docs/cuda.md, "Checking on a machine with GPUs").
#include <gtest/gtest.h>

#include <string>

#include "support/run_binary.h"

namespace {

const std::string kRoot = PARATRAIN_SOURCE_DIR;

paratrain::test::CommandResult sh(const std::string& line) {
  return paratrain::test::run_shell_line("cd " + kRoot + " && timeout 60 bash -c '" + line + "' 2>&1");
}

TEST(GpuScripts, GpuKitUsageAndAMissingKitExitTwoNamingIt) {
  auto r = sh("bash bench/gpu_kit.sh");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("usage: bash bench/gpu_kit.sh pack|check|run [KIT]"), std::string::npos) << r.out;
  r = sh("bash bench/gpu_kit.sh unpack");
  EXPECT_EQ(r.rc, 2) << r.out;
  r = sh("bash bench/gpu_kit.sh run /nonexistent/kit.tar.xz");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("no kit at /nonexistent/kit.tar.xz (make one with: bash bench/gpu_kit.sh pack)"),
            std::string::npos)
      << r.out;
}

// `check` compares the SHA-256 a kit holds of its sources with this checkout's files: a kit of
// these files passes, one with another file's hash fails naming the file, and so does a kit
// without the hashes (made before they were recorded). Kits of a few files, made by the test.
TEST(GpuScripts, GpuKitCheckTellsAKitOfTheseSourcesFromOneOfOthers) {
  const std::string dir = "$(mktemp -d)";
  // A kit in a temporary folder $t (removed at the end) whose hashes the next command writes.
  const std::string make_kit =
      "t=" + dir + " && trap \"rm -rf $t\" EXIT && mkdir -p $t/build/gpu-kit && echo abc1234 > $t/build/gpu-kit/kit-commit && ";
  const std::string pack = " && tar -C $t -cJf $t/kit.tar.xz build/gpu-kit && bash bench/gpu_kit.sh check $t/kit.tar.xz";
  auto r = sh(make_kit + "sha256sum CMakeLists.txt src/train/trainer.cpp > $t/build/gpu-kit/kit-sources.sha256" + pack);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("(commit abc1234) was built from this checkout's sources"), std::string::npos) << r.out;
  r = sh(make_kit + "{ sha256sum CMakeLists.txt; echo \"$(echo other | sha256sum | cut -c1-64)  src/train/trainer.cpp\"; } "
                    "> $t/build/gpu-kit/kit-sources.sha256" + pack);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("the kit (commit abc1234) was built from other sources than this checkout's: "
                       "src/train/trainer.cpp"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("CMakeLists.txt"), std::string::npos) << "only the files that differ are named: " << r.out;
  r = sh(make_kit + "true" + pack);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("the kit holds no kit-sources.sha256 (pack it again)"), std::string::npos) << r.out;
}

// `run` checks the kit's sources right after unpacking it, before anything runs: in a stand-in
// checkout (the script and one source file in a temporary folder), a kit of another version of
// that file is refused naming it; a kit of this one passes the check, names its commit, and
// goes on (to the next missing piece of this bare kit, its kit-built-at).
TEST(GpuScripts, GpuKitRunRefusesAKitOfOtherSourcesBeforeRunningAnything) {
  const std::string setup =
      "t=$(mktemp -d) && trap \"rm -rf $t\" EXIT && mkdir -p $t/co/bench $t/co/src $t/k/build/gpu-kit && "
      "cp bench/gpu_kit.sh $t/co/bench/ && echo new > $t/co/src/x.cpp && echo abc1234 > $t/k/build/gpu-kit/kit-commit && ";
  const std::string run = " && tar -C $t/k -cJf $t/kit.tar.xz build/gpu-kit && bash $t/co/bench/gpu_kit.sh run $t/kit.tar.xz";
  auto r = sh(setup + "echo \"$(echo old | sha256sum | cut -c1-64)  src/x.cpp\" > $t/k/build/gpu-kit/kit-sources.sha256" +
              run);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("the kit (commit abc1234) was built from other sources than this checkout's: src/x.cpp"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("gpu_kit.sh: pack it again from this checkout: bash bench/gpu_kit.sh pack"), std::string::npos)
      << r.out;
  r = sh(setup + "(cd $t/co && sha256sum src/x.cpp) > $t/k/build/gpu-kit/kit-sources.sha256" + run);
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("gpu_kit.sh: the kit of commit abc1234, built from this checkout's sources"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("holds no kit-built-at"), std::string::npos) << r.out;
}

TEST(GpuScripts, GpuCheckWithoutAGpuSaysSoAndExitsTwo) {
  if (sh("command -v nvidia-smi").rc == 0) GTEST_SKIP() << "this machine has nvidia-smi: gpu_check.sh would run";
  const auto r = sh("bash bench/gpu_check.sh /nonexistent/build");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("gpu_check: no NVIDIA GPU here (nvidia-smi): nothing to check"), std::string::npos) << r.out;
}

TEST(GpuScripts, BenchPythonFindsAPythonWithTheModulesOrNone) {
  auto r = sh("source bench/lib.sh && py=$(bench_python json os) && \"$py\" -c \"import json, os; print(42)\"");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "42\n");
  r = sh("source bench/lib.sh && echo \"[$(bench_python json no_such_module_paratrain)]\"");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "[]\n");
}

}  // namespace
