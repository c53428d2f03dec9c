// Device presets of the planner (planner.h): memory, peak FLOP/s and link bandwidths per kind,
// and this machine's CPU read from /proc.
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "paratrain/base/error.h"
#include "paratrain/parallel/planner.h"

namespace paratrain::parallel::planner {

namespace {
constexpr int64_t MiB = int64_t(1) << 20;
constexpr double GB = 1e9, TF = 1e12;

// Memory: what nvidia-smi reports as the card's total; reserved: ~1 GiB for the CUDA context,
// cuBLAS workspaces and the allocator's fragmentation. FLOP/s: dense datasheet peaks (fp32
// without TF32; bf16 with f32 accumulation). Bandwidth per GPU and direction: NVLink (or PCIe)
// inside a node of 8, InfiniBand between nodes (one NIC per GPU).
DeviceModel gpu(const std::string& name, int64_t mem_mib, double fp32_tf, double bf16_tf, double intra_gb,
               double inter_gb, const std::string& note) {
  DeviceModel d;
  d.name = name;
  d.memory_bytes = mem_mib * MiB;
  d.reserved_bytes = 1024 * MiB;
  d.peak_flops_fp32 = fp32_tf * TF;
  d.peak_flops_bf16 = bf16_tf * TF;
  d.intra_node_bw = intra_gb * GB;
  d.inter_node_bw = inter_gb * GB;
  d.devices_per_node = 8;
  d.note = note;
  return d;
}
}  // namespace

std::vector<std::string> device_preset_names() {
  return {"cpu", "h100-80g", "h200-141g", "a100-40g", "a100-80g", "v100-16g", "rtx4090-24g"};
}

DeviceModel device_preset(const std::string& name, int ranks) {
  if (name == "cpu") return cpu_device(ranks);
  if (name == "h100-80g")
    return gpu(name, 81559, 67, 989, 450, 50, "H100 SXM: 67 TFLOP/s fp32, 989 bf16; NVLink 4 450 GB/s, NDR IB 50 GB/s");
  if (name == "h200-141g")
    return gpu(name, 143771, 67, 989, 450, 50, "H200 SXM: 67 TFLOP/s fp32, 989 bf16; NVLink 4 450 GB/s, NDR IB 50 GB/s");
  if (name == "a100-40g")
    return gpu(name, 40960, 19.5, 312, 300, 25, "A100 SXM: 19.5 TFLOP/s fp32, 312 bf16; NVLink 3 300 GB/s, HDR IB 25 GB/s");
  if (name == "a100-80g")
    return gpu(name, 81920, 19.5, 312, 300, 25, "A100 SXM: 19.5 TFLOP/s fp32, 312 bf16; NVLink 3 300 GB/s, HDR IB 25 GB/s");
  if (name == "v100-16g")
    return gpu(name, 16160, 15.7, 15.7, 150, 12.5,
               "V100 SXM2: 15.7 TFLOP/s fp32 (no bf16 units: bf16 at the fp32 rate); NVLink 2 150 GB/s, EDR IB 12.5 GB/s");
  if (name == "rtx4090-24g")
    return gpu(name, 24564, 82.6, 165, 25, 12.5, "RTX 4090: 82.6 TFLOP/s fp32, 165 bf16; PCIe 4 x16 25 GB/s, 100 GbE");
  std::string names;
  for (const auto& n : device_preset_names()) names += (names.empty() ? "" : ", ") + n;
  PT_THROW(InputError, "unknown --device '", name, "' (expected ", names, ", or --memory-gib and --peak-tflops)");
}

DeviceModel cpu_device(int ranks) {
  if (ranks < 1) ranks = 1;
  DeviceModel d;
  d.name = "cpu";
  int64_t mem_kib = 0;
  {
    std::ifstream f("/proc/meminfo");
    for (std::string key; f >> key;) {
      if (key == "MemTotal:") {
        f >> mem_kib;
        break;
      }
      std::string rest;
      std::getline(f, rest);
    }
  }
  if (mem_kib <= 0) PT_THROW(Error, "cpu device: cannot read MemTotal from /proc/meminfo");
  double mhz = 0;
  int lanes = 4;
  std::set<std::pair<std::string, std::string>> cores;  // (physical id, core id)
  int threads = 0;
  {
    std::ifstream f("/proc/cpuinfo");
    std::string phys = "0";
    for (std::string line; std::getline(f, line);) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon), value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
      if (key == "processor") ++threads;
      if (key == "physical id") phys = value;
      if (key == "core id") cores.insert({phys, value});
      if (key == "cpu MHz" && mhz == 0) mhz = std::stod(value);
      if (key == "flags") {
        const std::string flags = " " + value + " ";
        if (flags.find(" avx512f ") != std::string::npos)
          lanes = std::max(lanes, 16);
        else if (flags.find(" avx2 ") != std::string::npos)
          lanes = std::max(lanes, 8);
      }
    }
  }
  if (threads == 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int ncores = cores.empty() ? threads : static_cast<int>(cores.size());
  if (mhz <= 0) mhz = 2000;
  const double per_core = mhz * 1e6 * 2 /*FMA units*/ * lanes * 2 /*multiply-add*/;
  const double machine = per_core * ncores;
  d.memory_bytes = mem_kib * 1024 / ranks;
  d.reserved_bytes = 0;
  d.peak_flops_fp32 = machine / ranks;
  d.peak_flops_bf16 = machine / ranks;  // the CPU kernels widen bf16 to f32 for the arithmetic
  d.intra_node_bw = d.inter_node_bw = 10e9;
  d.devices_per_node = ranks;
  std::ostringstream note;
  note << "this machine shared by " << ranks << " rank" << (ranks > 1 ? "s" : "") << ": MemTotal "
       << mem_kib / 1024 << " MiB; " << ncores << " cores x " << mhz << " MHz x " << 2 * lanes * 2
       << " f32 FLOPs per cycle (2 FMA units of " << lanes << " lanes) = " << machine / 1e9
       << " GFLOP/s; shared memory 10 GB/s";
  d.note = note.str();
  return d;
}

}  // namespace paratrain::parallel::planner
