// Errors that kernels find on a GPU without making the host wait for them: the asynchronous
// error report of paratrain's CUDA kernels (the embedding's bad token ids). A kernel that
// finds bad input records the first case into its device's DeviceErrorRecord and goes on
// (its output for that input is NaN or skipped, never an out-of-bounds access); the host
// learns of it the next time it waits for that GPU's results through paratrain: a copy to the
// host (Tensor::item, to_vector, to(cpu)), a host-returning reduction (sum, all_finite), or
// cuda::synchronize(). There raise_device_errors() throws the InputError the CPU kernel would
// have thrown at once, naming the GPU, and clears the record. A training step reads its loss
// back once, so a bad batch fails the step in which it was used.
//
// The record is page-locked host memory mapped into the GPU's address space: kernels write it
// directly and the host reads it after waiting, with no copy. Only the first error is kept
// until it is raised (the writers check `code` first). The strings are the recording call's
// string literals, carried as host pointers. Builds with CUDA only (tensor/cuda.h).
// Thread-safety: any thread; records are per GPU and live as long as the process.
#pragma once

#include <cstdint>

namespace paratrain::cuda {

struct DeviceErrorRecord {
  unsigned long long code;  // 0: nothing recorded; written last by the recording kernel
  long long position, value, bound;
  const char* who;    // the op, e.g. "embedding_forward"
  const char* what;   // the value's name, e.g. "token id"
  const char* range;  // what [0, bound) is, e.g. "the vocabulary"
};

// GPU d's record (d = -1: the current device), as the pointer kernels write through.
DeviceErrorRecord* device_error_record(int d = -1);

// After the host waited for GPU d's work: throws InputError "<who>: <what> <value> at position
// <position> is outside <range> [0,<bound>) (found on cuda:<d> ...)" if a kernel recorded one,
// clearing the record first; otherwise nothing (d = -1: the current device).
void raise_device_errors(int d = -1);

}  // namespace paratrain::cuda
