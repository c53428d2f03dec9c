// The human-readable progress line of a training run.
//
// On a terminal it rewrites one line in place ("\r"). When stderr is a pipe or a file (under
// `paratrain launch`, in CI, in a log) it prints whole lines instead, at the first and last
// step and otherwise at most every `every` steps or 10 seconds, so logs stay readable and the
// launcher's per-line rank prefixes work.
//
// Lifetimes: a ProgressLine writes to the stream it is given, which must outlive it.
// Thread-safety: a ProgressLine is not thread-safe (one training loop drives it); the stream
// is not locked, so nothing else should write to it in the middle of an update.
#pragma once

#include <chrono>
#include <ostream>
#include <string>

namespace paratrain::monitor {

class ProgressLine {
 public:
  ProgressLine(std::ostream& out, int64_t total_steps, bool is_terminal);
  // Shows `text` for step (0-based).
  void update(int64_t step, const std::string& text);
  // Ends the in-place line, if any.
  void finish();

 private:
  std::ostream& out_;
  int64_t total_;
  int64_t every_;
  bool tty_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point last_print_;
};

// True when file descriptor 2 (stderr) is a terminal.
bool stderr_is_terminal();

}  // namespace paratrain::monitor
