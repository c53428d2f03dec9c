#include "comm/net/socket.h"

#include <arpa/inet.h>
#include <cerrno>
#include <cstring>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

#include "paratrain/base/error.h"

namespace paratrain::comm::net {

void Socket::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

static std::string errstr() { return std::strerror(errno); }

Socket listen_tcp(const std::string& host, int port, int backlog) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) PT_THROW(IoError, "socket(): ", errstr());
  int one = 1;
  ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0" || host == "*") {
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
  } else {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr)
      PT_THROW(InputError, "cannot resolve host '", host, "'");
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
  }
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
    PT_THROW(IoError, "cannot bind ", host.empty() ? "*" : host, ":", port, ": ", errstr());
  if (::listen(s.fd(), backlog) != 0) PT_THROW(IoError, "listen(): ", errstr());
  return s;
}

int local_port(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  ::getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

Socket accept_tcp(const Socket& listener, const Deadline& deadline) {
  for (;;) {
    pollfd p{listener.fd(), POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(deadline.remaining_ms(1000)));
    if (r < 0 && errno != EINTR) PT_THROW(IoError, "poll(): ", errstr());
    if (r > 0) {
      int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) return Socket(fd);
      if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED) PT_THROW(IoError, "accept(): ", errstr());
    }
    if (deadline.expired()) PT_THROW(TimeoutError, "timed out waiting for an incoming connection");
  }
}

Socket connect_tcp(const std::string& host, int port, const Deadline& deadline) {
  std::string last_error;
  int delay_ms = 10;
  for (;;) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai != 0 || res == nullptr) {
      last_error = std::string("cannot resolve: ") + ::gai_strerror(gai);
    } else {
      Socket s(::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol));
      int rc = ::connect(s.fd(), res->ai_addr, res->ai_addrlen);
      int err = errno;
      ::freeaddrinfo(res);
      if (rc == 0) {
        tune_socket(s.fd());
        return s;
      }
      last_error = std::strerror(err);
    }
    if (deadline.expired())
      PT_THROW(TimeoutError, "cannot connect to ", host, ":", port, " (", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(delay_ms, deadline.remaining_ms() + 1)));
    delay_ms = std::min(delay_ms * 2, 200);
  }
}

void tune_socket(int fd, bool nodelay, int buffer_bytes) {
  int one = nodelay ? 1 : 0;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

void write_full(int fd, const void* data, size_t n, const Deadline& deadline, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) { p += w; n -= static_cast<size_t>(w); continue; }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      int r = ::poll(&pf, 1, static_cast<int>(deadline.remaining_ms(1000)));
      if (r == 0 && deadline.expired()) PT_THROW(TimeoutError, "timed out writing to ", what);
      continue;
    }
    PT_THROW(CommError, "connection to ", what, " lost while writing (", errstr(), ")");
  }
}

void read_full(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = ::recv(fd, p, n, MSG_DONTWAIT);
    if (r > 0) { p += r; n -= static_cast<size_t>(r); continue; }
    if (r == 0) PT_THROW(CommError, "connection closed by ", what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd pf{fd, POLLIN, 0};
      int pr = ::poll(&pf, 1, static_cast<int>(deadline.remaining_ms(1000)));
      if (pr == 0 && deadline.expired()) PT_THROW(TimeoutError, "timed out reading from ", what);
      continue;
    }
    PT_THROW(CommError, "connection to ", what, " lost while reading (", errstr(), ")");
  }
}

std::string host_address() {
  ifaddrs* ifs = nullptr;
  std::string best = "127.0.0.1";
  if (::getifaddrs(&ifs) != 0) return best;
  for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    auto* a = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
    if (ntohl(a->sin_addr.s_addr) >> 24 == 127) continue;
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    best = buf;
    break;
  }
  ::freeifaddrs(ifs);
  return best;
}

std::string host_name() {
  char buf[256] = {0};
  ::gethostname(buf, sizeof(buf) - 1);
  return buf;
}

}  // namespace paratrain::comm::net
