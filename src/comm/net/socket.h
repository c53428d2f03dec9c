// Thin helpers over BSD sockets used by the store and the tcp transport: listening,
// connecting with retries until a deadline, and full reads/writes that honour a deadline.
// All functions throw IoError / TimeoutError / CommError; none of them retries forever.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "comm/deadline.h"

namespace paratrain::comm::net {

// An owned file descriptor; closes on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { close(); }
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    if (this != &o) { close(); fd_ = o.fd_; o.fd_ = -1; }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void close();
  // shutdown(SHUT_RDWR): wakes a thread blocked in a read on this socket.
  void shutdown();

 private:
  int fd_ = -1;
};

// Listens on host:port (port 0 = any; host "" or "0.0.0.0" = all interfaces). Returns the socket.
Socket listen_tcp(const std::string& host, int port, int backlog = 1024);
// The local port a listening socket is bound to.
int local_port(const Socket& s);
// Accepts one connection, waiting until the deadline (TimeoutError) .
Socket accept_tcp(const Socket& listener, const Deadline& deadline);
// Connects to host:port, retrying refused connections until the deadline.
Socket connect_tcp(const std::string& host, int port, const Deadline& deadline);
// Sets TCP_NODELAY and large buffers.
void tune_socket(int fd, bool nodelay = true, int buffer_bytes = 0);

// Writes/reads exactly n bytes. A closed peer is CommError("connection closed by <what>").
// `what` names the other side in messages.
void write_full(int fd, const void* data, size_t n, const Deadline& deadline, const std::string& what);
void read_full(int fd, void* data, size_t n, const Deadline& deadline, const std::string& what);

// An address of this host that other hosts can reach (first non-loopback IPv4), or 127.0.0.1.
std::string host_address();
std::string host_name();

}  // namespace paratrain::comm::net
