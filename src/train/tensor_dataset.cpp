// TensorDataset (train/dataset.h): example i is (inputs[i], targets[i]), views of the two.
#include "paratrain/base/error.h"
#include "paratrain/train/dataset.h"

namespace paratrain::train {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  if (!inputs_.defined() || !targets_.defined() || inputs_.dim() < 1 || targets_.dim() < 1)
    PT_THROW(InputError, "TensorDataset needs two defined tensors of at least one dimension (examples on dim 0)");
  if (inputs_.shape()[0] != targets_.shape()[0])
    PT_THROW(InputError, "TensorDataset: inputs ", shape_str(inputs_.shape()), " and targets ",
             shape_str(targets_.shape()), " hold different numbers of examples on dim 0");
  if (inputs_.shape()[0] < 1) PT_THROW(InputError, "TensorDataset: the tensors hold no example (dim 0 is 0)");
}

Example TensorDataset::get(int64_t index) const {
  if (index < 0 || index >= size())
    PT_THROW(InputError, "TensorDataset: example ", index, " outside [0, ", size(), ")");
  return {inputs_.select(0, index), targets_.select(0, index)};
}

}  // namespace paratrain::train
