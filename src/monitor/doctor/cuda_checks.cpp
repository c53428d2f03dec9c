// cuda_checks(): the build's CUDA support, and what the NVIDIA libraries on this host
// report. libcuda.so.1, libcudart, libnvidia-ml.so.1 and libnccl.so.2 are opened with dlopen
// at run time (never linked), so a host without a driver is a skip with the reason.
#include <dlfcn.h>

#include <cstring>
#include <memory>
#include <set>

#include "monitor/doctor/check_util.h"
#include "paratrain/tensor/cuda.h"

namespace paratrain::monitor::doctor {
namespace {

using detail::make;

#ifdef PARATRAIN_HAVE_CUDA
constexpr bool kBuiltWithCuda = true;
#else
constexpr bool kBuiltWithCuda = false;
#endif

// A dlopen'ed library, closed on destruction; error() holds dlerror()'s text when absent.
class Lib {
 public:
  explicit Lib(std::initializer_list<const char*> names) {
    for (const char* n : names) {
      h_ = ::dlopen(n, RTLD_NOW | RTLD_LOCAL);
      if (h_) {
        name_ = n;
        return;
      }
      const char* e = ::dlerror();
      if (error_.empty() && e) error_ = e;
    }
  }
  ~Lib() {
    if (h_) ::dlclose(h_);
  }
  Lib(const Lib&) = delete;
  Lib& operator=(const Lib&) = delete;
  bool ok() const { return h_ != nullptr; }
  const std::string& error() const { return error_; }
  const std::string& name() const { return name_; }
  template <typename Fn>
  Fn sym(const char* s) const {
    return h_ ? reinterpret_cast<Fn>(::dlsym(h_, s)) : nullptr;
  }

 private:
  void* h_ = nullptr;
  std::string name_, error_;
};

struct Gpu {
  std::string name;
  size_t memory = 0;
  int cc_major = 0, cc_minor = 0;
};

std::string version_text(int v, int major_div) {  // 12040 -> "12.4"
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / 10);
}

// cuda.arch: whether this build's GPU code runs on each of the n GPUs (cuda::kernel_image_problem;
// it makes a CUDA context on each).
void architectures(std::vector<Check>& out, int n) {
  if (!kBuiltWithCuda || n == 0) {
    out.push_back(make("cuda.arch", Status::kSkip, kBuiltWithCuda ? "no GPU" : "this build has no CUDA support"));
    return;
  }
  const std::string built = cuda::built_architectures();
  std::vector<std::string> problems;
  for (int d = 0; d < n && d < cuda::device_count(); ++d) {
    std::string p;
    try {
      p = cuda::kernel_image_problem(d);
    } catch (const std::exception& e) {
      p = "cuda:" + std::to_string(d) + ": " + e.what();
    }
    if (!p.empty()) problems.push_back(p);
  }
  const nlohmann::json data = {{"built_architectures", built}, {"gpus_without_code", problems.size()}};
  if (problems.empty())
    out.push_back(make("cuda.arch", Status::kPass,
                       "this build's GPU code (CUDA architectures " + built + ") runs on every GPU here", "", data));
  else
    out.push_back(make("cuda.arch", Status::kFail,
                       problems.front() + (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) +
                                                                     " more GPU(s))"
                                                                : ""),
                       "rebuild paratrain for these GPUs (the message names the option)", data));
}

