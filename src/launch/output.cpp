#include "paratrain/launch/output.h"

#include <cstring>

#include "paratrain/launch/process.h"

namespace paratrain::launch {

LineSink::LineSink(std::string prefix, int out_fd, int log_fd, size_t tail_lines)
    : prefix_(std::move(prefix)), out_fd_(out_fd), log_fd_(log_fd), tail_lines_(tail_lines) {}

void LineSink::emit(const char* data, size_t n) {
  // Drop a trailing '\r' of CRLF lines.
  size_t len = n;
  if (len > 0 && data[len - 1] == '\r') --len;
  if (out_fd_ >= 0) {
    scratch_.assign(prefix_);
    scratch_.append(data, len);
    scratch_.push_back('\n');
    write_all(out_fd_, scratch_.data(), scratch_.size());
  }
  if (log_fd_ >= 0) {
    scratch_.assign(data, len);
    scratch_.push_back('\n');
    write_all(log_fd_, scratch_.data(), scratch_.size());
  }
  if (tail_lines_ > 0) {
    tail_.emplace_back(data, len);
    while (tail_.size() > tail_lines_) tail_.pop_front();
  }
  ++lines_;
}

void LineSink::feed(const char* data, size_t n) {
  while (n > 0) {
    const char* nl = static_cast<const char*>(std::memchr(data, '\n', n));
    if (nl == nullptr) {
      // No line end: keep the bytes, flushing whole pieces of an over-long line.
      pending_.append(data, n);
      while (pending_.size() >= kMaxLineBytes) {
        emit(pending_.data(), kMaxLineBytes);
        pending_.erase(0, kMaxLineBytes);
      }
      return;
    }
    size_t len = static_cast<size_t>(nl - data);
    if (pending_.empty()) {
      emit(data, len);
    } else {
      pending_.append(data, len);
      emit(pending_.data(), pending_.size());
      pending_.clear();
    }
    data = nl + 1;
    n -= len + 1;
  }
}

void LineSink::finish() {
  if (!pending_.empty()) {
    emit(pending_.data(), pending_.size());
    pending_.clear();
  }
}

}  // namespace paratrain::launch
