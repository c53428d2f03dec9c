// The data a SupervisedTask (train/supervised_task.h) trains on: a Dataset is a numbered list
// of examples, each an (input, target) pair of tensors; the task stacks the examples the data
// order (data/data_order.h) picks into a batch, inputs [B, ...input shape] and targets
// [B, ...target shape].
//
// Every example of a dataset must have the shapes and dtypes of example 0 (any dtype: f32
// features, i32 token ids or class labels, ...); the task checks each one and throws
// InputError naming the index and both shapes otherwise. get() must return the same example
// for the same index every time (a resumed run and every rank rely on it) and must not
// depend on the model.
//
// Thread-safety: get() is called from the data prefetcher's worker thread and from the
// training thread (setup, evaluation), possibly at the same time: it must be safe to call
// concurrently (read-only access to data loaded beforehand is). Lifetime: the caller owns a
// Dataset; it must outlive every task that refers to it.
#pragma once

#include <cstdint>

#include "paratrain/tensor/tensor.h"

namespace paratrain::train {

struct Example {
  Tensor input, target;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example `index` in [0, size()); the tensors may be views of larger ones (they are copied).
  virtual Example get(int64_t index) const = 0;
};

// A dataset over two tensors that hold all of it: example i is (inputs[i], targets[i]), like
// torch.utils.data.TensorDataset. Shares their storage (no copy); they must not be written
// while training reads them. InputError unless both have the same size on dim 0 (>= 1).
class TensorDataset final : public Dataset {
 public:
  TensorDataset(Tensor inputs, Tensor targets);
  int64_t size() const override { return inputs_.shape()[0]; }
  Example get(int64_t index) const override;

 private:
  Tensor inputs_, targets_;
};

}  // namespace paratrain::train
