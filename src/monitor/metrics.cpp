#include "paratrain/monitor/metrics.h"

#include <sys/resource.h>

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

double hardware_peak_flops() {
  static const double peak = kernels::cpu::fma_peak(kernels::cpu::num_threads()).flops;
  return peak;
}

long minor_page_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace paratrain::monitor
