// The installed package, as a user sees it: `cmake --install` of this build into a temporary
// prefix, then programs built against that prefix only -- examples/ configured out of tree
// with find_package(paratrain), a project linking one layer target, a refused incompatible
// version, and a program compiled by g++ with pkg-config's flags. Each builds and runs.
// Every spawned command runs under `timeout`.
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include "install/install_fixture.h"
#include "paratrain/data/token_file.h"

namespace fs = std::filesystem;
using namespace paratrain::install_test;

namespace {

TEST_F(Install, InstallsLibrariesHeadersProgramAndPackages) {
  for (const char* layer : kLayers)
    EXPECT_TRUE(fs::exists(libdir_ / ("libparatrain_" + std::string(layer) + ".a"))) << layer;
  EXPECT_TRUE(fs::exists(prefix_ / "include/paratrain/tensor/tensor.h"));
  EXPECT_TRUE(fs::exists(prefix_ / "include/paratrain/version.h"));
  for (const char* f : {"paratrainConfig.cmake", "paratrainConfigVersion.cmake", "paratrainTargets.cmake"})
    EXPECT_TRUE(fs::exists(libdir_ / "cmake/paratrain" / f)) << f;
  EXPECT_TRUE(fs::exists(libdir_ / "pkgconfig/paratrain.pc"));
  Cmd v = run((prefix_ / "bin/paratrain").string() + " --version", 30);
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_NE(v.out.find("paratrain "), std::string::npos) << v.out;

  // What the exported targets hand a consumer: the prefix's include dir, nlohmann_json,
  // Threads, and link-only dependencies. Nothing of the build tree or the private deps.
  std::string targets = slurp(libdir_ / "cmake/paratrain/paratrainTargets.cmake");
  for (const char* leak : {"CLI11", "PkgConfig::", "SENTENCEPIECE", "INTERFACE_COMPILE_DEFINITIONS",
                           "INTERFACE_COMPILE_OPTIONS", "march", "paratrain_deps", "/usr/include"})
    EXPECT_EQ(targets.find(leak), std::string::npos) << leak;
  EXPECT_EQ(targets.find(source_dir().string() + "/"), std::string::npos);
  EXPECT_EQ(targets.find(build_dir().string() + "/"), std::string::npos);
  EXPECT_NE(targets.find("$<LINK_ONLY:paratrain::private_link_deps>"), std::string::npos);
  EXPECT_NE(targets.find("nlohmann_json::nlohmann_json"), std::string::npos);
}

// examples/ on its own: find_package(paratrain) is all it has of paratrain. Its compile lines
// name the prefix's headers, never the source tree's include/ or src/, nor build-only flags.
TEST_F(Install, ExamplesBuildOutOfTreeAndTrain) {
  fs::path ex = tmp_ / "examples";
  Cmd r = cmake_project(source_dir() / "examples", ex, "", true);
  ASSERT_EQ(r.rc, 0) << r.out;

  std::string cc = slurp(ex / "compile_commands.json");
  ASSERT_FALSE(cc.empty());
  EXPECT_EQ(cc.find((source_dir() / "include").string()), std::string::npos) << cc;
  EXPECT_EQ(cc.find((source_dir() / "src").string()), std::string::npos) << cc;
  EXPECT_EQ(cc.find(build_dir().string() + "/"), std::string::npos) << cc;
  EXPECT_NE(cc.find((prefix_ / "include").string()), std::string::npos) << cc;
  for (const char* leak : {"-march=native", "PARATRAIN_HAVE_MPI", "-fopenmp"})
    EXPECT_EQ(cc.find(leak), std::string::npos) << leak << "\n" << cc;

  // train_gpt: gpt-nano on a small repetitive token file; the loss falls well below ln(256).
  std::vector<uint16_t> tokens;
  const std::string text = "the quick brown fox jumps over the lazy dog. ";
  for (int i = 0; tokens.size() < 4096; ++i) tokens.push_back(static_cast<uint8_t>(text[i % text.size()]));
  fs::path bin = tmp_ / "train.bin";
  paratrain::data::write_token_file(bin.string(), tokens);
  Cmd t = run((ex / "bin/example_train_gpt").string() + " " + bin.string() + " 40", 120);
  ASSERT_EQ(t.rc, 0) << t.out;
  std::vector<double> l = losses(t.out);
  ASSERT_EQ(l.size(), 40u) << t.out;
  EXPECT_GT(l.front(), 5.0) << t.out;
  EXPECT_LT(l.back(), l.front() - 1.5) << t.out;

  // A bad invocation is the documented user error (exit 2).
  Cmd bad = run((ex / "bin/example_train_gpt").string() + " " + (tmp_ / "missing.bin").string(), 30);
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_NE(bad.out.find("error:"), std::string::npos) << bad.out;
}

// A per-layer target brings the layers below it (paratrain::tensor -> base) and nothing
// else is needed to link; a version the package does not satisfy is refused.
TEST_F(Install, LayerTargetLinksAndVersionIsChecked) {
  fs::path src = tmp_ / "layer_src";
  write_file(src / "CMakeLists.txt",
             "cmake_minimum_required(VERSION 3.25)\n"
             "project(layer_user LANGUAGES CXX)\n"
             "set(CMAKE_CXX_STANDARD 20)\n"
             "if(NOT WANT)\n  set(WANT 0.1)\nendif()\n"
             "find_package(paratrain ${WANT} REQUIRED)\n"
             "add_executable(layer_user main.cpp)\n"
             "target_link_libraries(layer_user PRIVATE paratrain::tensor)\n");
  write_file(src / "main.cpp",
             "#include <cstdio>\n#include <paratrain/tensor/tensor.h>\n#include <paratrain/version.h>\n"
             "int main() {\n"
             "  paratrain::Tensor t = paratrain::Tensor::full({2, 3}, 1.5);\n"
             "  std::printf(\"paratrain %s numel %lld\\n\", PARATRAIN_VERSION_STRING, (long long)t.numel());\n"
             "  return 0;\n}\n");
  Cmd r = cmake_project(src, tmp_ / "layer", "", true);
  ASSERT_EQ(r.rc, 0) << r.out;
  Cmd t = run((tmp_ / "layer/layer_user").string(), 30);
  EXPECT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("numel 6"), std::string::npos) << t.out;
  Cmd v = run((prefix_ / "bin/paratrain").string() + " --version", 30);
  std::smatch m;
  std::string vs = t.out;
  ASSERT_TRUE(std::regex_search(vs, m, std::regex("paratrain ([0-9]+\\.[0-9]+\\.[0-9]+)")));
  EXPECT_NE(v.out.find(m[1].str()), std::string::npos) << "version.h says " << m[1] << ", the binary " << v.out;

