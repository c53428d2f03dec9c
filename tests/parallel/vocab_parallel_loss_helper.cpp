// A rank program for the vocab-parallel loss memory test (vocab_parallel_loss_test.cpp).
// Started once per tensor-parallel rank with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
// Usage: vocab_parallel_loss_helper N V
//
// For f32 and then bf16 logits: builds this rank's (N, ceil(V/tp)) columns, resets the CPU
// allocator's peak, runs vocab_parallel_cross_entropy forward and backward and prints
//   vploss rank R dtype D extra_peak_bytes P grad_bytes G loss L
// where P is the allocator's peak over forward + backward above what was in use before (the
// local logits and targets). Then checks the gradient: each row summed over all ranks is 0
// (softmax sums to 1, minus the one-hot) unless the target is ignored. Exit code 0 when the
// check holds; the failure is printed to stderr otherwise.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/parallel/tensor_parallel/vocab_parallel_loss.h"
#include "paratrain/tensor/allocator.h"
#include "paratrain/tensor/random.h"

using namespace paratrain;
using namespace paratrain::parallel;

namespace {

int run_one(const std::shared_ptr<TpGroup>& tp, int64_t N, int64_t V, DType dt) {
  const int rank = tp->rank();
  const int64_t Vl = (V + tp->size() - 1) / tp->size();
  // Targets the same on every rank (seed 7); every tenth ignored.
  std::vector<int32_t> ids(static_cast<size_t>(N));
  Generator tg(7);
  for (int64_t i = 0; i < N; ++i) ids[i] = i % 10 == 3 ? -1 : static_cast<int32_t>(tg.below(static_cast<uint64_t>(V)));
  Tensor targets = Tensor::from_vector_i32(ids, {N});
  Tensor local;
  {
    Tensor f = Tensor::empty({N, Vl});
    Generator g(1000 + static_cast<uint64_t>(rank));
    fill_normal(f, g, 0.0f, 2.0f);
    local = dt == DType::F32 ? f : f.to(dt);
  }
  local.set_requires_grad(true);

  Allocator& alloc = allocator_for(Device::CPU);
  alloc.reset_peak();
  const int64_t before = alloc.stats().bytes_in_use;
  double loss_value = 0;
  {
    Tensor loss = vocab_parallel_cross_entropy(local, targets, rank * Vl, V, tp);
    autograd::backward(loss);
    loss_value = loss.item();
  }
  const int64_t extra = alloc.stats().peak_bytes_in_use - before;
  const Tensor grad = local.grad();
  std::printf("vploss rank %d dtype %s extra_peak_bytes %lld grad_bytes %lld loss %.9g\n", rank, dtype_name(dt),
              static_cast<long long>(extra), static_cast<long long>(grad.nbytes()), loss_value);
  std::fflush(stdout);

  // Row sums of the gradient over all ranks: 0 for counted rows, exactly 0 for ignored ones.
  const std::vector<float> gv = grad.to_vector();
  std::vector<float> rows(static_cast<size_t>(N), 0.0f);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < Vl; ++c) rows[i] += gv[static_cast<size_t>(i * Vl + c)];
  tp->allreduce(rows.data(), rows.size(), DType::F32);
  const double tol = dt == DType::F32 ? 1e-6 : 1e-4;
  for (int64_t i = 0; i < N; ++i)
    if (std::fabs(rows[i]) > tol || (ids[i] == -1 && rows[i] != 0.0f)) {
      std::fprintf(stderr, "rank %d %s: gradient row %lld sums to %g over the ranks, expected 0\n", rank, dtype_name(dt),
                   static_cast<long long>(i), rows[i]);
      return 1;
    }
  if (!std::isfinite(loss_value) || loss_value <= 0) {
    std::fprintf(stderr, "rank %d %s: loss %g\n", rank, dtype_name(dt), loss_value);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: vocab_parallel_loss_helper N V\n");
    return 2;
  }
  try {
    const int64_t N = std::atoll(argv[1]), V = std::atoll(argv[2]);
    auto tp = std::make_shared<TpGroup>(comm::create_process_group_from_env());
    for (DType dt : {DType::F32, DType::BF16})
      if (int rc = run_one(tp, N, V, dt)) return rc;
    if (tp->group()) tp->group()->barrier()->wait();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
