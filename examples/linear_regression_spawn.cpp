// Linear regression with DistributedDataParallel on 2 ranks started by paratrain::spawn: the
// C++ form of the classic PyTorch program (nn.Linear(10, 1), MSELoss, SGD, DistributedSampler,
// DDP, torch.multiprocessing.spawn). Public headers only.
//
//   example_linear_regression_spawn [EPOCHS]            (starts its own 2 ranks)
//   paratrain launch --nproc-per-node 2 -- example_linear_regression_spawn [EPOCHS]
//
// spawn() re-executes this program once per rank, so main() runs in every process up to the
// spawn() call: keep what comes before it cheap. Under `paratrain launch` each process is
// already a rank and spawn() runs train() in place; the results are the same either way.
//
// The data set is 1000 samples x of 10 features, y = w . x + b + noise, made from a fixed
// seed (identical on every rank); each rank reads its share through a DistributedSampler
// (shuffled, reseeded per epoch) in batches of 32. Rank 0 prints "epoch E loss X" (its mean
// batch loss of the epoch) and the final weights; every rank prints "rank R checksum C", a
// hash of its parameters' bytes (equal on all ranks: DDP keeps the replicas identical).
// Exit 2 with "error: ..." for bad arguments, 1 for other failures.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <paratrain/autograd/engine.h>
#include <paratrain/autograd/ops.h>
#include <paratrain/base/error.h>
#include <paratrain/comm/process_group.h>
#include <paratrain/data/distributed_sampler.h>
#include <paratrain/launch/spawn.h>
#include <paratrain/nn/layers.h>
#include <paratrain/optim/optimizer.h>
#include <paratrain/parallel/ddp.h>
#include <paratrain/tensor/random.h>

using namespace paratrain;

namespace {

constexpr int kRanks = 2;
constexpr int64_t kFeatures = 10;
constexpr int64_t kSamples = 1000;
constexpr int64_t kBatch = 32;  // per rank
constexpr uint64_t kDataSeed = 2024, kModelSeed = 7, kSamplerSeed = 42;

// The synthetic data set: x ~ N(0, 1), y = w_true . x + b_true + N(0, 0.01^2).
struct Dataset {
  std::vector<float> x;  // kSamples x kFeatures, row-major
  std::vector<float> y;  // kSamples
};

Dataset make_dataset() {
  Generator g(kDataSeed);
  Dataset d;
  d.x.resize(kSamples * kFeatures);
  d.y.resize(kSamples);
  for (int64_t i = 0; i < kSamples; ++i) {
    double y = 0.5;  // b_true
    for (int64_t j = 0; j < kFeatures; ++j) {
      const double w = (j % 2 ? -1.0 : 1.0) * static_cast<double>(j + 1) / 10.0;  // w_true
      const double xv = g.normal();
      d.x[static_cast<size_t>(i * kFeatures + j)] = static_cast<float>(xv);
      y += w * xv;
    }
    d.y[static_cast<size_t>(i)] = static_cast<float>(y + 0.01 * g.normal());
  }
  return d;
}

// 64-bit FNV-1a over the bytes of every parameter, in registration order.
uint64_t checksum(const nn::Module& m) {
  uint64_t h = 1469598103934665603ull;
  for (const auto& [name, t] : m.named_parameters()) {
    std::vector<float> v = t.to_vector();
    const auto* p = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
  }
  return h;
}

int train(int rank, int epochs) {
  // [guide:ddp]
  auto pg = comm::create_process_group_from_env();  // from the launcher's environment
  const Dataset data = make_dataset();

  Generator gen(kModelSeed);
  nn::Linear model(kFeatures, 1, /*bias=*/true, nn::WeightLayout::OutIn, gen);  // torch.nn.Linear(10, 1)
  parallel::DistributedDataParallel ddp(model, pg);  // broadcasts rank 0's parameters
  optim::SGDOptions so;
  so.lr = 0.1;
  optim::SGD opt(model.named_parameters(), so);

  data::DistributedSamplerOptions sopt;
  sopt.seed = kSamplerSeed;
  data::DistributedSampler sampler(kSamples, pg->size(), rank, sopt);

  for (int epoch = 0; epoch < epochs; ++epoch) {
    sampler.set_epoch(epoch);
    const std::vector<int64_t> idx = sampler.indices();
    double loss_sum = 0;
    int batches = 0;
    for (size_t start = 0; start < idx.size(); start += kBatch) {
      const size_t n = std::min<size_t>(kBatch, idx.size() - start);
      std::vector<float> xb(n * kFeatures), yb(n);
      for (size_t i = 0; i < n; ++i) {
        const auto s = static_cast<size_t>(idx[start + i]);
        std::memcpy(&xb[i * kFeatures], &data.x[s * kFeatures], kFeatures * sizeof(float));
        yb[i] = data.y[s];
      }
      Tensor x = Tensor::from_vector(xb, {static_cast<int64_t>(n), kFeatures});
      Tensor y = Tensor::from_vector(yb, {static_cast<int64_t>(n), 1});

      ddp.zero_grad();
      Tensor diff = ops::sub(model.forward(x), y);
      Tensor loss = ops::mean(ops::mul(diff, diff));  // MSE
      autograd::backward(loss);
      ddp.finish();  // .grad = the mean over ranks
      opt.step();
      loss_sum += loss.item();
      ++batches;
    }
    if (rank == 0) std::printf("epoch %d loss %.8f\n", epoch, loss_sum / batches);
  }
  // [/guide:ddp]

  if (rank == 0) {
    std::vector<float> w = model.weight.to_vector();
    std::printf("weights");
    for (float v : w) std::printf(" %.9g", static_cast<double>(v));
    std::printf(" bias %.9g\n", model.bias.item());
  }
  std::printf("rank %d checksum %016llx\n", rank, static_cast<unsigned long long>(checksum(model)));
  return 0;
}

}  // namespace

// [guide:spawn]
int main(int argc, char** argv) {
  // Runs in every process (spawn re-executes the program): parse, nothing expensive.
  int epochs = 10;
  if (argc > 2 || (argc == 2 && (epochs = std::atoi(argv[1])) < 1)) {
    std::fprintf(stderr, "error: usage: %s [EPOCHS >= 1]\n", argv[0]);
    return 2;
  }
  try {
    return spawn(kRanks, [&](int rank) { return train(rank, epochs); });
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    return 1;
  }
}
// [/guide:spawn]
