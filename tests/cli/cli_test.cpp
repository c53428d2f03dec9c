// End-to-end tests of the `paratrain` binary: usage errors, bad input (exit 2, one line,
// nothing written), and small real runs of train / data prepare / sample.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "support/cpu_flags.h"
#include "support/run_binary.h"
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/data/token_file.h"
#include "paratrain/tensor/cuda.h"

using namespace paratrain;
namespace fs = std::filesystem;

namespace {

using CmdResult = paratrain::test::CommandResult;

CmdResult run(const std::string& args, int timeout_s = 120) {
  return paratrain::test::run_paratrain(args, timeout_s);
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/paratrain_cli_XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& n) const { return dir_ + "/" + n; }
  // A token file of n tokens cycling through a small pattern (learnable).
  std::string tokens(const std::string& name, int64_t n, int vocab = 256) {
    std::vector<uint16_t> t(n);
    for (int64_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((i * 7 + (i / 13)) % vocab);
    data::write_token_file(path(name), t);
    return path(name);
  }
  // Expects exit code 2 with a single line containing `needle`, and that no output file was made.
  void expect_bad_input(const std::string& args, const std::string& needle) {
    CmdResult r = run(args + " --save-final " + path("out.safetensors") + " --metrics " + path("m.jsonl"));
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_EQ(count_lines(r.out), 1) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
    EXPECT_FALSE(fs::exists(path("out.safetensors")));
    EXPECT_FALSE(fs::exists(path("m.jsonl")));
  }
  std::string dir_;
};

}  // namespace

TEST_F(Cli, HelpAndUsageErrors) {
  CmdResult h = run("--help");
  EXPECT_EQ(h.rc, 0);
  EXPECT_NE(h.out.find("train"), std::string::npos);
  CmdResult th = run("train --help");
  EXPECT_EQ(th.rc, 0);
  for (const char* flag : {"--model", "--micro-batch", "--grad-accum", "--lr-schedule", "--init-from", "--save-final",
                           "--metrics", "--threads", "--eval-every"})
    EXPECT_NE(th.out.find(flag), std::string::npos) << flag;
  CmdResult u = run("frobnicate");
  EXPECT_EQ(u.rc, 2);
  EXPECT_EQ(count_lines(u.out), 1) << u.out;
  expect_bad_input("train --model gpt-nano --data " + tokens("t.bin", 5000) + " --no-such-flag", "--no-such-flag");
  expect_bad_input("train --model gpt-nano --data " + path("t.bin") + " --steps -3", "steps");
  expect_bad_input("train --model gpt-nano --data " + path("t.bin") + " --lr-schedule wavy", "lr-schedule");
  expect_bad_input("train --model gpt-nano --data " + path("t.bin") + " --micro-batch abc", "micro-batch");
  expect_bad_input("train --model gpt-nano --data " + path("t.bin") + " --n-embd 63 --n-head 2", "divisible");
}

TEST_F(Cli, BadDataFiles) {
  expect_bad_input("train --model gpt-nano --data " + path("missing.bin"), "missing.bin");
  // wrong magic
  {
    std::ofstream f(path("magic.bin"), std::ios::binary);
    std::vector<int32_t> header(256, 0);
    header[0] = 12345, header[1] = 1, header[2] = 10;
    f.write(reinterpret_cast<char*>(header.data()), 1024);
    f.write("01234567890123456789", 20);
  }
  expect_bad_input("train --model gpt-nano --data " + path("magic.bin"), "magic");
  // truncated: the header promises more tokens than the file holds
  std::string good = tokens("good.bin", 4000);
  fs::resize_file(good, 1024 + 2000);
  expect_bad_input("train --model gpt-nano --data " + good, "truncated");
  // token ids that do not fit the vocabulary
  expect_bad_input("train --model gpt-nano --vocab-size 100 --data " + tokens("big.bin", 4000, 256), "vocab");
}

// --device: a malformed value, and a GPU the run cannot use (without a CUDA build or a GPU:
// says why; with GPUs: one past the last says how many there are). Runs on GPUs:
// tests/gpu/train_command_gpu_test.cpp. The same for bench comm.
TEST_F(Cli, DeviceChoices) {
  const std::string data = tokens("d.bin", 4000);
  expect_bad_input("train --model gpt-nano --steps 1 --data " + data + " --device gpu", "use cpu, cuda or cuda:N");
  expect_bad_input("train --model gpt-nano --steps 1 --data " + data + " --device cuda:x", "use cpu, cuda or cuda:N");
  const int gpus = cuda::device_count();
  const std::string why = !cuda::built() ? "no CUDA support" : gpus == 0 ? "not available" : "this node has";
  if (gpus == 0) expect_bad_input("train --model gpt-nano --steps 1 --data " + data + " --device cuda", why);
  expect_bad_input("train --model gpt-nano --steps 1 --data " + data + " --device cuda:" + std::to_string(gpus), why);
  expect_bad_input("train --model gpt-nano --steps 1 --data " + data + " --backend nccl", "nccl");
  // bench comm's buffers on a GPU (run there: tests/gpu/bench_comm_gpu_test.cpp).
  for (const auto& [device, needle] :
       {std::pair<std::string, std::string>{"gpu", "use cpu, cuda or cuda:N"},
        {"cuda:" + std::to_string(gpus), gpus == 0 ? "no CUDA GPU" : "does not exist"}}) {
    CmdResult r = run("bench comm --max-bytes 8K --device " + device);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_EQ(count_lines(r.out), 1) << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.out;
  }
}

