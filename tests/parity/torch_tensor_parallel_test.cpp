// `--save-final` of a tensor-parallel run against PyTorch (Debian's python3-torch, the
// repository's reference tests/python/torch_reference.py): gpt-nano trained 5 steps with
// --tp 2 under `paratrain launch --nproc-per-node 2` writes one whole model file that
// PyTorch loads as it is and gives the same loss on the same batch as paratrain's GPT with
// that file loaded (1e-5 relative). With a vocabulary that tp does not divide (257: padded
// inside the run, never in the file) the file's wte.weight is [257, 64].
//
// The same run with SGD (--optimizer sgd --lr 0.1) writes the weights one process trains
// (1e-6 relative per tensor): tensor parallelism changes only the rounding. (AdamW is not used
// for this comparison: it divides by sqrt(v) and turns the rounding noise in near-zero
// gradients into full-size steps.)
//
// Every spawned process runs under `timeout`; the test skips only when /usr/bin/python3
// cannot import torch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/nn/gpt.h"
#include "support/weights_compare.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

const std::string kPython = "/usr/bin/python3";
const std::string kScript = std::string(PARATRAIN_SOURCE_DIR) + "/tests/python/torch_reference.py";
const std::string kBin = PARATRAIN_BIN;

struct Ran {
  int rc = -1;
  std::string out;
};

