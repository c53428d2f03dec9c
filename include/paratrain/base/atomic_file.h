// Atomic file writes: a file either appears complete under its final name or not at all.
//
// Every file paratrain writes (token files, tokenizer models, safetensors, checkpoints,
// reports) goes through here, so that a failure -- a thrown exception, a full disk, a kill
// -- never leaves a partial file under the final name (DESIGN.md: "a failure writes no
// partial file"). The data is written to "<path>.tmp.<pid>" in the same directory, flushed
// and fsync'ed, then rename()d over <path> (atomic on POSIX file systems), and the
// directory is fsync'ed so the rename survives a crash. On any failure the temporary file
// is removed and IoError naming <path> is thrown (the writer's own exception propagates
// unchanged); an existing file at <path> is left as it was.
//
// Thread-safety: distinct AtomicFileWriters are independent; two writers for the same path
// in one process race (the last commit wins, each file whole).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>

namespace paratrain {

// Writes `path` atomically with the bytes `writer` puts into the stream. If `writer` throws,
// the temporary is removed and the exception propagates; I/O failures throw IoError.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& writer);

// Writes `bytes` to `path` atomically.
void write_file_atomic(const std::string& path, std::string_view bytes);

// Streaming form: construct, write through stream(), then commit(). Destroying the writer
// without commit() (e.g. while an exception unwinds) removes the temporary file and leaves
// `path` untouched. Not copyable.
class AtomicFileWriter {
 public:
  // Opens "<path>.tmp.<pid>" for writing; IoError naming `path` if that fails (missing
  // directory, no permission).
  explicit AtomicFileWriter(const std::string& path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // The stream to write into (binary mode). Valid until commit() or destruction.
  std::ostream& stream();
  // Raw write; IoError on failure.
  void write(const void* data, size_t n);
  // Flushes, fsyncs, renames over the final path and fsyncs the directory. IoError naming
  // the path on failure (the temporary is then removed). Call at most once.
  void commit();

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  struct Impl;
  std::string path_;
  std::string temp_path_;
  std::unique_ptr<Impl> impl_;
  bool committed_ = false;
};

}  // namespace paratrain
