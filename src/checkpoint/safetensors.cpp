#include "paratrain/checkpoint/safetensors.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/error.h"

namespace paratrain::checkpoint {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

// The header may not exceed this (as in the reference implementation), so a corrupt length
// cannot make us allocate gigabytes.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr const char* kMetadataKey = "__metadata__";

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw InputError("safetensors file " + path + ": " + what);
}

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }

TensorEntry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v,
                        uint64_t data_size) {
  const std::string t = "tensor '" + name + "'";
  if (name.empty()) bad(path, "a tensor has an empty name");
  if (!v.is_object()) bad(path, t + " is not a JSON object");
  // Other fields are ignored, as the reference implementation does.
  if (!v.contains("dtype") || !v["dtype"].is_string()) bad(path, t + " has no \"dtype\" string");
  if (!v.contains("shape") || !v["shape"].is_array()) bad(path, t + " has no \"shape\" array");
  if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
    bad(path, t + " has no \"data_offsets\" pair");
  TensorEntry e;
  e.name = name;
  const std::string dt = v["dtype"].get<std::string>();
  try {
    e.dtype = parse_safetensors_dtype(dt);
  } catch (const InputError&) {
    bad(path, t + " has unsupported dtype '" + dt + "' (paratrain reads F32 BF16 F16 I32 I64 U8 U16)");
  }
  uint64_t numel = 1;
  for (const auto& d : v["shape"]) {
    if (!d.is_number_unsigned()) bad(path, t + " has a shape entry that is not a non-negative integer: " + d.dump());
    const uint64_t x = d.get<uint64_t>();
    if (x > static_cast<uint64_t>(INT64_MAX) || mul_overflows(numel, x, &numel)) bad(path, t + " has a shape too large");
    e.shape.push_back(static_cast<int64_t>(x));
  }
  for (const auto& o : v["data_offsets"])
    if (!o.is_number_unsigned()) bad(path, t + " has a data offset that is not a non-negative integer: " + o.dump());
  e.begin = v["data_offsets"][0].get<uint64_t>();
  e.end = v["data_offsets"][1].get<uint64_t>();
  uint64_t nbytes = 0;
  if (mul_overflows(numel, dtype_size(e.dtype), &nbytes)) bad(path, t + " has a shape too large");
  if (e.end < e.begin)
    bad(path, t + " has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "] that end before they begin");
  if (e.end > data_size)
    bad(path, t + " has data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
                  "] beyond the data section of " + std::to_string(data_size) + " bytes");
  if (e.end - e.begin != nbytes)
    bad(path, t + ": shape " + shape_str(e.shape) + " x " + dt + " is " + std::to_string(nbytes) +
                  " bytes but data_offsets span " + std::to_string(e.end - e.begin));
  return e;
}

SafetensorsHeader parse_header(const std::string& path, const std::string& json_text, uint64_t data_start,
                               uint64_t file_size) {
  const uint64_t data_size = file_size - data_start;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& ex) {
    std::string m = ex.what();
    if (auto p = m.find("] "); p != std::string::npos) m = m.substr(p + 2);  // drop "[json.exception...] "
    bad(path, "header is not valid JSON: " + m);
  }
  if (!j.is_object()) bad(path, "header is not a JSON object");
  SafetensorsHeader h;
  h.data_start = data_start;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == kMetadataKey) {
      if (!it.value().is_object()) bad(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) bad(path, "__metadata__ value of '" + m.key() + "' is not a string");
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    h.entries.push_back(parse_entry(path, it.key(), it.value(), data_size));
  }
  std::sort(h.entries.begin(), h.entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& e : h.entries) {
    if (e.begin < pos)
      bad(path, "tensor '" + e.name + "' overlaps tensor '" + prev->name + "' (data_offsets begin " +
                    std::to_string(e.begin) + " < " + std::to_string(pos) + ")");
    if (e.begin > pos)
      bad(path, "gap in the data section before tensor '" + e.name + "' (bytes " + std::to_string(pos) + ".." +
                    std::to_string(e.begin) + " belong to no tensor)");
    pos = e.end;
    prev = &e;
  }
  if (pos != data_size)
    bad(path, "data section is " + std::to_string(data_size) + " bytes but the tensors cover " + std::to_string(pos) +
                  (pos < data_size ? " (trailing bytes)" : ""));
  return h;
}

