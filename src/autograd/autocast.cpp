#include "paratrain/autograd/autocast.h"

#include <array>

#include "ops/common.h"
#include "paratrain/autograd/ops.h"

namespace paratrain::autograd {

namespace {

// THE autocast policy: which precision each op runs in (docs/amp.md says why per row).
struct PolicyRow {
  std::string_view op;
  CastPolicy policy;
};
constexpr std::array<PolicyRow, 25> kPolicy = {{
    // matrix products, attention, convolutions: the half type, f32 accumulation in the kernel
    {"linear", CastPolicy::kLowerPrecision},
    {"matmul", CastPolicy::kLowerPrecision},
    {"bmm", CastPolicy::kLowerPrecision},
    {"causal_self_attention", CastPolicy::kLowerPrecision},
    {"conv2d", CastPolicy::kLowerPrecision},
    // statistics over rows: f32
    {"layer_norm", CastPolicy::kFloat32},
    {"softmax", CastPolicy::kFloat32},
    {"log_softmax", CastPolicy::kFloat32},
    // the loss: f32 math and an f32 result from half-type logits (the kernel widens them), so
    // the [tokens x vocab] logits saved for backward stay in the half type
    {"cross_entropy", CastPolicy::kKeep},
    // elementwise of two tensors: the widest input (the f32 residual stream stays f32)
    {"add", CastPolicy::kPromote},
    {"sub", CastPolicy::kPromote},
    {"mul", CastPolicy::kPromote},
    // the input's own type (reductions accumulate in f64/f32 inside the kernel)
    {"scale", CastPolicy::kKeep},
    {"relu", CastPolicy::kKeep},
    {"gelu", CastPolicy::kKeep},
    {"tanh", CastPolicy::kKeep},
    {"sigmoid", CastPolicy::kKeep},
    {"sum", CastPolicy::kKeep},
    {"mean", CastPolicy::kKeep},
    {"reshape", CastPolicy::kKeep},
    {"dropout", CastPolicy::kKeep},
    {"max_pool2d", CastPolicy::kKeep},
    {"embedding", CastPolicy::kKeep},
    {"gpt_embedding", CastPolicy::kKeep},
    {"to_dtype", CastPolicy::kKeep},
}};

struct State {
  DType dtype = DType::F32;
  WeightCastCache* cache = nullptr;
};
thread_local State g_state;

}  // namespace

CastPolicy autocast_policy(std::string_view op) {
  for (const auto& r : kPolicy)
    if (r.op == op) return r.policy;
  PT_CHECK(false, "op '", op, "' is missing from the autocast policy table");
  return CastPolicy::kKeep;
}

Tensor WeightCastCache::get(const Tensor& p, DType t) {
  Entry& e = entries_[Key{p.storage().get(), p.offset()}];
  if (!e.half.defined() || e.half.dtype() != t || e.half.shape() != p.shape() ||
      e.half.device_spec() != p.device_spec()) {  // a parameter moved by Module::to gets a new copy there
    e.half = p.new_empty(p.shape(), t);
    e.fresh = false;
  }
  if (!e.fresh) {
    ops::detail::convert_into(e.half, p.contiguous());
    e.fresh = true;
  }
  return e.half;
}

void WeightCastCache::invalidate() {
  for (auto& [key, e] : entries_) e.fresh = false;
}

void WeightCastCache::clear() { entries_.clear(); }

size_t WeightCastCache::bytes() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.half.nbytes();
  return n;
}

AutocastGuard::AutocastGuard(DType dtype, WeightCastCache* cache)
    : prev_dtype_(g_state.dtype), prev_cache_(g_state.cache) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    PT_THROW(InputError, "autocast: dtype must be bf16 or f16 (f32 turns it off), got ", dtype_name(dtype));
  if (!cache && dtype != DType::F32) {
    own_ = std::make_unique<WeightCastCache>();
    cache = own_.get();
  }
  g_state = {dtype, cache};
}

AutocastGuard::~AutocastGuard() { g_state = {prev_dtype_, prev_cache_}; }

DType autocast_dtype() { return g_state.dtype; }
bool autocast_enabled() { return g_state.dtype != DType::F32; }

Tensor autocast_input(std::string_view op, const Tensor& x) {
  if (!autocast_enabled() || !x.defined() || !dtype_is_float(x.dtype())) return x;
  DType target = x.dtype();
  switch (autocast_policy(op)) {
    case CastPolicy::kLowerPrecision: target = g_state.dtype; break;
    case CastPolicy::kFloat32: target = DType::F32; break;
    case CastPolicy::kPromote:  // the op promotes its inputs itself, with or without autocast
    case CastPolicy::kKeep: break;
  }
  if (target == x.dtype()) return x;
  // A parameter: its cached half copy, joined to the graph by a cast whose backward hands
  // the gradient back as f32.
  if (g_state.cache && x.is_leaf() && x.requires_grad() && x.dtype() == DType::F32)
    return ops::detail::cast_view(g_state.cache->get(x, target), x);
  return ops::to_dtype(x, target);
}

}  // namespace paratrain::autograd
