// SignalScope: the launcher's signals as a self-pipe that its poll loop reads.
//
// While a SignalScope lives, SIGINT, SIGTERM, SIGHUP, SIGCHLD and SIGUSR1 are caught (a handler
// writes the signal's number to the pipe; a forked rank before exec writes nothing) and
// SIGPIPE is ignored; the destructor restores the previous dispositions. fd() is the pipe's
// read end to poll; drain() reads it, remembers the first interrupting signal (interrupt())
// and returns the interrupting ones that came since the last call (SIGCHLD only wakes the
// loop; SIGUSR1 is take_usr1()'s).
//
// Thread-safety: one SignalScope at a time per process, used from the launcher's thread.
#pragma once

#include <signal.h>

#include <array>
#include <vector>

#include "paratrain/launch/process.h"

namespace paratrain::launch {

class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;
  int fd() const { return read_.get(); }
  // Reads the pipe; remembers the first interrupting signal. Returns interrupting signals seen now.
  std::vector<int> drain();
  int interrupt() const { return interrupt_; }
  // Whether SIGUSR1 (a request for the flight-recorder report) came since the last call.
  bool take_usr1() {
    bool u = usr1_;
    usr1_ = false;
    return u;
  }

 private:
  static constexpr std::array<int, 5> kCaught = {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGUSR1};
  Fd read_, write_;
  std::array<struct sigaction, 5> old_{};
  struct sigaction old_pipe_{};
  int interrupt_ = 0;
  bool usr1_ = false;
};

}  // namespace paratrain::launch