SafetensorsHeader read_header(const std::string& path, std::ifstream& in) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError("cannot open safetensors file " + path + ": " +
                     (std::filesystem::exists(path, ec) ? "not a regular file" : "No such file or directory"));
  in.open(path, std::ios::binary);
  if (!in) throw InputError("cannot open safetensors file " + path);
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  if (ec) throw InputError("cannot open safetensors file " + path + ": " + ec.message());
  if (file_size < 8) bad(path, "truncated: " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  in.read(reinterpret_cast<char*>(&n), 8);
  if (!in) bad(path, "cannot read the header length");
  if (n > file_size - 8)
    bad(path, "header length " + std::to_string(n) + " is longer than the file's remaining " +
                  std::to_string(file_size - 8) + " bytes");
  if (n > kMaxHeaderBytes) bad(path, "header length " + std::to_string(n) + " exceeds the 100 MiB limit");
  if (n < 2) bad(path, "header length " + std::to_string(n) + " is too short for a JSON object");
  std::string text(n, '\0');
  in.read(text.data(), static_cast<std::streamsize>(n));
  if (!in) bad(path, "cannot read the " + std::to_string(n) + "-byte header");
  return parse_header(path, text, 8 + n, file_size);
}

struct Prepared {
  std::string header;  // padded JSON, without the length prefix
  std::vector<Tensor> data;
};

Prepared prepare(const NamedTensors& tensors, const Metadata& metadata,
                 const std::string& what) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    j[kMetadataKey] = m;
  }
  Prepared p;
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) throw InputError("cannot write " + what + ": a tensor has an empty name");
    if (name == kMetadataKey) throw InputError("cannot write " + what + ": '__metadata__' is not a tensor name");
    if (!seen.insert(name).second) throw InputError("cannot write " + what + ": duplicate tensor name '" + name + "'");
    if (!t.defined()) throw InputError("cannot write " + what + ": tensor '" + name + "' is undefined");
    Tensor c = t.to(DeviceSpec{Device::CPU, -1}).contiguous();  // a GPU tensor: copied to the host first
    const uint64_t nb = c.nbytes();
    nlohmann::ordered_json e;
    e["dtype"] = dtype_safetensors_name(c.dtype());
    e["shape"] = c.shape();
    e["data_offsets"] = {offset, offset + nb};
    j[name] = std::move(e);
    offset += nb;
    p.data.push_back(std::move(c));
  }
  p.header = j.dump();
  p.header.append((8 - (8 + p.header.size()) % 8) % 8, ' ');
  return p;
}

template <typename Sink>
void emit(const Prepared& p, Sink&& sink) {
  const uint64_t n = p.header.size();
  sink(&n, 8);
  sink(p.header.data(), p.header.size());
  for (const auto& t : p.data)
    if (t.nbytes() > 0) sink(t.data_ptr(), t.nbytes());
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in;
  return read_header(path, in);
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in;
  SafetensorsHeader h = read_header(path, in);
  SafetensorsFile f;
  f.metadata = std::move(h.metadata);
  for (const auto& e : h.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin) {
      in.seekg(static_cast<std::streamoff>(h.data_start + e.begin));
      in.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.end - e.begin));
      if (!in) bad(path, "cannot read the data of tensor '" + e.name + "'");
    }
    f.tensors.emplace(e.name, std::move(t));
  }
  return f;
}

std::map<std::string, Tensor> load_safetensors(const std::string& path) { return read_safetensors(path).tensors; }

std::string serialize_safetensors(const NamedTensors& tensors,
                                  const Metadata& metadata) {
  Prepared p = prepare(tensors, metadata, "safetensors data");
  std::string out;
  emit(p, [&](const void* d, size_t n) { out.append(static_cast<const char*>(d), n); });
  return out;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const Metadata& metadata) {
  Prepared p = prepare(tensors, metadata, path);
  AtomicFileWriter w(path);
  emit(p, [&](const void* d, size_t n) { w.write(d, n); });
  w.commit();
}

}  // namespace paratrain::checkpoint
