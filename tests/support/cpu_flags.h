// Whether /proc/cpuinfo's first "flags" line lists a CPU flag (its spelling: avx2, fma,
// avx512f, avx512_bf16, ...): the outside view of the CPU that tests compare the kernels'
// run-time choice (CPUID through __builtin_cpu_supports) against. False where the file or
// the line is missing. Thread-safe; no state.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

namespace paratrain::test {

inline bool cpuinfo_has_flag(const std::string& flag) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("flags", 0) == 0) {
      std::istringstream is(line.substr(line.find(':') + 1));
      std::string w;
      while (is >> w)
        if (w == flag) return true;
      return false;
    }
  return false;
}

}  // namespace paratrain::test
