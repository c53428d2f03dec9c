// Turning a rank's output streams into whole, prefixed lines (docs/launch.md, "Output").
//
// A LineSink receives the raw bytes one child writes to one stream (stdout or stderr), cuts
// them into lines and writes each complete line as "[<rank>] <line>\n" with a single
// write() to the launcher's stream, so lines of different ranks never interleave mid-line
// (the launcher's one supervising thread owns all sinks). A line longer than kMaxLineBytes
// is emitted in pieces of that size. With a log file, each line also goes there,
// unprefixed. A stderr sink keeps the last `tail_lines` lines for the failure summary.
//
// Thread-safety: none; a LineSink belongs to the thread that feeds it. The descriptors are
// borrowed: they must stay open while the sink is used.
#pragma once

#include <cstddef>
#include <deque>
#include <string>

namespace paratrain::launch {

constexpr size_t kMaxLineBytes = 64 * 1024;

class LineSink {
 public:
  // out_fd: where prefixed lines go (-1: nowhere); log_fd: unprefixed copy (-1: none).
  LineSink(std::string prefix, int out_fd, int log_fd, size_t tail_lines);
  // Consumes bytes; writes every line completed by them.
  void feed(const char* data, size_t n);
  // End of stream: a pending partial line is written with a newline added.
  void finish();
  // The last lines seen (at most tail_lines), oldest first.
  const std::deque<std::string>& tail() const { return tail_; }
  // Total complete lines written so far.
  size_t lines() const { return lines_; }

 private:
  void emit(const char* data, size_t n);
  std::string prefix_;
  int out_fd_;
  int log_fd_;
  size_t tail_lines_;
  std::string pending_;
  std::string scratch_;
  std::deque<std::string> tail_;
  size_t lines_ = 0;
};

}  // namespace paratrain::launch
