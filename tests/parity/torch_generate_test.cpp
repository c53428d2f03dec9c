// nn::generate against PyTorch: a small random GPT (weights spread so that logits are well
// apart) is written to safetensors, loaded back with checkpoint::load_gpt, and its greedy
// generation -- 20 tokens from a 3-token prompt with block_size 8, so the window slides --
// must equal PyTorch's greedy generation with the same weights (tests/python/torch_generate.py,
// Debian's python3-torch; the model is tests/python/models.py's).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include "paratrain/checkpoint/gpt_file.h"
#include "paratrain/nn/generate.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

std::string run_capture(const std::string& cmd, int& rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    rc = -1;
    return out;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  rc = pclose(p);
  return out;
}

std::string join(const std::vector<int32_t>& ids) {
  std::string s;
  for (size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

}  // namespace

TEST(TorchGenerate, GreedyGenerationMatchesPyTorch) {
  char tmpl[] = "/tmp/paratrain_torch_generate_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path dir = tmpl;
  const std::string file = (dir / "gpt.safetensors").string();
  {
    nn::GPT m(nn::GPTConfig{2, 2, 32, 8, 48, 0.0f}, 21);
    Generator g(22);
    for (auto& [name, p] : m.named_parameters()) {
      if (name.find("ln") != std::string::npos) continue;
      Tensor d = p.detach();
      fill_normal(d, g, 0.0f, 0.5f);
    }
    checkpoint::save_safetensors(file, m.state_dict(), {{"n_head", "2"}});
  }
  auto model = checkpoint::load_gpt(file);
  nn::GenerateOptions o;
  o.temperature = 0;
  o.max_new_tokens = 20;
  const std::vector<int32_t> prompt = {1, 2, 3};
  const std::string ours = join(nn::generate(*model, prompt, o));

  int rc = 0;
  const std::string out = run_capture("timeout 120 /usr/bin/python3 " + std::string(PARATRAIN_SOURCE_DIR) +
                                          "/tests/python/torch_generate.py --weights " + file +
                                          " --n-head 2 --prompt 1,2,3 --max-new-tokens 20",
                                      rc);
  fs::remove_all(dir);
  ASSERT_EQ(rc, 0) << out;
  std::istringstream lines(out);
  std::string theirs, margin_line;
  std::getline(lines, theirs);
  std::getline(lines, margin_line);
  std::printf("  ours  %s\n  torch %s\n  %s\n", ours.c_str(), theirs.c_str(), margin_line.c_str());
  const double margin = std::stod(margin_line.substr(margin_line.find(' ') + 1));
  ASSERT_GT(margin, 1e-3) << "the reference itself is near a tie; pick other weights";
  EXPECT_EQ(ours, theirs);
}
