// Autocast: mixed-precision execution of the ops, like torch.autocast.
//
// Inside an AutocastGuard(DType::BF16) (or F16), each op runs in the precision the policy
// table gives it (autocast.cpp, docs/amp.md): matrix products, attention and convolutions
// in the half type (with f32 accumulation inside the kernels); LayerNorm, softmax, the loss
// and reductions in f32; elementwise ops in the widest type of their inputs (the residual
// stream stays f32); the rest in the type of its input. An op's floating inputs are cast
// to its precision by differentiable casts, so gradients flow back in each tensor's own
// dtype and reach f32 parameters as f32.
//
// Parameters (leaf tensors that require a gradient) are cast once and the half copy is
// reused by every op that uses them until the cache is invalidated: a trainer invalidates
// it after each optimizer step, so the copies are refreshed once per step, not per
// micro-batch. Without a cache of its own, a guard keeps one for its lifetime.
//
// Thread-safety: the autocast state is per thread (like NoGradGuard); a WeightCastCache
// is used by one thread at a time. Lifetime: a cache given to a guard must outlive it.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <functional>
#include <unordered_map>

#include "paratrain/tensor/tensor.h"

namespace paratrain::autograd {

// The precision an op runs in under autocast.
enum class CastPolicy : uint8_t {
  kLowerPrecision,  // the autocast dtype (matmul, linear, bmm, attention, conv2d)
  kFloat32,         // f32 (layer_norm, softmax, log_softmax, cross_entropy)
  kPromote,         // the widest dtype among the inputs (add, sub, mul: the op promotes them itself)
  kKeep,            // the input's dtype (activations, dropout, pooling, embedding, ...)
};

// The policy of an op, by its name in paratrain/autograd/ops.h; InternalError for an op the
// table does not list (every op must be in it).
CastPolicy autocast_policy(std::string_view op);

// The half copies of parameters used under autocast, reused until invalidate().
class WeightCastCache {
 public:
  // p (a leaf that requires grad) in dtype t: converted now when missing or stale, into the
  // same buffer as before (no new memory in steady state). A plain tensor, no graph.
  Tensor get(const Tensor& p, DType t);
  // The parameters changed (an optimizer step): every copy is refreshed on its next use.
  void invalidate();
  void clear();
  // Bytes held by the half copies.
  size_t bytes() const;
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    Tensor half;
    bool fresh = false;
  };
  // By the parameter's storage and offset, not its data pointer: fully sharded data
  // parallelism points different parameters' storages at the same memory one after the other.
  struct Key {
    const Storage* storage;
    int64_t offset;
    bool operator==(const Key& o) const { return storage == o.storage && offset == o.offset; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return std::hash<const void*>()(k.storage) ^ static_cast<size_t>(k.offset); }
  };
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

// Turns autocast on in `dtype` (BF16 or F16; F32 turns it off) for this thread until
// destroyed; nests (the previous state comes back). `cache` (may be null: the guard then
// keeps its own) holds the parameters' half copies.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype, WeightCastCache* cache = nullptr);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_dtype_;
  WeightCastCache* prev_cache_;
  std::unique_ptr<WeightCastCache> own_;
};

// F32 when autocast is off on this thread, else its half type.
DType autocast_dtype();
bool autocast_enabled();

// The input x of op `op` cast to the precision its policy gives under the current autocast
// state; x itself when autocast is off, x is undefined or not floating point, it already has
// that dtype, or the policy is kPromote/kKeep.
Tensor autocast_input(std::string_view op, const Tensor& x);

}  // namespace paratrain::autograd
