// safetensors files: the model format shared with PyTorch / Hugging Face (docs/checkpoints.md).
//
// Layout: 8-byte little-endian u64 N, N bytes of UTF-8 JSON, then the data section. The JSON
// maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
// to the data section, row-major little-endian data) and may hold "__metadata__", an object
// of string to string.
//
// Reading validates everything before returning (InputError naming the file, and the tensor
// where there is one): file size >= 8, N <= file size - 8, JSON well-formed and an object,
// each entry's dtype known to paratrain (F32 BF16 F16 I32 I64 U8 U16), shape non-negative
// integers, end - begin == numel x dtype size, begin <= end <= data size, and the tensors,
// ordered by offset, tiling the data section exactly (no overlap, no gap, nothing after).
// Loaded tensors are fresh contiguous CPU tensors (copies; the file is closed on return).
//
// Writing: tensors in the order given (the map overload: sorted by name, as Python's
// safetensors orders equal-dtype tensors), header JSON with "__metadata__" first (when not
// empty) then the tensors in data order, padded with spaces so the data section starts at
// a multiple of 8 bytes. Non-contiguous tensors are written contiguous, GPU tensors from a
// host copy (the write waits for the device). Written atomically
// (base/atomic_file.h). Duplicate or empty names are an InputError.
//
// Thread-safety: the functions keep no state; concurrent reads of one file are fine, and so
// are concurrent writes of different paths. Two threads of one process must not write the
// same path at once (they would share its temporary name, path.tmp.<pid>); two processes
// may, and the last complete file renamed into place wins. Returned tensors and headers
// belong to the caller and refer to nothing of the file.
#pragma once

#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/tensor/tensor.h"

namespace paratrain::checkpoint {

using Metadata = std::map<std::string, std::string>;

// One header entry (no data).
struct TensorEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0, end = 0;  // data_offsets
};

struct SafetensorsHeader {
  std::vector<TensorEntry> entries;  // in data order
  Metadata metadata;
  uint64_t data_start = 0;           // 8 + N: file offset of the data section
};

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  Metadata metadata;
};

// Reads and validates only the header (cheap on large files).
SafetensorsHeader read_safetensors_header(const std::string& path);
// Reads tensors and metadata.
SafetensorsFile read_safetensors(const std::string& path);
// Reads tensors only.
std::map<std::string, Tensor> load_safetensors(const std::string& path);

// Named tensors in file order.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// Writes `tensors` in the given order.
void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata = {});
// Writes a std::map of tensors, i.e. sorted by name. (A template so that a braced list
// `save_safetensors(p, {{"a", t}})` unambiguously means the ordered form above.)
template <typename Map>
  requires std::same_as<Map, std::map<std::string, Tensor>>
void save_safetensors(const std::string& path, const Map& tensors, const Metadata& metadata = {}) {
  save_safetensors(path, NamedTensors(tensors.begin(), tensors.end()), metadata);
}

// The bytes of a safetensors file (what save_safetensors writes), for tests and streaming.
std::string serialize_safetensors(const NamedTensors& tensors, const Metadata& metadata = {});

}  // namespace paratrain::checkpoint
