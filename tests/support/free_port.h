// TCP ports for tests that start their own ranks or launchers (rank 0's store listens on
// one; a multi-node launcher also on the next). free_port(n) reserves n consecutive ports
// P .. P+n-1 and returns P. What it promises, for the rest of this process:
//  - no other process that reserves through here gets them: each port is held by an flock
//    on a file under $TMPDIR/paratrain-test-ports, released when this process (and any
//    child forked without exec) ends;
//  - no process's outgoing connection is given one: they lie outside the kernel's
//    ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), where connect() picks its
//    local ports, and below the launcher's own picks (20000 up to that range). (The
//    kernel's own pick, bind to port 0, lies inside it: a test that took such a port and
//    closed it lost it, now and then, to another test's connection.)
//  - each could be listened on, on every interface, when reserved (by the store's listen_tcp).
// Thread-safe. Returns 0 where no run of n ports is free (the caller's bind then fails loudly).
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "comm/net/socket.h"
#include "paratrain/base/error.h"

namespace paratrain::test {
namespace free_port_detail {

// Whether `port` can be listened on, on every interface, now: the store's own listen_tcp
// (SO_REUSEADDR, bind, listen), closed again.
inline bool bindable(int port) {
  try {
    comm::net::listen_tcp("", port, 1);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The ports tests may use: [first, last], outside the ephemeral range and below 20000, where
// `paratrain launch` picks the MASTER_PORT it is not given (src/launch/job_setup.cpp).
inline std::pair<int, int> usable_range() {
  int low = 32768, high = 60999;  // Linux's default ephemeral range
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  f >> low >> high;
  if (low - 1 >= 12000) return {10000, std::min(19999, low - 1)};
  return {high + 1, 65535};
}

// The folder of the ports' lock files, made (once a process) where it is missing.
inline const std::filesystem::path& lock_dir() {
  static const std::filesystem::path dir = [] {
    std::error_code ec;
    std::filesystem::path d = std::filesystem::temp_directory_path(ec) / "paratrain-test-ports";
    std::filesystem::create_directories(d, ec);
    std::filesystem::permissions(d, std::filesystem::perms::all, ec);
    return d;
  }();
  return dir;
}

// An flock held on port's file, or -1 where another process (or this one) holds it.
inline int lock_port(int port) {
  const int fd = ::open((lock_dir() / std::to_string(port)).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0666);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace free_port_detail

inline int free_port(int count = 1) {
  namespace d = free_port_detail;
  static std::mutex mu;
  static unsigned next = 0;
  std::lock_guard<std::mutex> lock(mu);
  const auto [first, last] = d::usable_range();
  const int span = last - first + 1 - (count - 1);
  if (span <= 0) return 0;
  // Start where this process's earlier picks stopped, from a place of its own.
  if (next == 0) next = static_cast<unsigned>(::getpid()) * 7919u;
  for (int tried = 0; tried < span; ++tried) {
    const int port = first + static_cast<int>(next++ % static_cast<unsigned>(span));
    std::vector<int> held;
    bool free = true;
    for (int i = 0; i < count && free; ++i) {
      const int fd = d::lock_port(port + i);
      if (fd >= 0) held.push_back(fd);
      free = fd >= 0 && d::bindable(port + i);
    }
    if (free) return port;  // the locks stay held
    for (int fd : held) ::close(fd);
  }
  return 0;
}

}  // namespace paratrain::test