TEST_F(Cli, BadCheckpoints) {
  std::string data = tokens("t.bin", 5000);
  CmdResult ok = run("train --model gpt-nano --data " + data + " --steps 1 --quiet --save-final " + path("init.safetensors"));
  ASSERT_EQ(ok.rc, 0) << ok.out;
  auto tensors = checkpoint::load_safetensors(path("init.safetensors"));
  auto missing = tensors;
  missing.erase("h.1.mlp.c_fc.bias");
  checkpoint::save_safetensors(path("missing.safetensors"), missing);
  expect_bad_input("train --model gpt-nano --data " + data + " --init-from " + path("missing.safetensors"),
                   "h.1.mlp.c_fc.bias");
  auto wrong = tensors;
  wrong["ln_f.weight"] = Tensor::zeros({65});
  checkpoint::save_safetensors(path("wrong.safetensors"), wrong);
  expect_bad_input("train --model gpt-nano --data " + data + " --init-from " + path("wrong.safetensors"), "ln_f.weight");
  {
    std::ofstream f(path("garbage.safetensors"), std::ios::binary);
    f << "not a safetensors file at all";
  }
  expect_bad_input("train --model gpt-nano --data " + data + " --init-from " + path("garbage.safetensors"),
                   "garbage.safetensors");
}

TEST_F(Cli, TrainSaveResumeFromInitAndMetrics) {
  std::string data = tokens("t.bin", 20000);
  CmdResult r = run("train --model gpt-nano --data " + data + " --val-data " + data +
              " --steps 30 --lr 3e-3 --quiet --eval-batches 2 --metrics " + path("m.jsonl") + " --save-final " +
              path("final.safetensors"));
  ASSERT_EQ(r.rc, 0) << r.out;
  std::ifstream m(path("m.jsonl"));
  std::string line, last_train, eval_line;
  int lines = 0;
  while (std::getline(m, line)) {
    lines++;
    if (line.find("\"eval\":true") != std::string::npos)
      eval_line = line;
    else
      last_train = line;
  }
  EXPECT_EQ(lines, 31);
  for (const char* key : {"\"step\":29", "\"loss\"", "\"lr\"", "\"grad_norm\"", "\"tokens_per_s\"", "\"step_ms\"",
                          "\"mfu\"", "\"mem_peak_bytes\":[", "\"step_ms_per_rank\":["})
    EXPECT_NE(last_train.find(key), std::string::npos) << key << " in " << last_train;
  EXPECT_NE(eval_line.find("\"val_loss\""), std::string::npos) << eval_line;
  // MFU is against the hardware peak: a true upper bound, so every step is in (0, 1].
  {
    std::ifstream mm(path("m.jsonl"));
    std::vector<long> faults;
    while (std::getline(mm, line)) {
      auto j = nlohmann::json::parse(line);
      if (j.contains("eval")) continue;
      faults.push_back(j.at("page_faults").get<long>());
      // torch.cuda's memory_allocated and memory_reserved beside the peak, per rank (here the
      // CPU's caching allocator): the parameters and AdamW's state stay allocated between
      // steps; in use <= peak, and <= reserved (in use + cached).
      ASSERT_EQ(j.at("mem_allocated_bytes").size(), 1u) << line;
      ASSERT_EQ(j.at("mem_reserved_bytes").size(), 1u) << line;
      const int64_t allocated = j["mem_allocated_bytes"][0], reserved = j["mem_reserved_bytes"][0],
                    peak = j["mem_peak_bytes"][0];
      EXPECT_GE(allocated, j.at("mem_param_bytes")[0].get<int64_t>() + j.at("mem_optimizer_bytes")[0].get<int64_t>())
          << line;
      EXPECT_LE(allocated, peak) << line;
      EXPECT_LE(allocated, reserved) << line;
      EXPECT_GT(j.at("peak_flops").get<double>(), 1e9) << line;
      EXPECT_GT(j.at("mfu").get<double>(), 0.0) << line;
      EXPECT_LE(j.at("mfu").get<double>(), 1.0) << line;
    }
    // page_faults shows the first step touching fresh memory and the steady state reusing it.
    ASSERT_EQ(faults.size(), 30u);
    EXPECT_GT(faults.front(), 100) << "the first step faults its activations and gradients in";
    EXPECT_LE(faults.back() * 4, faults.front()) << "step 30 should reuse the allocator's memory";
  }
  // The saved model loads back with the GPT-2 names and shapes.
  auto t = checkpoint::read_safetensors(path("final.safetensors"));
  EXPECT_EQ(t.tensors.at("wte.weight").shape(), (Shape{256, 64}));
  EXPECT_EQ(t.tensors.at("h.1.attn.c_attn.weight").shape(), (Shape{64, 192}));
  EXPECT_EQ(t.metadata.at("n_head"), "2");
  // Starting from it continues from a low loss.
  CmdResult r2 = run("train --model gpt-nano --data " + data + " --steps 1 --quiet --init-from " + path("final.safetensors") +
               " --metrics " + path("m2.jsonl"));
  ASSERT_EQ(r2.rc, 0) << r2.out;
  std::ifstream m2(path("m2.jsonl"));
  std::getline(m2, line);
  double first_loss = std::stod(line.substr(line.find("\"loss\":") + 7));
  EXPECT_LT(first_loss, 4.0) << "a model initialised from the trained weights should start far below ln(256)=5.5";
}

