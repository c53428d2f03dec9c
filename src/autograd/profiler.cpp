#include "paratrain/autograd/profiler.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "paratrain/base/env.h"
#include "paratrain/tensor/cuda.h"

namespace paratrain::autograd::profiler {

namespace {
struct Entry {
  double seconds = 0;
  long calls = 0;
};
std::mutex g_mu;
std::map<std::string, Entry> g_entries;
}  // namespace

bool enabled() {
  static const bool on = env::get_bool("PARATRAIN_PROFILE");
  return on;
}

void wait_for_device() {
  static const bool has_gpu = cuda::device_count() > 0;
  if (has_gpu) cuda::synchronize(cuda::compute_stream());
}

void record(const char* name, bool backward, double seconds) {
  std::lock_guard<std::mutex> lock(g_mu);
  Entry& e = g_entries[std::string(name) + (backward ? " (backward)" : "")];
  e.seconds += seconds;
  e.calls++;
}

std::string report() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_entries.empty()) return "";
  std::vector<std::pair<std::string, Entry>> rows(g_entries.begin(), g_entries.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0;
  for (auto& [n, e] : rows) total += e.seconds;
  std::string out = "op profile (PARATRAIN_PROFILE):\n";
  char line[160];
  for (auto& [n, e] : rows) {
    std::snprintf(line, sizeof line, "  %-36s %9.1f ms %5.1f%% %8ld calls\n", n.c_str(), e.seconds * 1e3,
                  100.0 * e.seconds / total, e.calls);
    out += line;
  }
  return out;
}

void reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_entries.clear();
}

}  // namespace paratrain::autograd::profiler