// `cmd` through the shell, stdout and stderr captured.
Ran shell(const std::string& cmd) {
  Ran r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// Why the PyTorch reference cannot run here ("" when it can).
std::string torch_missing() {
  if (::access(kPython.c_str(), X_OK) != 0) return kPython + " is not installed";
  Ran r = shell("timeout 120 " + kPython + " -c 'import torch'");
  if (r.rc != 0) return kPython + " cannot import torch (python3-torch not installed?): " + r.out;
  return "";
}

class TorchTensorParallel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::string why = torch_missing(); !why.empty()) GTEST_SKIP() << why;
    char tmpl[] = "/tmp/paratrain_tp_parity_XXXXXX";
    dir_ = mkdtemp(tmpl);
    test::write_structured_token_file(path("t.bin"));
    kernels::cpu::set_num_threads(1);
  }
  void TearDown() override {
    if (dir_.empty()) return;
    if (HasFailure() || std::getenv("PARATRAIN_PARITY_KEEP")) {
      std::printf("  kept %s\n", dir_.c_str());
      return;
    }
    fs::remove_all(dir_);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  // `paratrain train` on gpt-nano for 5 steps in dir_, with `extra`; under
  // `paratrain launch --nproc-per-node nproc` when nproc > 1. 120 s, then SIGTERM (the
  // launcher stops its ranks), SIGKILL 10 s later.
  void train(int nproc, const std::string& extra) {
    const std::string args =
        "train --model gpt-nano --data t.bin --steps 5 --micro-batch 4 --threads 1 --quiet " + extra;
    const std::string cmd = "cd " + dir_ + " && timeout -k 10 120 " + kBin +
                            (nproc > 1 ? " launch --nproc-per-node " + std::to_string(nproc) + " -- " + kBin : "") +
                            " " + args;
    Ran r = shell(cmd);
    ASSERT_EQ(r.rc, 0) << "failed (rc " << r.rc << "): " << cmd << "\n" << r.out;
  }

  void python(const std::string& args) {
    const std::string cmd = "timeout -k 10 300 " + kPython + " " + kScript + " " + args;
    Ran r = shell(cmd);
    ASSERT_EQ(r.rc, 0) << "failed (rc " << r.rc << "): " << cmd << "\n" << r.out;
  }

  // Torch's loss and ours of the weights file `weights` on the batch `batch`.
  void check_loss(const nn::GPTConfig& cfg, const std::string& config_arg, const std::string& weights,
                  const std::string& batch, const std::string& what) {
    ASSERT_NO_FATAL_FAILURE(python("--model gpt --config " + config_arg + " --weights " + weights + " --batch " + batch +
                                   " --out " + path("ref.st") + " --steps 0"));
    auto ref = checkpoint::load_safetensors(path("ref.st"));
    const double torch_loss = ref.at("loss").item();
    nn::GPT model(cfg, 1);
    model.load_state_dict(checkpoint::load_safetensors(weights));  // strict: every name, every shape
    auto b = checkpoint::load_safetensors(batch);
    const double ours = model.loss(b.at("inputs"), b.at("targets")).item();
    const double rel = std::fabs(ours - torch_loss) / std::fabs(torch_loss);
    std::printf("  %s: loss paratrain %.8f, torch %.8f, relative difference %.2e\n", what.c_str(), ours, torch_loss,
                rel);
    EXPECT_LE(rel, 1e-5) << what << ": paratrain " << ours << ", torch " << torch_loss;
  }

  void check_file_shapes(const std::string& file, const nn::GPTConfig& cfg) {
    auto w = checkpoint::load_safetensors(file);
    ASSERT_TRUE(w.count("wte.weight")) << file;
    EXPECT_EQ(w.at("wte.weight").shape(), (Shape{cfg.vocab_size, cfg.n_embd}))
        << file << ": the vocabulary is padded only inside the run";
    EXPECT_EQ(w.at("wpe.weight").shape(), (Shape{cfg.block_size, cfg.n_embd})) << file;
    EXPECT_EQ(w.at("h.0.attn.c_attn.weight").shape(), (Shape{cfg.n_embd, 3 * cfg.n_embd})) << file;
    EXPECT_EQ(w.at("h.1.mlp.c_proj.weight").shape(), (Shape{4 * cfg.n_embd, cfg.n_embd})) << file;
    nn::GPT whole(cfg, 1);
    EXPECT_EQ(w.size(), whole.state_dict().size()) << file << ": every tensor of the whole model, and no more";
  }

  // The whole check for one vocabulary: `vocab_flag` is "" (the preset's 256) or
  // "--vocab-size N"; `config_arg` what torch_reference.py gets for --config; `batch_seed`
  // its --make-batch seed.
  void run_case(const nn::GPTConfig& cfg, const std::string& vocab_flag, const std::string& config_arg,
                int batch_seed) {
    // AdamW (the default optimizer), tp 2: torch loads the file and agrees on the loss.
    ASSERT_NO_FATAL_FAILURE(train(2, vocab_flag + " --tp 2 --save-final tp2.st"));
    ASSERT_NO_FATAL_FAILURE(check_file_shapes(path("tp2.st"), cfg));
    ASSERT_NO_FATAL_FAILURE(
        python("--make-batch " + path("b.st") + " --model gpt --config " + config_arg + " --batch-size 4 --seed " + std::to_string(batch_seed)));
    auto b = checkpoint::load_safetensors(path("b.st"));
    // The batch holds the last row of the vocabulary (with 257, the one row of rank 1's
    // padded slice that is real) as an input and as a target.
    auto count_last = [&](const char* key) {
      int n = 0;
      for (int64_t t : b.at(key).to_vector_i64()) n += t == cfg.vocab_size - 1;
      return n;
    };
    const int last_in = count_last("inputs"), last_target = count_last("targets");
    std::printf("  batch (seed %d): %lld x %lld tokens; token %lld (the last vocabulary row) %d times as input, %d as target\n",
                batch_seed, static_cast<long long>(b.at("inputs").shape()[0]),
                static_cast<long long>(b.at("inputs").shape()[1]), static_cast<long long>(cfg.vocab_size - 1), last_in,
                last_target);
    EXPECT_GT(last_in, 0);
    EXPECT_GT(last_target, 0);
    ASSERT_NO_FATAL_FAILURE(check_loss(cfg, config_arg, path("tp2.st"), path("b.st"), "AdamW tp 2 --save-final"));

    // SGD, tp 2 against one process: the same weights up to rounding.
    ASSERT_NO_FATAL_FAILURE(train(2, vocab_flag + " --optimizer sgd --lr 0.1 --tp 2 --save-final tp2_sgd.st"));
    ASSERT_NO_FATAL_FAILURE(train(1, vocab_flag + " --optimizer sgd --lr 0.1 --save-final one_sgd.st"));
    ASSERT_NO_FATAL_FAILURE(check_file_shapes(path("tp2_sgd.st"), cfg));
    ASSERT_NO_FATAL_FAILURE(check_loss(cfg, config_arg, path("tp2_sgd.st"), path("b.st"), "SGD tp 2 --save-final"));
    const auto tp2 = test::load_weights(path("tp2_sgd.st")), one = test::load_weights(path("one_sgd.st"));
    ASSERT_EQ(tp2.size(), one.size());
    std::string worst;
    const double d = test::max_rel_diff(tp2, one, &worst);
    std::printf("  SGD 5 steps, tp 2 vs one process: worst per-tensor relative difference %.2e (%s)\n", d,
                worst.c_str());
    EXPECT_LE(d, 1e-6) << "worst tensor " << worst;
    // And the training moved the weights from the run's initialisation (the trainer's default
    // --seed 1337): wte.weight, relative to where it started.
    nn::GPT init(cfg, 1337);
    const auto w0 = init.state_dict().at("wte.weight").to_vector();
    const auto& w1 = one.at("wte.weight");
    ASSERT_EQ(w0.size(), w1.size());
    double dd = 0, nn0 = 0;
    for (size_t i = 0; i < w0.size(); ++i) dd += (double(w1[i]) - w0[i]) * (double(w1[i]) - w0[i]), nn0 += double(w0[i]) * w0[i];
    const double moved = std::sqrt(dd / nn0);
    std::printf("  5 SGD steps moved wte.weight by %.2e relative to its initialisation\n", moved);
    EXPECT_GT(moved, 100 * std::max(d, 1e-7)) << "the comparison must be of trained weights";
    EXPECT_LT(moved, 0.5) << "started from GPT(cfg, 1337), as the run does";
  }

  std::string dir_;
};

}  // namespace

TEST_F(TorchTensorParallel, Tp2SaveFinalLoadsInTorchWithTheSameLoss) {
  run_case(nn::GPTConfig::preset("gpt-nano"), "", "gpt-nano", 5);
}

// 257 = 2 x 128 + 1: each rank's slice of the vocabulary is padded to 129 rows inside the
// run; the file holds exactly the 257 rows one process would.
TEST_F(TorchTensorParallel, Tp2SaveFinalWithVocabNotDivisibleByTpLoadsInTorchWithTheSameLoss) {
  nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-nano");
  cfg.vocab_size = 257;
  const std::string config = path("gpt-nano-257.json");
  {
    std::ofstream f(config);
    f << "{\"n_layer\": " << cfg.n_layer << ", \"n_head\": " << cfg.n_head << ", \"n_embd\": " << cfg.n_embd
      << ", \"block_size\": " << cfg.block_size << ", \"vocab_size\": " << cfg.vocab_size << "}\n";
  }
  run_case(cfg, "--vocab-size 257", config, 12);
}
