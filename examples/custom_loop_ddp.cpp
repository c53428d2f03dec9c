// A data-parallel training program with its own loop: DistributedDataParallel and AdamW
// used directly, no library training loop. Public headers only.
//
//   example_custom_loop_ddp [STEPS]                                   (one process)
//   paratrain launch --nproc-per-node 2 -- example_custom_loop_ddp [STEPS]
//   mpirun -np 2 example_custom_loop_ddp [STEPS]
//
// The model is a 2-layer MLP (Linear, gelu, Linear) learning a fixed nonlinear function of
// 8 inputs. Sample i of the data set is drawn from its own generator (seed, i), and rank r
// of W owns the samples i with i % W == r, so each rank makes only its own shard. Each
// optimizer step accumulates 2 micro-batches per rank (the first under no_sync(), so only
// the second backward communicates), clips the global gradient norm and steps AdamW.
// Rank 0 prints "step S loss X", the step's loss averaged over ranks; at the end every rank
// prints "rank R checksum C", the sum of its parameters (equal on all ranks: DDP keeps the
// replicas identical). Exit 2 with "error: ..." for bad arguments, 1 for other failures.
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <paratrain/autograd/engine.h>
#include <paratrain/autograd/ops.h>
#include <paratrain/base/error.h>
#include <paratrain/comm/process_group.h>
#include <paratrain/nn/layers.h>
#include <paratrain/nn/module.h>
#include <paratrain/optim/optimizer.h>
#include <paratrain/parallel/ddp.h>
#include <paratrain/tensor/random.h>

using namespace paratrain;

namespace {

constexpr int64_t kInputs = 8, kHidden = 64;
constexpr int64_t kSamples = 512;   // the global data set
constexpr int64_t kMicroBatch = 32; // per rank and micro-step
constexpr int kAccum = 2;           // micro-batches per optimizer step
constexpr uint64_t kSeed = 1234;

// A user-defined model: children registered under names, so its parameters are
// "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" on every rank.
class Mlp : public nn::Module {
 public:
  explicit Mlp(Generator& gen)
      : fc1_(register_module("fc1", std::make_shared<nn::Linear>(kInputs, kHidden, true, nn::WeightLayout::OutIn, gen))),
        fc2_(register_module("fc2", std::make_shared<nn::Linear>(kHidden, 1, true, nn::WeightLayout::OutIn, gen))) {}
  Tensor forward(const Tensor& x) const { return fc2_->forward(ops::gelu(fc1_->forward(x))); }

 private:
  std::shared_ptr<nn::Linear> fc1_, fc2_;
};

// This rank's shard of the synthetic regression set: y = sum_j sin(x . a_j) / 2 with
// x ~ N(0, 1)^8 and a fixed random a (the same on every rank).
struct Shard {
  std::vector<float> x, y;  // x: n rows of kInputs
  int64_t n = 0;
};

Shard make_shard(int rank, int world) {
  Generator teacher_gen(kSeed);
  std::vector<double> a(4 * kInputs);
  for (double& v : a) v = teacher_gen.normal() * 0.3;
  Shard s;
  for (int64_t i = rank; i < kSamples; i += world) {
    Generator g(kSeed * 1000003 + static_cast<uint64_t>(i));  // sample i, whichever rank draws it
    std::vector<double> xi(kInputs);
    for (double& v : xi) v = g.normal();
    double y = 0;
    for (int j = 0; j < 4; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < kInputs; ++k) dot += xi[k] * a[j * kInputs + k];
      y += std::sin(dot) / 2;
    }
    for (double v : xi) s.x.push_back(static_cast<float>(v));
    s.y.push_back(static_cast<float>(y));
    ++s.n;
  }
  return s;
}

