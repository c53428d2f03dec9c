// A data-parallel training program with its own loop: DistributedDataParallel and AdamW
// used directly, no library training loop. Public headers only.
//
//   example_custom_loop_ddp [STEPS] [--device cpu|cuda|cuda:N]         (one process)
//   paratrain launch --nproc-per-node 2 -- example_custom_loop_ddp [STEPS] [--device ...]
//   mpirun -np 2 example_custom_loop_ddp [STEPS]
//
// --device cuda trains on the rank's GPU (cuda:LOCAL_RANK, one per rank) with NCCL between
// the ranks; cuda:N puts every rank on GPU N, where NCCL refuses to run, so say
// PARATRAIN_BACKEND=shm (GPU buffers staged through host memory). Default: cpu.
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
#include <paratrain/tensor/cuda.h>
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

struct Args {
  int steps = 30;
  std::string device = "cpu";
};

int parse_steps(const char* text) {
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 1 || v > 1000000)
    PT_THROW(InputError, "STEPS must be an integer from 1 to 1000000, got '", text, "'");
  return static_cast<int>(v);
}

Args parse_args(int argc, char** argv) {
  Args a;
  bool have_steps = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device") {
      if (i + 1 == argc) PT_THROW(InputError, "--device needs a value (cpu, cuda or cuda:N)");
      a.device = argv[++i];
    } else if (!have_steps) {
      a.steps = parse_steps(argv[i]);
      have_steps = true;
    } else {
      PT_THROW(InputError, "unexpected argument '", arg, "' (usage: [STEPS] [--device cpu|cuda|cuda:N])");
    }
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args args = parse_args(argc, argv);
    const int steps = args.steps;

    // [guide:gpu]
    // The device: "cuda" is this rank's GPU, cuda:LOCAL_RANK (one GPU per rank, as `paratrain
    // launch` and torchrun count them). It becomes the thread's current GPU before anything is
    // made there, and NCCL connects the ranks unless PARATRAIN_BACKEND names another backend.
    DeviceSpec device = parse_device(args.device);
    if (device.kind == Device::CUDA && device.index < 0) device.index = comm::read_job_env().local_rank;
    comm::ProcessGroupOptions pg_options;
    if (device.kind == Device::CUDA) {
      cuda::set_device(device.index);  // InputError naming the GPU when it is not there
      if (!std::getenv("PARATRAIN_BACKEND")) pg_options.backend = "nccl";
    }
    // [/guide:gpu]

    // [guide:loop]
    // The ranks: from `paratrain launch` (RANK, WORLD_SIZE, its store), from mpirun (the MPI
    // backend, when paratrain was built with it), or a group of one when started alone.
    std::shared_ptr<comm::ProcessGroup> pg = comm::create_process_group_from_env(pg_options);
    const int rank = pg->rank(), world = pg->size();
    if (rank == 0) std::printf("world %d backend %s\n", world, pg->backend_name().c_str());

    Generator gen(kSeed);
    Mlp model(gen);
    model.to(device);  // every parameter to the device, before DDP and the optimizer see them
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
    const Tensor seed = Tensor::full({}, ddp.backward_seed(kAccum)).to(device);  // 1/kAccum
    Tensor x, y;
    for (int step = 0; step < steps; ++step) {
      ddp.zero_grad();
      Tensor step_loss;  // the micro-batches' losses, summed where they are (no wait for a GPU)
      for (int micro = 0; micro < kAccum; ++micro) {
        // All but the last micro-batch accumulate locally; the last one's backward launches
        // the buckets' all-reduces as their gradients become ready.
        std::optional<parallel::NoSync> no_sync;
        if (micro < kAccum - 1) no_sync.emplace(ddp.no_sync());
        fill_batch(shard, step, micro, x, y);
        x = x.to(device), y = y.to(device);
        Tensor diff = ops::sub(model.forward(x), y);
        Tensor loss = ops::mean(ops::mul(diff, diff));
        autograd::backward(loss, seed);
        step_loss = micro == 0 ? loss.detach() : ops::add(step_loss, loss.detach());
      }
      ddp.finish();  // every .grad is now the mean gradient over ranks and micro-batches
      optim::clip_grad_norm(opt.params(), 1.0, optim::grad_norm(opt.params()));
      opt.step();

      // The step's loss averaged over ranks (an all-reduce of one float; item() is the step's
      // one wait for the device).
      float mean_loss = static_cast<float>(step_loss.item() / kAccum);
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
