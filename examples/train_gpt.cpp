// A complete GPT training program written against paratrain's public headers only.
//
//   example_train_gpt TRAIN.bin [STEPS]
//
// Builds gpt-nano, reads windows of the token file in the DESIGN.md data order, and runs
// AdamW steps, printing the loss; then continues the first tokens of the file with the
// trained model (greedy, nn::generate) and prints the token ids. Copy it as the start of
// your own program.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include <paratrain/autograd/engine.h>
#include <paratrain/data/token_loader.h>
#include <paratrain/nn/generate.h>
#include <paratrain/nn/gpt.h>
#include <paratrain/optim/optimizer.h>

using namespace paratrain;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s TRAIN.bin [STEPS]\n", argv[0]);
    return 2;
  }
  const int steps = argc > 2 ? std::atoi(argv[2]) : 50;
  try {
    // [guide:loop]
    nn::GPTConfig cfg = nn::GPTConfig::preset("gpt-nano");
    nn::GPT model(cfg, /*seed=*/1337);
    data::TokenLoader loader(argv[1], cfg.block_size, data::BatchLayout{/*micro_batch=*/8, 1, 1}, /*seed=*/1337);

    optim::AdamWOptions opts;
    opts.lr = 1e-3, opts.beta2 = 0.95, opts.weight_decay = 0.1;
    optim::AdamW opt(model.named_parameters(), opts);

    Tensor inputs, targets;
    for (int step = 0; step < steps; ++step) {
      loader.fill(step, /*micro_step=*/0, /*dp_rank=*/0, inputs, targets);
      model.zero_grad();
      Tensor loss = model.loss(inputs, targets);
      autograd::backward(loss);
      opt.step();
      std::printf("step %d loss %.4f\n", step, loss.item());
    }
    // [/guide:loop]

    // [guide:generate]
    // Continue the first 8 tokens of the data: greedy (temperature 0), 16 new tokens.
    loader.fill(0, 0, 0, inputs, targets);
    std::vector<int32_t> prompt;
    for (int64_t t : inputs.narrow(0, 0, 1).narrow(1, 0, 8).to_vector_i64()) prompt.push_back(static_cast<int32_t>(t));
    nn::GenerateOptions gen;
    gen.temperature = 0;  // > 0 draws from softmax(logits / temperature), seeded by gen.seed
    gen.max_new_tokens = 16;
    std::vector<int32_t> ids = nn::generate(model, prompt, gen);
    std::printf("generated:");
    for (size_t i = prompt.size(); i < ids.size(); ++i) std::printf(" %d", ids[i]);
    std::printf("\n");
    // [/guide:generate]
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
