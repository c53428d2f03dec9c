// gpu_bf16_peak_flops (monitor/metrics.h): the bf16 GEMM rate measured on one GPU.
#include <chrono>
#include <map>
#include <mutex>

#include "paratrain/kernels/registry.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::monitor {

namespace {

double measure_bf16_gemm(int device) {
  struct CurrentDevice {  // `device` current for the measurement, the caller's again after it
    int prev;
    explicit CurrentDevice(int d) : prev(cuda::current_device()) { cuda::set_device(d); }
    ~CurrentDevice() { cuda::set_device(prev); }
  } current(device);
  constexpr int64_t n = 8192;  // large enough for the tensor cores' full rate (as llm.c's and torch's peak checks)
  const DeviceSpec d{Device::CUDA, device};
  Tensor a = Tensor::zeros({n, n}, DType::BF16, d), b = Tensor::zeros({n, n}, DType::BF16, d),
         c = Tensor::empty({n, n}, DType::BF16, d);
  a.fill_(0.5), b.fill_(0.25);
  const auto gemm = kernels::registry().gemm.at(Device::CUDA, DType::BF16);
  auto run = [&] { gemm(false, false, n, n, n, 1.0f, a.data_ptr(), n, b.data_ptr(), n, 0.0f, c.data_ptr(), n); };
  run();  // the plan and the clocks
  cuda::synchronize();
  constexpr int reps = 10;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) run();
  cuda::synchronize();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * static_cast<double>(n) * n * n * reps / s;
}

}  // namespace

double gpu_bf16_peak_flops(int device) {
  static std::mutex mu;
  static std::map<int, double> measured;
  std::lock_guard<std::mutex> l(mu);
  auto it = measured.find(device);
  if (it == measured.end()) it = measured.emplace(device, measure_bf16_gemm(device)).first;
  return it->second;
}

}  // namespace paratrain::monitor