void cuda(std::vector<Check>& out) {
  out.push_back(make("cuda.build", kBuiltWithCuda ? Status::kPass : Status::kSkip,
                     kBuiltWithCuda ? "this build has CUDA support" : "this build has no CUDA support (CPU kernels only)", "",
                     {{"built_with_cuda", kBuiltWithCuda}}));

  // ---- the driver ----
  Lib cu({"libcuda.so.1", "libcuda.so"});
  if (!cu.ok()) {
    const std::string why = "no NVIDIA driver: " + cu.error();
    for (const char* n : {"cuda.driver", "cuda.gpus", "cuda.arch", "cuda.p2p", "cuda.nvlink"})
      out.push_back(make(n, Status::kSkip, why, "", {{"reason", why}}));
  } else {
    using InitFn = int (*)(unsigned);
    using IntFn = int (*)(int*);
    using DevGetFn = int (*)(int*, int);
    using NameFn = int (*)(char*, int, int);
    using MemFn = int (*)(size_t*, int);
    using AttrFn = int (*)(int*, int, int);
    using PeerFn = int (*)(int*, int, int);
    using ErrFn = int (*)(int, const char**);
    auto cu_init = cu.sym<InitFn>("cuInit");
    auto cu_version = cu.sym<IntFn>("cuDriverGetVersion");
    auto cu_count = cu.sym<IntFn>("cuDeviceGetCount");
    auto cu_get = cu.sym<DevGetFn>("cuDeviceGet");
    auto cu_name = cu.sym<NameFn>("cuDeviceGetName");
    auto cu_mem = cu.sym<MemFn>("cuDeviceTotalMem_v2");
    auto cu_attr = cu.sym<AttrFn>("cuDeviceGetAttribute");
    auto cu_peer = cu.sym<PeerFn>("cuDeviceCanAccessPeer");
    auto cu_err = cu.sym<ErrFn>("cuGetErrorString");
    auto err_text = [&](int rc) {
      const char* s = nullptr;
      if (cu_err) cu_err(rc, &s);
      return std::string(s ? s : "error ") + " (" + std::to_string(rc) + ")";
    };
    if (!cu_init || !cu_version || !cu_count || !cu_get || !cu_name || !cu_mem || !cu_attr || !cu_peer) {
      out.push_back(make("cuda.driver", Status::kWarn, cu.name() + " lacks driver API functions (too old?)",
                         "update the NVIDIA driver"));
      return;
    }
    int drv = 0;
    cu_version(&drv);
    int rc = cu_init(0);
    int n = 0;
    if (rc == 0) rc = cu_count(&n);
    nlohmann::json dd = {{"library", cu.name()}, {"driver_cuda_version", version_text(drv, 1000)}};
    if (rc != 0) {
      out.push_back(make("cuda.driver", Status::kWarn, "driver (CUDA " + version_text(drv, 1000) + ") present; cuInit: " + err_text(rc),
                         "no usable GPU: check `nvidia-smi`, CUDA_VISIBLE_DEVICES and the device files /dev/nvidia*", dd));
      for (const char* c : {"cuda.gpus", "cuda.arch", "cuda.p2p", "cuda.nvlink"})
        out.push_back(make(c, Status::kSkip, "the driver did not initialise"));
    } else {
      out.push_back(make("cuda.driver", Status::kPass, "driver supports CUDA " + version_text(drv, 1000) + ", " +
                                                           std::to_string(n) + " GPU" + (n == 1 ? "" : "s"),
                         "", dd));
      std::vector<Gpu> gpus(n);
      std::vector<int> dev(n);
      nlohmann::json gl = nlohmann::json::array();
      std::set<std::string> models;
      for (int i = 0; i < n; ++i) {
        cu_get(&dev[i], i);
        char nm[256] = {0};
        cu_name(nm, sizeof(nm) - 1, dev[i]);
        gpus[i].name = nm;
        cu_mem(&gpus[i].memory, dev[i]);
        cu_attr(&gpus[i].cc_major, 75, dev[i]);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
        cu_attr(&gpus[i].cc_minor, 76, dev[i]);  // ..._MINOR
        models.insert(gpus[i].name);
        gl.push_back({{"index", i}, {"name", gpus[i].name}, {"memory_bytes", gpus[i].memory},
                      {"compute_capability", std::to_string(gpus[i].cc_major) + "." + std::to_string(gpus[i].cc_minor)}});
      }
      std::string gv;
      for (int i = 0; i < n; ++i)
        gv += (i ? "; " : "") + std::to_string(i) + ": " + gpus[i].name + " " + detail::human_bytes(double(gpus[i].memory)) +
              " sm_" + std::to_string(gpus[i].cc_major) + std::to_string(gpus[i].cc_minor);
      nlohmann::json gd = {{"count", n}, {"gpus", gl}, {"same_model", models.size() <= 1}};
      if (n == 0)
        out.push_back(make("cuda.gpus", Status::kWarn, "no GPU visible", "check CUDA_VISIBLE_DEVICES and `nvidia-smi`", gd));
      else if (models.size() > 1)
        out.push_back(make("cuda.gpus", Status::kWarn, gv + " (mixed models)",
                           "the slowest GPU sets the pace: pick matching GPUs with CUDA_VISIBLE_DEVICES (or --balance auto)", gd));
      else if (!kBuiltWithCuda)
        out.push_back(make("cuda.gpus", Status::kWarn, gv,
                           "this build cannot use these GPUs: build paratrain with CUDA support", gd));
      else
        out.push_back(make("cuda.gpus", Status::kPass, gv, "", gd));
      architectures(out, n);

      // Peer-to-peer between every pair.
      nlohmann::json pairs = nlohmann::json::array();
      int missing = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          if (i == j) continue;
          int can = 0;
          cu_peer(&can, dev[i], dev[j]);
          if (!can) ++missing;
          pairs.push_back({{"from", i}, {"to", j}, {"p2p", can != 0}});
        }
      if (n < 2)
        out.push_back(make("cuda.p2p", Status::kSkip, "fewer than 2 GPUs", "", {{"pairs", pairs}}));
      else if (missing)
        out.push_back(make("cuda.p2p", Status::kWarn, std::to_string(missing) + " of " + std::to_string(n * (n - 1)) +
                                                          " GPU pairs cannot access each other's memory",
                           "collectives between them go through host memory: check `nvidia-smi topo -m`, IOMMU/ACS settings",
                           {{"pairs", pairs}}));
      else
        out.push_back(make("cuda.p2p", Status::kPass, "every pair of the " + std::to_string(n) + " GPUs has peer access", "",
                           {{"pairs", pairs}}));
    }

    // NVLink through NVML.
    Lib nv({"libnvidia-ml.so.1", "libnvidia-ml.so"});
    if (!nv.ok()) {
      out.push_back(make("cuda.nvlink", Status::kSkip, "NVML not available: " + nv.error()));
    } else if (rc == 0) {
      using NvInit = int (*)();
      using NvCount = int (*)(unsigned*);
      using NvHandle = int (*)(unsigned, void**);
      using NvLinkState = int (*)(void*, unsigned, int*);
      using NvDrv = int (*)(char*, unsigned);
      auto init = nv.sym<NvInit>("nvmlInit_v2");
      auto shutdown = nv.sym<NvInit>("nvmlShutdown");
      auto count = nv.sym<NvCount>("nvmlDeviceGetCount_v2");
      auto handle = nv.sym<NvHandle>("nvmlDeviceGetHandleByIndex_v2");
      auto link = nv.sym<NvLinkState>("nvmlDeviceGetNvLinkState");
      auto drv_ver = nv.sym<NvDrv>("nvmlSystemGetDriverVersion");
      if (!init || !count || !handle || !link || init() != 0) {
        out.push_back(make("cuda.nvlink", Status::kSkip, "NVML did not initialise"));
      } else {
        char dv[96] = {0};
        if (drv_ver) drv_ver(dv, sizeof(dv) - 1);
        unsigned m = 0;
        count(&m);
        nlohmann::json links = nlohmann::json::array();
        int total = 0;
        std::string lv;
        for (unsigned i = 0; i < m; ++i) {
          void* h = nullptr;
          int active = 0;
          if (handle(i, &h) == 0)
            for (unsigned l = 0; l < 18; ++l) {  // NVML_NVLINK_MAX_LINKS
              int state = 0;
              if (link(h, l, &state) == 0 && state == 1) ++active;
            }
          links.push_back(active);
          total += active;
          lv += (i ? ", " : "") + std::to_string(active);
        }
        if (shutdown) shutdown();
        std::string v = std::string("driver ") + dv + "; active NVLinks per GPU: " + (lv.empty() ? "none" : lv);
        if (total == 0) v += " (GPUs talk over PCIe)";
        out.push_back(make("cuda.nvlink", Status::kPass, v, "", {{"driver_version", dv}, {"active_links", links}}));
      }
    }
  }

  // ---- the runtime and NCCL (optional libraries) ----
  Lib rt({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"});
  if (!rt.ok()) {
    out.push_back(make("cuda.runtime", Status::kSkip, "no CUDA runtime library: " + rt.error()));
  } else {
    int v = 0;
    auto fn = rt.sym<int (*)(int*)>("cudaRuntimeGetVersion");
    if (fn) fn(&v);
    out.push_back(make("cuda.runtime", Status::kPass, rt.name() + ": CUDA runtime " + version_text(v, 1000), "",
                       {{"library", rt.name()}, {"version", version_text(v, 1000)}}));
  }
  Lib nccl({"libnccl.so.2", "libnccl.so"});
  if (!nccl.ok()) {
    out.push_back(make("cuda.nccl", Status::kSkip, "no NCCL library: " + nccl.error()));
  } else {
    int v = 0;
    auto fn = nccl.sym<int (*)(int*)>("ncclGetVersion");
    if (fn) fn(&v);
    // Since NCCL 2.9: major*10000 + minor*100 + patch; before: major*1000 + minor*100 + patch.
    int major = v >= 20900 ? v / 10000 : v / 1000, minor = v >= 20900 ? (v % 10000) / 100 : (v % 1000) / 100, patch = v % 100;
    std::string ver = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    out.push_back(make("cuda.nccl", Status::kPass, nccl.name() + ": NCCL " + ver, "", {{"library", nccl.name()}, {"version", ver}}));
  }
}

}  // namespace

std::vector<Check> cuda_checks() {
  std::vector<Check> out;
  detail::guarded(out, "cuda", cuda);
  return out;
}

}  // namespace paratrain::monitor::doctor
