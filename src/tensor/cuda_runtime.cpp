// paratrain::cuda (tensor/cuda.h): devices and streams. With PARATRAIN_HAVE_CUDA it wraps
// the CUDA runtime; without, every query says there is no device (and the allocators of
// tensor/cuda_allocator.h, which live in src/tensor/cuda/ otherwise, refuse).
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/cuda_allocator.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <vector>

#if PARATRAIN_HAVE_CUDA
#include "paratrain/tensor/cuda_check.h"
#include "paratrain/tensor/cuda_device_errors.h"
#include "paratrain/tensor/cuda_device_guard.h"
#endif

namespace paratrain::cuda {

namespace {
std::atomic<uint64_t> g_host_waits{0};
}  // namespace
uint64_t host_waits() { return g_host_waits.load(std::memory_order_relaxed); }
void note_host_wait() { g_host_waits.fetch_add(1, std::memory_order_relaxed); }

#if PARATRAIN_HAVE_CUDA

namespace detail {
void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  int dev = -1;
  cudaGetDevice(&dev);
  const char* base = file;
  for (const char* p = file; *p; ++p)
    if (*p == '/') base = p + 1;
  throw CudaError(paratrain::detail::concat("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err),
                                            ") in ", call, " on cuda:", dev, " (", base, ":", line, ")"));
}
}  // namespace detail

namespace {
struct Probe {
  int count = 0;
  std::string reason;
};
const Probe& probe() {
  static const Probe p = [] {
    Probe r;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear it
      r.reason = std::string("no usable NVIDIA driver or GPU (cudaGetDeviceCount: ") + cudaGetErrorName(e) + ", " +
                 cudaGetErrorString(e) + "; check `nvidia-smi` and `paratrain doctor`)";
      return r;
    }
    r.count = n;
    if (n == 0) r.reason = "no CUDA GPU is visible (CUDA_VISIBLE_DEVICES?)";
    return r;
  }();
  return p;
}

struct DeviceStreams {
  std::once_flag once;
  cudaStream_t compute = nullptr, comm = nullptr;
};
DeviceStreams& streams_of(int d) {
  static std::vector<DeviceStreams> all(static_cast<size_t>(std::max(1, probe().count)));
  require_device(d);
  DeviceStreams& s = all[static_cast<size_t>(d)];
  std::call_once(s.once, [&] {
    DeviceGuard g(d);
    PT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.compute, cudaStreamNonBlocking));
    PT_CUDA_CHECK(cudaStreamCreateWithFlags(&s.comm, cudaStreamNonBlocking));
  });
  return s;
}
int resolve(int d) { return d < 0 ? current_device() : d; }

double bf16_peak_for(const std::string& name) {
  // Dense bf16 tensor-core peaks (NVIDIA datasheets, SXM parts unless named).
  struct Row { const char* key; double tflops; };
  static const Row rows[] = {{"H200", 989.0}, {"H100 PCIe", 756.0}, {"H100", 989.0}, {"GH200", 989.0},
                             {"A100", 312.0}, {"L40S", 362.0},    {"A10", 125.0},  {"4090", 165.0},
                             {"B200", 2250.0}};
  for (const Row& r : rows)
    if (name.find(r.key) != std::string::npos) return r.tflops;
  return 0;
}
}  // namespace

bool built() { return true; }
int device_count() { return probe().count; }
std::string unavailable_reason() { return probe().reason; }

namespace {
std::atomic<bool> g_gpu_in_use{false};
}  // namespace

bool gpu_in_use() { return g_gpu_in_use.load(std::memory_order_acquire); }

void require_device(int d) {
  if (d < 0 || d >= device_count()) {
    if (device_count() == 0) PT_THROW(InputError, "device cuda:", d, " is not available: ", unavailable_reason());
    PT_THROW(InputError, "device cuda:", d, " is not available: this process sees ", device_count(), " GPU(s)");
  }
  // Once per device: a GPU this build has no code for fails here, naming the fix, rather than
  // at its first kernel with "no kernel image is available".
  struct Checked {
    std::once_flag once;
    std::string problem;
  };
  static std::vector<Checked> checked(static_cast<size_t>(device_count()));
  Checked& c = checked[static_cast<size_t>(d)];
  std::call_once(c.once, [&] { c.problem = kernel_image_problem(d); });
  if (!c.problem.empty()) throw InputError(c.problem);
  g_gpu_in_use.store(true, std::memory_order_release);
}

int current_device() {
  if (device_count() == 0) PT_THROW(InputError, "no CUDA device: ", unavailable_reason());
  int d = 0;
  PT_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int d) {
  require_device(d);
  PT_CUDA_CHECK(cudaSetDevice(d));
}

Stream compute_stream(int d) { return streams_of(resolve(d)).compute; }
Stream comm_stream(int d) { return streams_of(resolve(d)).comm; }

void synchronize() {
  note_host_wait();
  PT_CUDA_CHECK(cudaDeviceSynchronize());
  raise_device_errors();  // what the current GPU's kernels found without a wait
}
void synchronize(Stream s) {
  note_host_wait();
  PT_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s)));
}

