#include "paratrain/launch/process.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "paratrain/base/error.h"

namespace paratrain::launch {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

bool write_all(int fd, const char* data, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {  // a non-blocking destination that is full: wait for room
        fd_set set;
        FD_ZERO(&set);
        FD_SET(fd, &set);
        timeval tv{1, 0};
        if (::select(fd + 1, nullptr, &set, nullptr, &tv) <= 0) return false;
        continue;
      }
      return false;
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    default: return "signal " + std::to_string(sig);
  }
}

bool signal_child(pid_t pid, int sig) {
  if (pid <= 0) return false;
  bool group = ::kill(-pid, sig) == 0;
  bool self = ::kill(pid, sig) == 0;
  return group || self;
}

namespace {

// Async-signal-safe pieces for the child between fork and exec.
void child_write(int fd, const char* s) {
  size_t n = 0;
  while (s[n] != '\0') ++n;
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    s += w;
    n -= static_cast<size_t>(w);
  }
}

[[noreturn]] void child_main(const char* path, char* const* argv, char* const* envp, int out_w, int err_w,
                             int null_fd, pid_t parent) {
  // Own process group: the launcher signals the whole group; a terminal's Ctrl-C reaches
  // only the launcher, which forwards it.
  ::setpgid(0, 0);
  // Die with the launcher, closing the race with a parent that died before this call.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);
  // Default dispositions and an empty mask (ignored signals survive exec otherwise).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  for (int s = 1; s < NSIG; ++s)
    if (s != SIGKILL && s != SIGSTOP) ::sigaction(s, &dfl, nullptr);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (::dup2(null_fd, 0) < 0 || ::dup2(out_w, 1) < 0 || ::dup2(err_w, 2) < 0) ::_exit(127);
  // Nothing else of the launcher's (store sockets, other ranks' pipes) leaks into the rank.
  if (::syscall(SYS_close_range, 3u, ~0u, 0u) != 0) {
    for (int fd = 3; fd < 65536; ++fd) ::close(fd);
  }
  ::execve(path, argv, envp);
  int e = errno;
  child_write(2, "paratrain launch: cannot execute ");
  child_write(2, path);
  child_write(2, ": ");
  child_write(2, ::strerror(e));  // not formally async-signal-safe; the child exits right after
  child_write(2, "\n");
  ::_exit(127);
}

}  // namespace

Spawned spawn_child(const SpawnSpec& spec) {
  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : spec.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int out_p[2], err_p[2];
  if (::pipe2(out_p, O_CLOEXEC) != 0) PT_THROW(IoError, "launch: pipe(): ", std::strerror(errno));
  Fd out_r(out_p[0]), out_w(out_p[1]);
  if (::pipe2(err_p, O_CLOEXEC) != 0) PT_THROW(IoError, "launch: pipe(): ", std::strerror(errno));
  Fd err_r(err_p[0]), err_w(err_p[1]);
  Fd null_fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null_fd.valid()) PT_THROW(IoError, "launch: cannot open /dev/null: ", std::strerror(errno));

  pid_t parent = ::getpid();
  // Every signal is blocked across fork, so that no handler of the launcher's runs in the
  // child before child_main has reset the dispositions (a SIGTERM sent to a just-forked
  // rank would otherwise run the launcher's handler in the rank); the child unblocks them.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  pid_t pid = ::fork();
  if (pid == 0)
    child_main(spec.path.c_str(), argv.data(), envp.data(), out_w.get(), err_w.get(), null_fd.get(), parent);
  int fork_errno = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid < 0) PT_THROW(IoError, "launch: fork(): ", std::strerror(fork_errno));
  // Both sides set the group, so the launcher can signal -pid as soon as fork returns.
  ::setpgid(pid, pid);
  out_w.reset();
  err_w.reset();
  ::fcntl(out_r.get(), F_SETFL, ::fcntl(out_r.get(), F_GETFL) | O_NONBLOCK);
  ::fcntl(err_r.get(), F_SETFL, ::fcntl(err_r.get(), F_GETFL) | O_NONBLOCK);
  Spawned s;
  s.pid = pid;
  s.out = std::move(out_r);
  s.err = std::move(err_r);
  return s;
}

}  // namespace paratrain::launch
