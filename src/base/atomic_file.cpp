#include "paratrain/base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "paratrain/base/error.h"

namespace paratrain {

namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string directory_of(const std::string& path) {
  auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// fsync a file by name (works on a read-only descriptor on Linux).
int fsync_path(const std::string& p, int flags) {
  int fd = ::open(p.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return errno;
  int rc = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return rc;
}

}  // namespace

struct AtomicFileWriter::Impl {
  std::ofstream out;
};

AtomicFileWriter::AtomicFileWriter(const std::string& path)
    : path_(path), temp_path_(path + ".tmp." + std::to_string(::getpid())), impl_(std::make_unique<Impl>()) {
  if (path.empty()) PT_THROW(IoError, "cannot write a file with an empty path");
  impl_->out.open(temp_path_, std::ios::binary | std::ios::trunc);
  if (!impl_->out) {
    int err = errno;
    PT_THROW(IoError, "cannot write ", path_, ": ", errno_text(err));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (!committed_) {
    if (impl_->out.is_open()) impl_->out.close();
    std::remove(temp_path_.c_str());
  }
}

std::ostream& AtomicFileWriter::stream() {
  PT_CHECK(!committed_, "AtomicFileWriter::stream() after commit() of ", path_);
  return impl_->out;
}

void AtomicFileWriter::write(const void* data, size_t n) {
  PT_CHECK(!committed_, "AtomicFileWriter::write() after commit() of ", path_);
  impl_->out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!impl_->out) {
    int err = errno;
    PT_THROW(IoError, "writing ", path_, " failed: ", errno_text(err));
  }
}

void AtomicFileWriter::commit() {
  PT_CHECK(!committed_, "AtomicFileWriter::commit() twice for ", path_);
  auto fail = [&](const std::string& what, int err) {
    if (impl_->out.is_open()) impl_->out.close();
    std::remove(temp_path_.c_str());
    committed_ = true;  // nothing left to clean up
    PT_THROW(IoError, "writing ", path_, " failed: ", what, err ? ": " : "", err ? errno_text(err) : "");
  };
  impl_->out.flush();
  if (!impl_->out) fail("flush", errno);
  impl_->out.close();
  if (impl_->out.fail()) fail("close", errno);
  if (int err = fsync_path(temp_path_, O_RDONLY)) fail("fsync", err);
  if (::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("rename", errno);
  committed_ = true;
  // Make the rename durable; a failure here leaves a complete file, so it is not an error.
  fsync_path(directory_of(path_), O_RDONLY | O_DIRECTORY);
}

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& writer) {
  AtomicFileWriter w(path);
  writer(w.stream());
  if (!w.stream()) {
    int err = errno;
    PT_THROW(IoError, "writing ", path, " failed: ", errno_text(err));
  }
  w.commit();
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter w(path);
  w.write(bytes.data(), bytes.size());
  w.commit();
}

}  // namespace paratrain