// Micro-batch `micro` of step `step`: the next kMicroBatch samples of the shard, cyclically.
void fill_batch(const Shard& s, int step, int micro, Tensor& x, Tensor& y) {
  std::vector<float> xb, yb;
  const int64_t start = (static_cast<int64_t>(step) * kAccum + micro) * kMicroBatch;
  for (int64_t j = 0; j < kMicroBatch; ++j) {
    const int64_t i = (start + j) % s.n;
    xb.insert(xb.end(), s.x.begin() + i * kInputs, s.x.begin() + (i + 1) * kInputs);
    yb.push_back(s.y[i]);
  }
  x = Tensor::from_vector(xb, {kMicroBatch, kInputs});
  y = Tensor::from_vector(yb, {kMicroBatch, 1});
}

int parse_steps(int argc, char** argv) {
  if (argc > 2) PT_THROW(InputError, "expected at most one argument (STEPS), got ", argc - 1);
  if (argc < 2) return 30;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(argv[1], &end, 10);
  if (errno != 0 || end == argv[1] || *end != '\0' || v < 1 || v > 1000000)
    PT_THROW(InputError, "STEPS must be an integer from 1 to 1000000, got '", argv[1], "'");
  return static_cast<int>(v);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const int steps = parse_steps(argc, argv);

    // [guide:loop]
    // The ranks: from `paratrain launch` (RANK, WORLD_SIZE, its store), from mpirun (the MPI
    // backend, when paratrain was built with it), or a group of one when started alone.
    std::shared_ptr<comm::ProcessGroup> pg = comm::create_process_group_from_env();
    const int rank = pg->rank(), world = pg->size();
    if (rank == 0) std::printf("world %d backend %s\n", world, pg->backend_name().c_str());

    Generator gen(kSeed);
    Mlp model(gen);
    // Collective: checks every rank has the same parameters and copies rank 0's to all.
    parallel::DdpOptions ddp_opts;
    ddp_opts.first_bucket_bytes = 256;  // tiny buckets, so this small model has several
    ddp_opts.bucket_bytes = 1024;
    parallel::DistributedDataParallel ddp(model, pg, ddp_opts);

    optim::AdamWOptions opt_opts;
    opt_opts.lr = 1e-2;
    opt_opts.weight_decay = 0.01;
    optim::AdamW opt(model.named_parameters(), opt_opts);

    const Shard shard = make_shard(rank, world);
    const Tensor seed = Tensor::full({}, ddp.backward_seed(kAccum));  // 1/kAccum
    Tensor x, y;
    for (int step = 0; step < steps; ++step) {
      ddp.zero_grad();
      double local_loss = 0;
      for (int micro = 0; micro < kAccum; ++micro) {
        // All but the last micro-batch accumulate locally; the last one's backward launches
        // the buckets' all-reduces as their gradients become ready.
        std::optional<parallel::NoSync> no_sync;
        if (micro < kAccum - 1) no_sync.emplace(ddp.no_sync());
        fill_batch(shard, step, micro, x, y);
        Tensor diff = ops::sub(model.forward(x), y);
        Tensor loss = ops::mean(ops::mul(diff, diff));
        autograd::backward(loss, seed);
        local_loss += loss.item() / kAccum;
      }
      ddp.finish();  // every .grad is now the mean gradient over ranks and micro-batches
      optim::clip_grad_norm(opt.params(), 1.0, optim::grad_norm(opt.params()));
      opt.step();

      // The step's loss averaged over ranks (an all-reduce of one float).
      float mean_loss = static_cast<float>(local_loss);
      pg->allreduce(&mean_loss, 1, DType::F32)->wait();
      mean_loss /= static_cast<float>(world);
      if (rank == 0) std::printf("step %d loss %.9g\n", step, mean_loss);
    }
    // [/guide:loop]

    double checksum = 0;
    for (const Tensor& p : model.parameters())
      for (float v : p.to_vector()) checksum += v;
    std::printf("rank %d checksum %.9g\n", rank, checksum);
  } catch (const InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "failed: %s\n", e.what());
    return 1;
  }
  return 0;
}
