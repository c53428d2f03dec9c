#include "paratrain/nn/module.h"

#include <gtest/gtest.h>

#include "paratrain/nn/classifiers.h"
#include "paratrain/nn/gpt.h"

using namespace paratrain;

TEST(GPT, HuggingFaceNamesShapesAndOrder) {
  nn::GPT model(nn::GPTConfig::preset("gpt-nano"), 1);
  auto params = model.named_parameters();
  ASSERT_EQ(params.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(params.front().first, "wte.weight");
  EXPECT_EQ(params.front().second.shape(), (Shape{256, 64}));
  EXPECT_EQ(params[1].first, "wpe.weight");
  EXPECT_EQ(params.back().first, "ln_f.bias");
  auto sd = model.state_dict();
  EXPECT_EQ(sd.at("h.0.attn.c_attn.weight").shape(), (Shape{64, 192}));
  EXPECT_EQ(sd.at("h.1.mlp.c_fc.weight").shape(), (Shape{64, 256}));
  EXPECT_EQ(sd.at("h.1.mlp.c_proj.weight").shape(), (Shape{256, 64}));
  EXPECT_EQ(sd.at("h.0.attn.c_proj.bias").shape(), (Shape{64}));
  EXPECT_EQ(sd.count("lm_head.weight"), 0u);  // tied to wte
}

TEST(Module, LoadStateDictAcceptsTransformerPrefixAndValidatesBeforeChanging) {
  nn::GPT a(nn::GPTConfig::preset("gpt-nano"), 1), b(nn::GPTConfig::preset("gpt-nano"), 2);
  std::map<std::string, Tensor> prefixed;
  for (auto& [name, t] : a.state_dict()) prefixed["transformer." + name] = t;
  b.load_state_dict(prefixed, true, "transformer.");
  EXPECT_EQ(b.state_dict().at("h.1.ln_2.weight").to_vector(), a.state_dict().at("h.1.ln_2.weight").to_vector());
  EXPECT_EQ(b.state_dict().at("wte.weight").to_vector(), a.state_dict().at("wte.weight").to_vector());

  nn::GPT c(nn::GPTConfig::preset("gpt-nano"), 3);
  auto missing = a.state_dict();
  missing.erase("h.0.ln_1.bias");
  try {
    c.load_state_dict(missing);
    FAIL() << "a missing tensor must be an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("h.0.ln_1.bias"), std::string::npos) << e.what();
  }
  auto extra = a.state_dict();
  extra["h.9.attn.c_attn.weight"] = Tensor::zeros({64, 192});
  EXPECT_THROW(c.load_state_dict(extra, /*strict=*/true), InputError);
  EXPECT_NO_THROW(c.load_state_dict(extra, /*strict=*/false));
  nn::GPT d(nn::GPTConfig::preset("gpt-nano"), 4);
  const auto d_before = d.state_dict().at("wte.weight").to_vector();
  auto wrong = a.state_dict();
  wrong["ln_f.weight"] = Tensor::zeros({65});
  EXPECT_THROW(d.load_state_dict(wrong), InputError);
  EXPECT_EQ(d.state_dict().at("wte.weight").to_vector(), d_before) << "a failed load must change nothing";
}

TEST(Classifiers, TorchNamesAndShapes) {
  nn::CNNClassifier cnn(1);
  auto sd = cnn.state_dict();
  EXPECT_EQ(sd.at("conv1.weight").shape(), (Shape{32, 1, 3, 3}));
  EXPECT_EQ(sd.at("conv2.weight").shape(), (Shape{64, 32, 3, 3}));
  EXPECT_EQ(sd.at("fc1.weight").shape(), (Shape{128, 3136}));
  EXPECT_EQ(sd.at("fc2.bias").shape(), (Shape{10}));
  nn::MLPClassifier mlp(1);
  EXPECT_EQ(mlp.state_dict().at("fc1.weight").shape(), (Shape{256, 784}));
  EXPECT_EQ(mlp.state_dict().at("fc3.weight").shape(), (Shape{10, 256}));
}

TEST(Module, ToCpuOfACpuModelKeepsEveryParameterItsStorageAndValues) {
  nn::GPTConfig cfg;
  cfg.n_layer = 1;
  cfg.n_embd = 16;
  cfg.n_head = 2;
  cfg.block_size = 8;
  cfg.vocab_size = 32;
  nn::GPT model(cfg, 5);
  auto before = model.named_parameters();
  std::vector<std::vector<float>> values;
  std::vector<const void*> memory;
  for (auto& [name, p] : before) {
    values.push_back(p.to_vector());
    memory.push_back(p.data_ptr());
  }
  model.to(DeviceSpec{});
  auto after = model.named_parameters();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].first, before[i].first);
    EXPECT_TRUE(after[i].second.shares_storage(before[i].second)) << after[i].first;
    EXPECT_EQ(after[i].second.data_ptr(), memory[i]) << after[i].first;
    EXPECT_EQ(after[i].second.to_vector(), values[i]) << after[i].first;
    EXPECT_TRUE(after[i].second.requires_grad()) << after[i].first;
    EXPECT_EQ(after[i].second.device_spec(), (DeviceSpec{Device::CPU, -1}));
  }
  // The layers' own handles are the same parameters.
  EXPECT_TRUE(model.wte->weight.shares_storage(before[0].second));
}
