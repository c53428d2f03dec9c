#include "reduction_hook.h"

#include <algorithm>
#include <cmath>

#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"

namespace paratrain::train {

std::optional<BreakReduction> break_reduction_hook(int dp_rank, const optim::NamedParams& params) {
  const std::string v = env::get_string("PARATRAIN_TEST_BREAK_REDUCTION");
  if (v.empty()) return std::nullopt;
  const auto colon = v.rfind(':');
  BreakReduction h;
  try {
    if (colon == std::string::npos || colon == 0) throw std::invalid_argument("no colon");
    size_t used = 0;
    h.name = v.substr(0, colon);
    h.step = std::stoll(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1 || h.step < 1) throw std::invalid_argument("step");
  } catch (const std::exception&) {
    PT_THROW(InputError, "PARATRAIN_TEST_BREAK_REDUCTION='", v, "' is not NAME:STEP (e.g. h.0.mlp.c_fc.weight:2, STEP >= 1)");
  }
  bool known = false;
  for (const auto& [name, p] : params) known = known || name == h.name;
  if (!known)
    PT_THROW(InputError, "PARATRAIN_TEST_BREAK_REDUCTION: the model has no parameter '", h.name, "' (e.g. '",
             params.empty() ? std::string() : params.front().first, "')");
  if (dp_rank != 1) return std::nullopt;
  return h;
}

namespace {

void perturb(Tensor g, const std::string& name, int64_t step) {
  if (!g.defined() || g.numel() == 0) return;
  // .grad and shard pieces are contiguous views: on the CPU `h` is `g` itself; a GPU's
  // gradient is read back, changed and written up again (a test hook: once per run).
  Tensor h = g.to(DeviceSpec{Device::CPU, -1}).contiguous();
  float* d = h.data<float>();
  float m = 0;
  for (int64_t i = 0; i < h.numel(); ++i) m = std::max(m, std::fabs(d[i]));
  const float delta = std::max(0.01f * m, 1e-3f);
  d[0] += delta;
  if (h.data_ptr() != g.data_ptr()) g.copy_(h);
  PT_LOG_WARN(kTrain, "PARATRAIN_TEST_BREAK_REDUCTION: data-parallel rank 1 added ", delta,
              " to the reduced gradient of ", name, " at step ", step);
}

}  // namespace

void break_reduction(const BreakReduction& hook, const optim::NamedParams& params,
                     const parallel::DistributedDataParallel* ddp) {
  if (ddp && ddp->zero_stage() > 0) {
    for (const auto& piece : ddp->shard_pieces())
      if (piece.name == hook.name) return perturb(piece.grad, hook.name, hook.step);
    PT_LOG_WARN(kTrain, "PARATRAIN_TEST_BREAK_REDUCTION: data-parallel rank 1 holds no piece of ", hook.name,
                "'s gradient shard: nothing perturbed");
    return;
  }
  for (const auto& [name, p] : params)
    if (name == hook.name) return perturb(p.grad(), name, hook.step);
}

}  // namespace paratrain::train
