#include "paratrain/launch/host.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "paratrain/base/env.h"
#include "paratrain/base/error.h"

namespace paratrain::launch {
namespace {

std::vector<int> affinity_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    unsigned n = std::max(1u, std::thread::hardware_concurrency());
    for (unsigned c = 0; c < n; ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

// cgroup v2 "max 100000" or "200000 100000" -> cores allowed (0 = unlimited).
int cgroup_cpu_limit() {
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota, period;
  if (!(f >> quota >> period) || quota == "max") return 0;
  try {
    double q = std::stod(quota), p = std::stod(period);
    if (q <= 0 || p <= 0) return 0;
    return std::max(1, static_cast<int>(std::ceil(q / p)));
  } catch (const std::exception&) {
    return 0;
  }
}

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}
std::vector<int> parse_cpu_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part == "\n") continue;
    try {
      auto dash = part.find('-');
      int lo = std::stoi(part.substr(0, dash));
      int hi = dash == std::string::npos ? lo : std::stoi(part.substr(dash + 1));
      for (int c = lo; c <= hi && c - lo < 65536; ++c) out.push_back(c);
    } catch (const std::exception&) {
    }
  }
  return out;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s;
}

bool is_executable_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

int usable_cpu_count() {
  int n = static_cast<int>(affinity_cpus().size());
  if (int limit = cgroup_cpu_limit(); limit > 0) n = std::min(n, limit);
  return std::max(1, n);
}

std::vector<std::vector<int>> core_groups() {
  std::vector<int> cpus = affinity_cpus();
  std::set<int> usable(cpus.begin(), cpus.end());
  auto group_by = [&](auto list_of) {
    std::map<std::vector<int>, std::vector<int>> groups;  // shared set -> usable members
    for (int c : cpus) {
      std::vector<int> shared = list_of(c);
      if (shared.empty()) return std::vector<std::vector<int>>{};
      groups[shared].push_back(c);
    }
    std::vector<std::vector<int>> out;
    for (auto& [k, v] : groups) out.push_back(v);
    return out;
  };
  // Last-level cache: the highest cache index of level 3 (or the highest level present).
  auto llc_of = [](int c) {
    std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/cache/";
    std::string best;
    int best_level = 0;
    for (int i = 0; i < 8; ++i) {
      std::string level = read_line(base + "index" + std::to_string(i) + "/level");
      if (level.empty()) continue;
      int lv = std::atoi(level.c_str());
      if (lv >= best_level) {
        best_level = lv;
        best = read_line(base + "index" + std::to_string(i) + "/shared_cpu_list");
      }
    }
    return best_level >= 3 ? parse_cpu_list(best) : std::vector<int>{};
  };
  auto numa_of = [](int c) {
    for (int n = 0; n < 1024; ++n) {
      std::string list = read_line("/sys/devices/system/node/node" + std::to_string(n) + "/cpulist");
      if (list.empty()) {
        if (n > 0 && ::access(("/sys/devices/system/node/node" + std::to_string(n)).c_str(), F_OK) != 0) break;
        continue;
      }
      std::vector<int> members = parse_cpu_list(list);
      if (std::find(members.begin(), members.end(), c) != members.end()) return members;
    }
    return std::vector<int>{};
  };
  auto groups = group_by(llc_of);
  if (groups.empty()) groups = group_by(numa_of);
  if (groups.empty()) groups = {cpus};
  // A cgroup quota smaller than the affinity set: fewer usable cores than listed.
  int limit = cgroup_cpu_limit();
  if (limit > 0 && limit < static_cast<int>(cpus.size()) && static_cast<int>(groups.size()) > limit)
    groups.resize(static_cast<size_t>(limit));
  return groups;
}

int gpu_count() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/driver/nvidia/gpus")) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  } else {
    for (int i = 0; i < 256; ++i) {
      if (::access(("/dev/nvidia" + std::to_string(i)).c_str(), F_OK) != 0) break;
      ++n;
    }
  }
  if (n == 0) return 0;
  if (auto visible = env::raw("CUDA_VISIBLE_DEVICES")) {
    // Count the listed devices up to the first invalid entry (CUDA's rule), at most n.
    int listed = 0;
    std::stringstream ss(*visible);
    std::string item;
    while (std::getline(ss, item, ',')) {
      if (item.empty() || item[0] == '-') break;
      ++listed;
    }
    n = std::min(n, listed);
  } else if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    return 0;  // set but empty: no GPU visible
  }
  return n;
}

NprocChoice auto_nproc_per_node() {
  NprocChoice c;
  if (int gpus = gpu_count(); gpus > 0) {
    c.nproc = gpus;
    c.reason = std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs");
    return c;
  }
  auto groups = core_groups();
  c.nproc = std::max<int>(1, static_cast<int>(groups.size()));
  c.reason = "no GPU; " + std::to_string(groups.size()) + " core group" + (groups.size() == 1 ? "" : "s") +
             " (cores sharing a last-level cache) of " + std::to_string(groups.front().size()) + " cores";
  return c;
}

int threads_per_rank(int cpus, int local_ranks) {
  if (local_ranks <= 0) return std::max(1, cpus);
  return std::max(1, cpus / local_ranks);
}

std::string make_token() {
  unsigned char bytes[32];
  int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) PT_THROW(IoError, "launch: cannot open /dev/urandom: ", std::strerror(errno));
  size_t got = 0;
  while (got < sizeof(bytes)) {
    ssize_t r = ::read(fd, bytes + got, sizeof(bytes) - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      ::close(fd);
      PT_THROW(IoError, "launch: cannot read /dev/urandom");
    }
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s.push_back(kHex[b >> 4]);
    s.push_back(kHex[b & 15]);
  }
  return s;
}

std::string resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos) {
    struct stat st;
    if (::stat(program.c_str(), &st) != 0) PT_THROW(InputError, "launch: program '", program, "' does not exist");
    if (S_ISDIR(st.st_mode)) PT_THROW(InputError, "launch: program '", program, "' is a directory");
    if (!is_executable_file(program)) PT_THROW(InputError, "launch: program '", program, "' is not executable");
    return program;
  }
  std::string path = env::raw("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
  std::stringstream ss(path);
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string candidate = (dir.empty() ? std::string(".") : dir) + "/" + program;
    if (is_executable_file(candidate)) return candidate;
  }
  PT_THROW(InputError, "launch: program '", program, "' not found in PATH");
}

std::string host_name() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

}  // namespace paratrain::launch