TEST_F(Cli, PrepareTrainSample) {
  {
    std::ofstream f(path("corpus.txt"));
    for (int i = 0; i < 400; ++i)
      f << "the quick brown fox jumps over the lazy dog number " << i % 17 << "\n"
        << "a small cat sleeps on the warm mat near the door\n";
  }
  CmdResult p = run("data prepare --text " + path("corpus.txt") + " --vocab-size 300 --out " + path("data"));
  ASSERT_EQ(p.rc, 0) << p.out;
  CmdResult t = run("train --model gpt --n-layer 2 --n-head 2 --n-embd 64 --block-size 32 --vocab-size 300 --data " +
              path("data/train.bin") + " --steps 250 --micro-batch 8 --lr 3e-3 --quiet --save-final " +
              path("m.safetensors"));
  ASSERT_EQ(t.rc, 0) << t.out;
  CmdResult s = run("sample --model " + path("m.safetensors") + " --tokenizer " + path("data/tokenizer.model") +
              " --prompt \"the quick\" --max-tokens 20 --temperature 0");
  ASSERT_EQ(s.rc, 0) << s.out;
  EXPECT_EQ(s.out.rfind("the quick", 0), 0u) << s.out;
  EXPECT_NE(s.out.find("fox"), std::string::npos) << "greedy sampling should continue the memorised sentence: " << s.out;
  CmdResult bad = run("sample --model " + path("missing.safetensors") + " --tokenizer " + path("data/tokenizer.model"));
  EXPECT_EQ(bad.rc, 2);
  EXPECT_EQ(count_lines(bad.out), 1) << bad.out;
}

// `paratrain bench compute`: MFU's denominator, the hardware peak, and the GEMM peak, with the
// fraction computed from the two figures it prints. Both are timed on a shared machine, so
// the bound gemm <= hardware is checked with a 2x margin only: a probe that measured the
// wrong vector width (AVX2 on an AVX-512 CPU, or scalar) is off by 2x or more, while noise on
// a busy machine can push one measurement a few percent past the other.
TEST_F(Cli, BenchComputePrintsBothPeaks) {
  CmdResult r = run("bench compute --threads 1 --gemm-seconds 0.05 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j.at("threads"), 1);
  const double gemm = j.at("gemm_peak_gflops").get<double>(), hw = j.at("hardware_peak_gflops").get<double>();
  EXPECT_GT(gemm, 0.0);
  EXPECT_GT(hw, 0.0);
  EXPECT_DOUBLE_EQ(j.at("hardware_peak_gflops_per_thread").get<double>(), hw) << "one thread";
  EXPECT_NEAR(j.at("gemm_fraction_of_hardware").get<double>(), gemm / hw, 1e-9 * gemm / hw);
  EXPECT_LT(gemm, 2.0 * hw) << r.out;
  // the widest FMA the CPU's flags offer, as /proc/cpuinfo lists them, and its f32 lanes
  using paratrain::test::cpuinfo_has_flag;
  const bool avx512 = cpuinfo_has_flag("avx512f"), avx2 = cpuinfo_has_flag("avx2") && cpuinfo_has_flag("fma");
  EXPECT_EQ(j.at("isa").get<std::string>(), avx512 ? "avx512f" : avx2 ? "avx2+fma" : "scalar") << r.out;
  EXPECT_EQ(j.at("lanes").get<int>(), avx512 ? 16 : avx2 ? 8 : 1) << r.out;
  CmdResult bad = run("bench compute --threads 0");
  EXPECT_EQ(bad.rc, 2) << bad.out;
  EXPECT_EQ(count_lines(bad.out), 1) << bad.out;
  EXPECT_NE(bad.out.find("--threads"), std::string::npos) << bad.out;
}