  Cmd bad = cmake_project(src, tmp_ / "layer_v9", " -DWANT=9.0", false);
  EXPECT_NE(bad.rc, 0) << bad.out;
  EXPECT_NE(bad.out.find("paratrain"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("version"), std::string::npos) << bad.out;
}

// Without CMake: g++ with pkg-config's flags builds and runs a small regression program
// that reaches every layer it uses (nn, optim, autograd, kernels through oneDNN).
TEST_F(Install, PkgConfigBuildsAProgram) {
  if (!have("pkg-config")) GTEST_SKIP() << "pkg-config not installed";
  std::string pc = "PKG_CONFIG_PATH=" + (libdir_ / "pkgconfig").string() + " pkg-config ";
  Cmd flags = run(pc + "--cflags --libs paratrain", 30);
  ASSERT_EQ(flags.rc, 0) << flags.out;
  EXPECT_NE(flags.out.find("-lparatrain_launch"), std::string::npos) << flags.out;
  EXPECT_EQ(flags.out.find(source_dir().string() + "/"), std::string::npos) << flags.out;
  Cmd ver = run(pc + "--modversion paratrain", 30);
  EXPECT_EQ(ver.rc, 0) << ver.out;

  fs::path src = tmp_ / "pc/main.cpp";
  write_file(src,
             "#include <cstdio>\n"
             "#include <paratrain/autograd/engine.h>\n#include <paratrain/autograd/ops.h>\n"
             "#include <paratrain/nn/layers.h>\n#include <paratrain/optim/optimizer.h>\n"
             "using namespace paratrain;\n"
             "int main() {\n"
             "  std::vector<float> xs, ys;\n"
             "  for (int i = 0; i < 16; ++i) { float x = i / 8.0f - 1; xs.push_back(x); ys.push_back(3 * x + 0.5f); }\n"
             "  Tensor x = Tensor::from_vector(xs, {16, 1}), y = Tensor::from_vector(ys, {16, 1});\n"
             "  Generator gen(1);\n"
             "  nn::Linear lin(1, 1, true, nn::WeightLayout::OutIn, gen);\n"
             "  optim::SGDOptions o; o.lr = 0.2;\n"
             "  optim::SGD opt(lin.named_parameters(), o);\n"
             "  for (int s = 0; s < 60; ++s) {\n"
             "    lin.zero_grad();\n"
             "    Tensor d = ops::sub(lin.forward(x), y);\n"
             "    Tensor loss = ops::mean(ops::mul(d, d));\n"
             "    autograd::backward(loss);\n"
             "    opt.step();\n"
             "    if (s == 0 || s == 59) std::printf(\"step %d loss %.6f\\n\", s, loss.item());\n"
             "  }\n  return 0;\n}\n");
  fs::path exe = tmp_ / "pc/regress";
  Cmd c = run("g++ -std=c++20 -O1 -o " + exe.string() + " " + src.string() + " $(" + pc +
                  "--cflags --libs paratrain)",
              180);
  ASSERT_EQ(c.rc, 0) << c.out;
  Cmd t = run(exe.string(), 30);
  ASSERT_EQ(t.rc, 0) << t.out;
  std::vector<double> l = losses(t.out);
  ASSERT_EQ(l.size(), 2u) << t.out;
  EXPECT_LT(l[1], l[0] * 0.01) << t.out;
}

}  // namespace
