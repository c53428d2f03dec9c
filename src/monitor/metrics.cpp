#include "paratrain/monitor/metrics.h"

#include <chrono>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::monitor {

MetricsWriter::MetricsWriter(const std::string& path) : path_(path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), "w");
  if (!f_) PT_THROW(IoError, "cannot create metrics file '", path, "'");
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::write(const nlohmann::json& line) {
  if (!f_) return;
  std::string s = line.dump();
  s.push_back('\n');
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    PT_THROW(IoError, "cannot write metrics file '", path_, "'");
}

std::string format_duration(double seconds) {
  if (seconds < 0 || seconds != seconds) return "?";
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s < 60)
    std::snprintf(buf, sizeof buf, "%lds", s);
  else if (s < 3600)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  return buf;
}

double measured_gemm_peak_flops() {
  static double peak = [] {
    namespace k = paratrain::kernels::cpu;
    const int64_t n = 768;
    std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
    k::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);  // warm-up
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 3; ++i) k::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 3 * 2.0 * n * n * n / s);
    }
    return best;
  }();
  return peak;
}

}  // namespace paratrain::monitor
