// Every public header states its contract (STYLE.md, after LevelDB): it opens with a comment
// block, before `#pragma once`, of at least 3 lines that says what its types are for and
// mentions thread-safety. The test scans include/paratrain/**/*.h of the source tree and
// lists every header that does not.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

// The comment lines before `#pragma once` ("" when the file has none or starts otherwise).
// Returns false when `#pragma once` is missing.
bool leading_comment(const fs::path& p, std::vector<std::string>& lines) {
  std::ifstream in(p);
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind("#pragma once", 0) == 0) return true;
    if (l.rfind("//", 0) == 0) {
      lines.push_back(l);
    } else if (!l.empty()) {
      lines.clear();  // code before the pragma: the block must be the file's opening
      return false;
    }
  }
  return false;
}

// What is missing from `p`'s contract ("" when nothing).
std::string contract_problem(const fs::path& p) {
  std::vector<std::string> lines;
  if (!leading_comment(p, lines)) return "no comment block followed by #pragma once at the top";
  static const std::regex thread_re("thread", std::regex::icase);
  int text_lines = 0;
  bool thread = false;
  for (const auto& l : lines) {
    if (l.find_first_not_of("/ \t") != std::string::npos) ++text_lines;
    if (std::regex_search(l, thread_re)) thread = true;
  }
  if (text_lines < 3) return "the opening comment has " + std::to_string(text_lines) + " lines (at least 3)";
  if (!thread) return "the opening comment says nothing of thread-safety";
  return "";
}

}  // namespace

TEST(HeaderContract, EveryPublicHeaderStatesItsContract) {
  const fs::path root = fs::path(PARATRAIN_SOURCE_DIR) / "include" / "paratrain";
  ASSERT_TRUE(fs::is_directory(root)) << root;
  int headers = 0;
  std::ostringstream bad;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file() || e.path().extension() != ".h") continue;
    ++headers;
    const std::string problem = contract_problem(e.path());
    if (!problem.empty()) bad << "  " << fs::relative(e.path(), root.parent_path()).string() << ": " << problem << "\n";
  }
  EXPECT_GT(headers, 50) << "the scan found too few headers under " << root;
  EXPECT_TRUE(bad.str().empty()) << "public headers without a stated contract (what the types are for, "
                                    "thread-safety, lifetimes):\n"
                                 << bad.str();
}

// The scan itself: a header lacking the comment, its length or thread-safety is caught.
TEST(HeaderContract, TheScanCatchesAMissingContract) {
  const fs::path dir = fs::temp_directory_path() / ("paratrain_header_contract_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  };
  EXPECT_NE(contract_problem(write("none.h", "#include <x>\n// Thread-safety: a\n// b\n// c\n#pragma once\n")), "");
  EXPECT_NE(contract_problem(write("nopragma.h", "// A.\n// Thread-safety: none.\n// c\n")), "");
  EXPECT_NE(contract_problem(write("short.h", "// A: for x.\n//\n// Thread-safe.\n#pragma once\n")), "");
  EXPECT_NE(contract_problem(write("nothread.h", "// A: for x.\n// It owns y.\n// It lives long.\n#pragma once\n")), "");
  EXPECT_EQ(contract_problem(write("ok.h", "// A: for x.\n//\n// Thread-safety: none.\n// Lifetimes.\n#pragma once\n")), "");
  fs::remove_all(dir);
}
