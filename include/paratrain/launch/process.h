// Starting and signalling child processes for the launcher.
//
// spawn_child() forks and execs one rank with its stdout and stderr on pipes (the read ends
// are returned, non-blocking, close-on-exec) and stdin on /dev/null. In the child, before
// exec: it becomes the leader of its own process group (the launcher signals the whole
// group, so a rank's own subprocesses are stopped with it), asks the kernel for SIGKILL when
// the launcher dies (PR_SET_PDEATHSIG; if the launcher already died between fork and that
// call, the child exits at once), restores default signal dispositions and an empty signal
// mask (signals stay blocked from fork until then, so no launcher handler runs in the
// child), and closes every other descriptor. If exec fails the child writes one line to its
// stderr pipe and _exit(127)s.
//
// PR_SET_PDEATHSIG follows the *thread* that forked: call spawn_child() from a thread that
// outlives the children (the launcher's own, which supervises them).
//
// Thread-safety: spawn_child() may be called from any thread; everything it allocates is
// prepared before fork, the child runs only async-signal-safe calls.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace paratrain::launch {

// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) { reset(); fd_ = o.fd_; o.fd_ = -1; }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SpawnSpec {
  std::string path;               // resolved executable (resolve_program)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // KEY=VALUE
};

struct Spawned {
  pid_t pid = -1;  // also the process group id
  Fd out;          // read end of the child's stdout
  Fd err;          // read end of the child's stderr
};

// Starts one child as described above. IoError if fork or pipe fails.
Spawned spawn_child(const SpawnSpec& spec);

// Sends `sig` to the child's process group (and to the pid itself, in case it left the
// group). Returns false if nothing was there to signal.
bool signal_child(pid_t pid, int sig);

// Writes all of [data, data+n) to fd, retrying on EINTR and short writes; false on error.
bool write_all(int fd, const char* data, size_t n);

// "SIGKILL", "SIGTERM", ... or "signal N".
std::string signal_name(int sig);

}  // namespace paratrain::launch
