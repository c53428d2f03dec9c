// Reductions over a list of tensors with one read-back per device (kernels/tensor_reduce.h).
#include "paratrain/kernels/tensor_reduce.h"

#include <cstring>

#include "paratrain/base/error.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::kernels {
namespace {

// The tensors of the list that take part, grouped by device: groups[g] holds their positions
// in the list, devices[g] the device.
struct DeviceGroups {
  std::vector<DeviceSpec> devices;
  std::vector<std::vector<size_t>> groups;
};

DeviceGroups group_by_device(const std::vector<Tensor>& ts, const char* who) {
  DeviceGroups dg;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (!t.defined() || t.numel() == 0) continue;
    if (!t.is_contiguous()) PT_THROW(InputError, who, ": tensor ", i, " is not contiguous");
    const DeviceSpec d = t.device_spec();
    size_t g = 0;
    while (g < dg.devices.size() && !(dg.devices[g] == d)) ++g;
    if (g == dg.devices.size()) {
      dg.devices.push_back(d);
      dg.groups.emplace_back();
    }
    dg.groups[g].push_back(i);
  }
  return dg;
}

// t itself on the CPU; a host copy (the one sync) of a CUDA tensor.
Tensor on_host(const Tensor& t) { return t.is_cuda() ? t.to(DeviceSpec{}) : t; }

}  // namespace

double sum_of_squares(const std::vector<Tensor>& ts) {
  const DeviceGroups dg = group_by_device(ts, "sum_of_squares");
  std::vector<double> term(ts.size(), 0.0);
  std::vector<bool> counted(ts.size(), false);
  for (size_t g = 0; g < dg.devices.size(); ++g) {
    const std::vector<size_t>& members = dg.groups[g];
    const int64_t k = static_cast<int64_t>(members.size());
    Tensor slots = Tensor::empty({k}, DType::I64, dg.devices[g]);  // k doubles
    double* base = static_cast<double*>(slots.data_ptr());
    for (int64_t j = 0; j < k; ++j) {
      const Tensor& t = ts[members[j]];
      kernel(&Registry::sum_squares_into, t)(base + j, t.data_ptr(), t.numel());
    }
    const Tensor host = on_host(slots);
    const char* h = static_cast<const char*>(host.data_ptr());
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(&term[members[j]], h + j * sizeof(double), sizeof(double));
      counted[members[j]] = true;
    }
  }
  double sq = 0.0;
  for (size_t i = 0; i < ts.size(); ++i)
    if (counted[i]) sq += term[i];
  return sq;
}

bool all_finite(const std::vector<Tensor>& ts) {
  const DeviceGroups dg = group_by_device(ts, "all_finite");
  bool finite = true;
  for (size_t g = 0; g < dg.devices.size(); ++g) {
    Tensor flag = Tensor::zeros({1}, DType::I32, dg.devices[g]);
    int32_t* f = static_cast<int32_t*>(flag.data_ptr());
    for (size_t i : dg.groups[g]) kernel(&Registry::nonfinite_into, ts[i])(f, ts[i].data_ptr(), ts[i].numel());
    finite = finite && on_host(flag).data<int32_t>()[0] == 0;
  }
  return finite;
}

std::vector<double> values_of(const std::vector<Tensor>& scalars) {
  for (size_t i = 0; i < scalars.size(); ++i) {
    const Tensor& t = scalars[i];
    if (!t.defined() || t.numel() != 1)
      PT_THROW(InputError, "values_of: tensor ", i, " is ", t.defined() ? "not a one-element tensor" : "undefined");
    if (t.dtype() != DType::F32 && t.dtype() != DType::BF16 && t.dtype() != DType::F16)
      PT_THROW(InputError, "values_of: tensor ", i, " is ", dtype_name(t.dtype()), " (values_of takes f32, bf16, f16)");
  }
  const DeviceGroups dg = group_by_device(scalars, "values_of");
  std::vector<double> out(scalars.size(), 0.0);
  for (size_t g = 0; g < dg.devices.size(); ++g) {
    const std::vector<size_t>& members = dg.groups[g];
    // f32 slots hold every f32, bf16 and f16 value exactly.
    Tensor slots = Tensor::empty({static_cast<int64_t>(members.size())}, DType::F32, dg.devices[g]);
    for (size_t j = 0; j < members.size(); ++j)
      slots.narrow(0, static_cast<int64_t>(j), 1).copy_(scalars[members[j]].reshape({1}));
    const Tensor host = on_host(slots);
    for (size_t j = 0; j < members.size(); ++j) out[members[j]] = host.data<float>()[j];
  }
  return out;
}

}  // namespace paratrain::kernels
