#include "launch/signal_scope.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "paratrain/base/error.h"

namespace paratrain::launch {
namespace {

// The pipe the handler writes to, and the launcher's pid (a forked rank before exec shares
// the handler but is not the launcher).
int g_signal_pipe_w = -1;
pid_t g_launcher_pid = -1;

extern "C" void on_launcher_signal(int sig) {
  if (::getpid() != g_launcher_pid) return;  // a forked rank before exec: not ours to report
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  if (g_signal_pipe_w >= 0) {
    ssize_t r = ::write(g_signal_pipe_w, &b, 1);
    (void)r;
  }
  errno = saved;
}

}  // namespace

SignalScope::SignalScope() {
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) PT_THROW(IoError, "launch: pipe(): ", std::strerror(errno));
  read_.reset(p[0]);
  write_.reset(p[1]);
  g_signal_pipe_w = write_.get();
  g_launcher_pid = ::getpid();
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  for (size_t i = 0; i < kCaught.size(); ++i) ::sigaction(kCaught[i], &sa, &old_[i]);
  struct sigaction ign;
  std::memset(&ign, 0, sizeof(ign));
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &old_pipe_);
}

SignalScope::~SignalScope() {
  for (size_t i = 0; i < kCaught.size(); ++i) ::sigaction(kCaught[i], &old_[i], nullptr);
  ::sigaction(SIGPIPE, &old_pipe_, nullptr);
  g_signal_pipe_w = -1;
}

std::vector<int> SignalScope::drain() {
  std::vector<int> out;
  unsigned char buf[64];
  while (true) {
    ssize_t r = ::read(read_.get(), buf, sizeof(buf));
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; ++i) {
      if (buf[i] == SIGUSR1) usr1_ = true;
      else if (buf[i] != SIGCHLD) out.push_back(buf[i]);
    }
  }
  if (!out.empty() && interrupt_ == 0) interrupt_ = out.front();
  return out;
}

}  // namespace paratrain::launch
