// checkpoint::load_gpt: the configuration is read off a GPT file (wte/wpe shapes, blocks
// counted, n_head from the options, the metadata or n_embd / 64), the weights come back
// exactly (same logits), a "transformer." prefix and BF16 weights load, and what is not a
// GPT file of that shape is an InputError naming the file.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/checkpoint/gpt_file.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

class GptFile : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_gpt_file_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return (dir_ / n).string(); }
  fs::path dir_;
};

std::vector<float> logits(const nn::GPT& m) {
  autograd::NoGradGuard ng;
  return m.forward(Tensor::from_vector_i32({1, 5, 9, 2, 7}, {1, 5})).to_vector();
}

void expect_error(const std::string& file, const std::string& needle, checkpoint::GPTFileOptions o = {}) {
  try {
    checkpoint::load_gpt(file, o);
    ADD_FAILURE() << "no error for " << file;
  } catch (const InputError& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find(file), std::string::npos) << w;
    EXPECT_NE(w.find(needle), std::string::npos) << w;
  }
}

}  // namespace

TEST_F(GptFile, ConfigAndWeightsRoundTrip) {
  nn::GPT m(nn::GPTConfig{3, 4, 32, 16, 40, 0.0f}, 11);
  checkpoint::save_safetensors(path("m.safetensors"), m.state_dict(), {{"n_head", "4"}});
  auto g = checkpoint::load_gpt(path("m.safetensors"));
  const nn::GPTConfig& c = g->config();
  EXPECT_EQ(c.n_layer, 3);
  EXPECT_EQ(c.n_head, 4);
  EXPECT_EQ(c.n_embd, 32);
  EXPECT_EQ(c.block_size, 16);
  EXPECT_EQ(c.vocab_size, 40);
  EXPECT_FALSE(g->is_training());
  EXPECT_EQ(logits(*g), logits(m));
  // The options' n_head wins over the metadata.
  checkpoint::GPTFileOptions o;
  o.n_head = 2;
  EXPECT_EQ(checkpoint::load_gpt(path("m.safetensors"), o)->config().n_head, 2);
}

TEST_F(GptFile, PrefixBf16AndHeadFallback) {
  nn::GPT m(nn::GPTConfig{1, 1, 64, 8, 30, 0.0f}, 12);
  checkpoint::NamedTensors named;
  for (const auto& [name, t] : m.state_dict()) named.push_back({"transformer." + name, t.to(DType::BF16)});
  checkpoint::save_safetensors(path("hf.safetensors"), named);
  auto g = checkpoint::load_gpt(path("hf.safetensors"));
  EXPECT_EQ(g->config().n_head, 1) << "no metadata: n_embd / 64";
  auto sd = g->state_dict();
  for (const auto& [name, t] : m.state_dict())
    EXPECT_EQ(sd.at(name).to_vector(), t.to(DType::BF16).to_vector()) << name;
}

TEST_F(GptFile, WhatIsNotSuchAGptIsAnInputErrorNamingTheFile) {
  checkpoint::save_safetensors(path("other.safetensors"), {{"fc1.weight", Tensor::zeros({4, 4})}});
  expect_error(path("other.safetensors"), "not a GPT model");

  nn::GPT m(nn::GPTConfig{2, 2, 32, 8, 20, 0.0f}, 13);
  auto sd = m.state_dict();
  sd.erase("h.1.mlp.c_fc.bias");
  checkpoint::save_safetensors(path("missing.safetensors"), sd);
  expect_error(path("missing.safetensors"), "h.1.mlp.c_fc.bias");

  checkpoint::save_safetensors(path("meta.safetensors"), m.state_dict(), {{"n_head", "two"}});
  expect_error(path("meta.safetensors"), "n_head");
  checkpoint::save_safetensors(path("heads.safetensors"), m.state_dict(), {{"n_head", "3"}});
  expect_error(path("heads.safetensors"), "not divisible by n_head 3");
  checkpoint::GPTFileOptions neg;
  neg.n_head = -1;
  EXPECT_THROW(checkpoint::load_gpt(path("heads.safetensors"), neg), InputError);

  EXPECT_THROW(checkpoint::load_gpt(path("absent.safetensors")), InputError);
}
