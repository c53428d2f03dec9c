// docs/library.md is compiled code: every snippet in it is marked
//   <!-- snippet: examples/FILE.cpp#NAME -->
// followed by a ```cpp block that must equal the lines between `// [guide:NAME]` and
// `// [/guide:NAME]` in that example (common indentation removed). The examples themselves
// are built against the installed package and run by the tests in this folder, so a guide
// snippet that no longer compiles or no longer says what the code does fails here.
// scripts/sync_guide_snippets.py rewrites the blocks from the examples.
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "install/install_fixture.h"

namespace fs = std::filesystem;
using namespace paratrain::install_test;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The region NAME of an example, without its common indentation; empty when not there.
std::string guide_region(const std::string& source, const std::string& name) {
  std::vector<std::string> region;
  bool inside = false, found = false;
  for (const std::string& l : lines_of(source)) {
    if (l.find("// [/guide:" + name + "]") != std::string::npos) {
      inside = false;
      continue;
    }
    if (l.find("// [guide:" + name + "]") != std::string::npos) {
      inside = found = true;
      continue;
    }
    if (inside) region.push_back(l);
  }
  if (!found) return "";
  size_t indent = std::string::npos;
  for (const std::string& l : region)
    if (l.find_first_not_of(' ') != std::string::npos) indent = std::min(indent, l.find_first_not_of(' '));
  std::string out;
  for (const std::string& l : region) out += (l.size() >= indent ? l.substr(indent) : std::string()) + "\n";
  return out;
}

struct Snippet {
  std::string file, name, block;
  int line = 0;
};

std::vector<Snippet> doc_snippets(const std::string& doc) {
  std::vector<Snippet> out;
  std::vector<std::string> ls = lines_of(doc);
  std::regex marker(R"(<!-- snippet: (examples/[A-Za-z0-9_]+\.cpp)#([A-Za-z0-9_]+) -->)");
  for (size_t i = 0; i < ls.size(); ++i) {
    std::smatch m;
    if (!std::regex_search(ls[i], m, marker)) continue;
    Snippet s{m[1], m[2], "", static_cast<int>(i + 1)};
    size_t j = i + 1;
    if (j < ls.size() && ls[j] == "```cpp") {
      for (++j; j < ls.size() && ls[j] != "```"; ++j) s.block += ls[j] + "\n";
    } else {
      s.block = "(no ```cpp block right after the marker)";
    }
    out.push_back(s);
  }
  return out;
}

TEST(LibraryGuide, EverySnippetIsTheExampleCode) {
  const fs::path src = source_dir();
  const std::string doc = slurp(src / "docs/library.md");
  ASSERT_FALSE(doc.empty());
  std::vector<Snippet> snippets = doc_snippets(doc);
  // The guide walks from a tensor to multi-rank programs: at least these examples appear.
  std::set<std::string> files;
  for (const Snippet& s : snippets) files.insert(s.file);
  for (const char* want : {"examples/hello_tensor.cpp", "examples/train_gpt.cpp"})
    EXPECT_TRUE(files.count(want)) << "docs/library.md has no snippet of " << want;
  for (const Snippet& s : snippets) {
    const std::string code = slurp(src / s.file);
    ASSERT_FALSE(code.empty()) << "docs/library.md:" << s.line << " names " << s.file << ", which does not exist";
    const std::string region = guide_region(code, s.name);
    ASSERT_FALSE(region.empty()) << s.file << " has no region // [guide:" << s.name << "] (docs/library.md:" << s.line
                                 << ")";
    EXPECT_EQ(s.block, region) << "docs/library.md:" << s.line << " differs from " << s.file << "#" << s.name
                               << "; run scripts/sync_guide_snippets.py";
  }
}

// The guide's first program, built against the installed package only.
TEST_F(Install, HelloTensorBuildsAndItsGradientIsRight) {
  fs::path ex = tmp_ / "examples";
  Cmd r = cmake_project(source_dir() / "examples", ex, "", true, "example_hello_tensor");
  ASSERT_EQ(r.rc, 0) << r.out;
  Cmd t = run((ex / "bin/example_hello_tensor").string(), 30);
  ASSERT_EQ(t.rc, 0) << t.out;
  EXPECT_NE(t.out.find("loss 154.0"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("grad 5 7 9 11 13 15"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("gradient ok"), std::string::npos) << t.out;
}

}  // namespace
