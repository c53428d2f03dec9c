// Step metrics: one JSON object per line (DESIGN.md "Metrics"), and the progress line.
//
// MetricsWriter appends lines to --metrics FILE and flushes each, so a crashed run keeps
// every completed step (the file is a log, not a result: it is streamed, not renamed into
// place). ProgressLine formats the human-readable line printed to stderr every step.
// Lifetimes and thread-safety: a MetricsWriter owns its file (closed on destruction) and is
// not thread-safe (one rank's loop writes it; each write() is one whole line, flushed).
// hardware_peak_flops() is measured once per process (a thread-safe static) and may be called
// from any thread; the other functions keep no state.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace paratrain::monitor {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // Opens (truncates) `path`; IoError naming it when it cannot be created. Empty = disabled.
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  bool enabled() const { return f_ != nullptr; }
  void write(const nlohmann::json& line);

 private:
  std::FILE* f_ = nullptr;
  std::string path_;
};

// "1m05s", "2h03m", "45s"
std::string format_duration(double seconds);

// The hardware's f32 peak in FLOP/s on this process's kernel threads: kernels::cpu::fma_peak
// at num_threads(), measured on the first call (a few milliseconds) and cached. The
// denominator of the metrics' mfu, a true upper bound (no f32 work can exceed it).
double hardware_peak_flops();

// The bf16 dense GEMM rate of GPU `device` in FLOP/s: 10 cuBLASLt GEMMs of 8192^3 (about
// 15 ms on an H200, 384 MiB of scratch freed to the caching allocator), measured on the
// first call per device and cached. The denominator of the mfu of a run on that GPU (llm.c
// and PyTorch report theirs against the same kind of figure). Needs a CUDA GPU.
double gpu_bf16_peak_flops(int device);

// Minor page faults of this process so far (getrusage): the first touch of fresh memory,
// slow on virtual machines; a step in steady state adds none.
long minor_page_faults();

}  // namespace paratrain::monitor