void stream_wait(Stream waiter, Stream waited) {
  if (waiter == waited) return;
  // The event must belong to the device of the stream it is recorded on; a stream may wait
  // for an event of another device.
  int waited_device = 0;
  PT_CUDA_CHECK(cudaStreamGetDevice(static_cast<cudaStream_t>(waited), &waited_device));
  cudaEvent_t ev;
  {
    DeviceGuard g(waited_device);
    PT_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    PT_CUDA_CHECK(cudaEventRecord(ev, static_cast<cudaStream_t>(waited)));
  }
  PT_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter), ev, 0));
  PT_CUDA_CHECK(cudaEventDestroy(ev));  // released once the wait has happened
}

namespace {
// A copy between host memory and `gpu`'s device on its compute stream, waited for.
void copy_and_wait(void* dst, const void* src, size_t bytes, const void* gpu, cudaMemcpyKind kind) {
  if (bytes == 0) return;
  const int d = device_of(gpu);
  if (d < 0) PT_THROW(InputError, "cuda copy: ", gpu, " is not GPU memory of this process");
  DeviceGuard g(d);
  auto s = static_cast<cudaStream_t>(compute_stream(d));
  PT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s));
  synchronize(s);
}
}  // namespace

void copy_to_host(void* host, const void* gpu, size_t bytes) {
  copy_and_wait(host, gpu, bytes, gpu, cudaMemcpyDeviceToHost);
}
void copy_to_gpu(void* gpu, const void* host, size_t bytes) {
  copy_and_wait(gpu, host, bytes, gpu, cudaMemcpyHostToDevice);
}

DeviceProperties properties(int d) {
  d = resolve(d);
  require_device(d);
  cudaDeviceProp p{};
  PT_CUDA_CHECK(cudaGetDeviceProperties(&p, d));
  DeviceProperties r;
  r.name = p.name;
  r.sm_major = p.major;
  r.sm_minor = p.minor;
  r.multiprocessors = p.multiProcessorCount;
  r.total_memory = static_cast<int64_t>(p.totalGlobalMem);
  r.bf16_peak_tflops = bf16_peak_for(r.name);
  return r;
}

#else  // no CUDA in this build

namespace {
[[noreturn]] void no_cuda() { PT_THROW(InputError, "no CUDA device: this build of paratrain has no CUDA support"); }
}  // namespace

bool built() { return false; }
bool gpu_in_use() { return false; }
int device_count() { return 0; }
std::string unavailable_reason() { return "this build of paratrain has no CUDA support"; }
void require_device(int d) { PT_THROW(InputError, "device cuda:", d, " is not available: ", unavailable_reason()); }
int current_device() { no_cuda(); }
void set_device(int d) { require_device(d); }
Stream compute_stream(int) { no_cuda(); }
Stream comm_stream(int) { no_cuda(); }
void synchronize() { no_cuda(); }
void synchronize(Stream) { no_cuda(); }
void stream_wait(Stream, Stream) { no_cuda(); }
std::string built_architectures() { return ""; }
std::string kernel_image_problem(int) { no_cuda(); }
void copy_to_host(void*, const void*, size_t) { no_cuda(); }
void copy_to_gpu(void*, const void*, size_t) { no_cuda(); }
DeviceProperties properties(int) { no_cuda(); }
Allocator& device_allocator(int d) {
  require_device(d < 0 ? 0 : d);
  no_cuda();
}
int device_of(const void*) { return -1; }
void record_stream(const void*, Stream) { no_cuda(); }
Allocator& pinned_allocator() { no_cuda(); }

#endif

namespace detail {
std::string no_kernel_image_message(int d, const std::string& name, int major, int minor, const std::string& built,
                                    const std::string& cause) {
  const int sm = major * 10 + minor;
  const std::string gpu = "cuda:" + std::to_string(d) + " (" + name + ") is compute capability " +
                          std::to_string(major) + "." + std::to_string(minor);
  const std::string why = cause.empty() ? "" : " (" + cause + ")";
  if (sm < 75) return gpu + ", and paratrain's GPU code needs 7.5 (Turing) or newer" + why;
  // The option that adds this GPU to a list of plain numbers ("80,90" -> "86;80;90"); else this
  // GPU's alone (a list like "native" cannot be extended).
  const std::string arch = std::to_string(sm);
  const bool numbers = !built.empty() && built.find_first_not_of("0123456789,") == std::string::npos;
  std::string both = arch + ";" + built;
  std::replace(both.begin(), both.end(), ',', ';');
  return gpu + ", and this build of paratrain has GPU code for CUDA architectures " + (built.empty() ? "?" : built) +
         " only" + why + ": rebuild it with -DCMAKE_CUDA_ARCHITECTURES=" +
         (numbers ? "\"" + both + "\" (or " + arch + " alone)" : arch) +
         ", or on this machine without that option (a build takes its GPUs' architectures)";
}
}  // namespace detail

}  // namespace paratrain::cuda
