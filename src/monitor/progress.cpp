#include "paratrain/monitor/progress.h"

#include <unistd.h>

#include <algorithm>

namespace paratrain::monitor {

bool stderr_is_terminal() { return isatty(2) == 1; }

ProgressLine::ProgressLine(std::ostream& out, int64_t total_steps, bool is_terminal)
    : out_(out), total_(total_steps), every_(std::max<int64_t>(1, total_steps / 20)), tty_(is_terminal),
      last_print_(std::chrono::steady_clock::now()) {}

void ProgressLine::update(int64_t step, const std::string& text) {
  if (tty_) {
    out_ << "\r" << text << "   " << std::flush;
    open_line_ = true;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  const bool due = step == 0 || step + 1 == total_ || (step + 1) % every_ == 0 ||
                   now - last_print_ > std::chrono::seconds(10);
  if (!due) return;
  out_ << text << "\n" << std::flush;
  last_print_ = now;
}

void ProgressLine::finish() {
  if (open_line_) out_ << "\n" << std::flush;
  open_line_ = false;
}

}  // namespace paratrain::monitor
