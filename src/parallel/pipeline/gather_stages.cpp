// gather_stages (stage_model.h): every pipeline stage's tensors onto pipeline rank 0.
//
// The sizes go round as a collective (host figures; nccl stages them through the device);
// then each other rank sends two messages to rank 0 -- its layout (per tensor the name's
// length, ndim, dims, then the name's bytes, as i64) and all its f32 data in one buffer --
// on the device of its tensors, since nccl moves device buffers only. Rank 0 receives them
// from rank 1, 2, ... in turn, in the order they were sent (nccl matches in posting order).
#include <string>
#include <utility>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/parallel/pipeline/stage_model.h"

namespace paratrain::parallel::pipeline {

namespace {

constexpr int kTag = 1 << 28;

// The layout message of `tensors` (see the top of this file).
std::vector<int64_t> layout_of(const std::map<std::string, Tensor>& tensors, int64_t& total) {
  std::vector<int64_t> layout;
  total = 0;
  for (const auto& [name, t] : tensors) {
    if (t.dtype() != DType::F32) PT_THROW(Error, "gather_stages: ", name, " is not f32");
    layout.push_back(static_cast<int64_t>(name.size()));
    layout.push_back(t.dim());
    for (int64_t d : t.shape()) layout.push_back(d);
    for (char ch : name) layout.push_back(static_cast<unsigned char>(ch));
    total += t.numel();
  }
  return layout;
}

// Adds to `all` the tensors a layout and its data describe (copies on the data's device);
// a name `all` holds already keeps its tensor (the lowest stage's copy wins).
void unpack(const std::vector<int64_t>& layout, const Tensor& data, std::map<std::string, Tensor>& all) {
  size_t h = 0;
  int64_t offset = 0;
  while (h < layout.size()) {
    const size_t len = static_cast<size_t>(layout[h++]);
    const int64_t ndim = layout[h++];
    Shape shape(layout.begin() + static_cast<std::ptrdiff_t>(h), layout.begin() + static_cast<std::ptrdiff_t>(h + ndim));
    h += static_cast<size_t>(ndim);
    std::string name;
    for (size_t k = 0; k < len; ++k) name.push_back(static_cast<char>(layout[h + k]));
    h += len;
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    if (!all.count(name)) all.emplace(std::move(name), data.narrow(0, offset, numel).view(shape).clone());
    offset += numel;
  }
}

}  // namespace

std::map<std::string, Tensor> gather_stages(const std::map<std::string, Tensor>& mine, comm::ProcessGroup* pp) {
  if (!pp || pp->size() == 1) return mine;
  const DeviceSpec device = mine.empty() ? DeviceSpec{Device::CPU, -1} : mine.begin()->second.device_spec();
  int64_t total = 0;
  const std::vector<int64_t> layout = layout_of(mine, total);
  const int64_t my_sizes[2] = {static_cast<int64_t>(layout.size()), total};
  std::vector<int64_t> sizes(2 * static_cast<size_t>(pp->size()));
  pp->allgather(my_sizes, sizes.data(), 2, DType::I64)->wait();
  if (pp->rank() != 0) {
    const Tensor meta = Tensor::from_vector_i64(layout, {my_sizes[0]}).to(device);
    Tensor data = Tensor::empty({total}, DType::F32, device);
    int64_t offset = 0;
    for (const auto& [name, t] : mine) {
      data.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
      offset += t.numel();
    }
    std::vector<comm::WorkPtr> works;
    if (my_sizes[0]) works.push_back(pp->send(meta.data_ptr(), static_cast<size_t>(my_sizes[0]), DType::I64, 0, kTag));
    if (total) works.push_back(pp->send(data.data_ptr(), static_cast<size_t>(total), DType::F32, 0, kTag));
    for (auto& w : works) w->wait();
    return mine;
  }
  std::map<std::string, Tensor> all = mine;
  for (int src = 1; src < pp->size(); ++src) {
    const int64_t n = sizes[2 * static_cast<size_t>(src)], count = sizes[2 * static_cast<size_t>(src) + 1];
    Tensor meta = Tensor::empty({n}, DType::I64, device), data = Tensor::empty({count}, DType::F32, device);
    std::vector<comm::WorkPtr> works;
    if (n) works.push_back(pp->recv(meta.data_ptr(), static_cast<size_t>(n), DType::I64, src, kTag));
    if (count) works.push_back(pp->recv(data.data_ptr(), static_cast<size_t>(count), DType::F32, src, kTag));
    for (auto& w : works) w->wait();
    unpack(meta.to_vector_i64(), data, all);
  }
  return all;
}

}  // namespace paratrain::parallel::pipeline
