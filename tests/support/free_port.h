// A TCP port on the loopback interface that was free a moment ago, for tests that start their
// own ranks (rank 0's store listens on it). The kernel picks it (bind to port 0), and the
// socket is closed before returning, so another process may take it in between: callers
// that must be sure retry (tests/launch/launch_test_util.h has a stricter variant for the
// launcher's port pairs). Thread-safe; no state.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace paratrain::test {

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace paratrain::test
