#include "paratrain/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::checkpoint;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path dir;
  TempDir() {
    dir = fs::temp_directory_path() /
          ("pt_st_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
           std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  ~TempDir() { fs::remove_all(dir); }
  std::string path(const std::string& n) const { return (dir / n).string(); }
  int count() const { return static_cast<int>(std::distance(fs::directory_iterator(dir), fs::directory_iterator())); }
};

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file from a header string and a data section.
std::string file_bytes(const std::string& header, const std::string& data) {
  uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

std::string load_error(const std::string& path) {
  try {
    load_safetensors(path);
  } catch (const InputError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception for " << path;
  return "";
}

Tensor make(DType dt, const Shape& shape, int seed) {
  Tensor t = Tensor::empty(shape, dt);
  auto* p = static_cast<uint8_t*>(t.data_ptr());
  for (size_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 31 + seed * 7 + 1);
  return t;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), a.nbytes()) == 0;
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypes) {
  TempDir d;
  std::vector<std::pair<std::string, Tensor>> ts = {
      {"f32", make(DType::F32, {2, 3}, 1)},   {"bf16", make(DType::BF16, {5}, 2)},
      {"f16", make(DType::F16, {1, 1, 3}, 3)}, {"i32", make(DType::I32, {4}, 4)},
      {"i64", make(DType::I64, {2, 2}, 5)},   {"u8", make(DType::U8, {7}, 6)},
      {"u16", make(DType::U16, {3}, 7)},      {"scalar", make(DType::F32, {}, 8)},
      {"empty", Tensor::empty({0, 4}, DType::F32)}};
  save_safetensors(d.path("a.safetensors"), ts, {{"format", "pt"}, {"step", "12"}});
  EXPECT_EQ(d.count(), 1);
  auto f = read_safetensors(d.path("a.safetensors"));
  ASSERT_EQ(f.tensors.size(), ts.size());
  for (const auto& [name, t] : ts) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(f.tensors.at(name), t)) << name;
  }
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(f.metadata.at("step"), "12");

  // Header layout: 8-byte aligned data, metadata first, tensors in the given order.
  auto bytes = read_bytes(d.path("a.safetensors"));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
  auto h = read_safetensors_header(d.path("a.safetensors"));
  EXPECT_EQ(h.data_start, 8 + n);
  std::string header = bytes.substr(8, n);
  EXPECT_EQ(header.find("{\"__metadata__\""), 0u);
  EXPECT_LT(header.find("\"f32\""), header.find("\"bf16\""));
  EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
}

TEST(Safetensors, MapOverloadSortsByName) {
  TempDir d;
  std::map<std::string, Tensor> m = {{"b", make(DType::F32, {2}, 1)}, {"a", make(DType::F32, {3}, 2)}};
  save_safetensors(d.path("m.safetensors"), m);
  auto h = read_safetensors_header(d.path("m.safetensors"));
  ASSERT_EQ(h.entries.size(), 2u);
  EXPECT_EQ(h.entries[0].name, "a");
  EXPECT_EQ(h.entries[0].begin, 0u);
  EXPECT_EQ(h.entries[0].end, 12u);
  EXPECT_EQ(h.entries[1].name, "b");
  EXPECT_TRUE(h.metadata.empty());
}

TEST(Safetensors, NonContiguousWrittenContiguous) {
  TempDir d;
  Tensor t = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor tt = t.transpose(0, 1);  // (3,2): 1 4 2 5 3 6
  ASSERT_FALSE(tt.is_contiguous());
  save_safetensors(d.path("t.safetensors"), {{"t", tt}});
  auto m = load_safetensors(d.path("t.safetensors"));
  EXPECT_EQ(m.at("t").shape(), (Shape{3, 2}));
  EXPECT_EQ(m.at("t").to_vector(), (std::vector<float>{1, 4, 2, 5, 3, 6}));
  EXPECT_TRUE(m.at("t").is_contiguous());
}

TEST(Safetensors, SerializeMatchesFile) {
  TempDir d;
  std::vector<std::pair<std::string, Tensor>> ts = {{"x", make(DType::I64, {3}, 1)}};
  save_safetensors(d.path("s.safetensors"), ts, {{"k", "v"}});
  EXPECT_TRUE(serialize_safetensors(ts, {{"k", "v"}}) == read_bytes(d.path("s.safetensors")));
}

TEST(Safetensors, HandWrittenFileAsPythonWritesIt) {
  // Bytes as safetensors' Python library writes them for
  // save_file({"a": torch.tensor([[1., 2.], [3., 4.]]), "b": torch.tensor([7], dtype=torch.int64)},
  //           metadata={"format": "pt"}): compact JSON, offsets packed, header padded to 8.
  TempDir d;
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"I64","shape":[1],"data_offsets":[16,24]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string data;
  for (float v : {1.f, 2.f, 3.f, 4.f}) data.append(reinterpret_cast<const char*>(&v), 4);
  int64_t seven = 7;
  data.append(reinterpret_cast<const char*>(&seven), 8);
  write_bytes(d.path("py.safetensors"), file_bytes(header, data));
  auto f = read_safetensors(d.path("py.safetensors"));
  EXPECT_EQ(f.tensors.at("a").to_vector(), (std::vector<float>{1, 2, 3, 4}));
  EXPECT_EQ(f.tensors.at("b").dtype(), DType::I64);
  EXPECT_EQ(f.tensors.at("b").to_vector_i64(), (std::vector<int64_t>{7}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(Safetensors, FileWrittenByPythonNumpy) {
  // The same format written with Python's struct/json/numpy, independent of our writer.
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1"), 0)
      << "/usr/bin/python3 cannot import numpy: scripts/install_deps.sh installs python3-numpy";
  TempDir d;
  const std::string script = d.path("w.py");
  {
    std::ofstream py(script);
    py << R"PY(
import json, struct, sys
import numpy as np
ts = {"wte.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
      "h.0.ln_1.bias": np.array([0.5, -1.25], dtype=np.float16),
      "ids": np.array([[1, 2, 3]], dtype=np.int32)}
header, blobs, off = {"__metadata__": {"source": "numpy"}}, [], 0
for name in sorted(ts):
    b = ts[name].astype(ts[name].dtype.newbyteorder("<")).tobytes()
    header[name] = {"dtype": {"float32": "F32", "float16": "F16", "int32": "I32"}[str(ts[name].dtype)],
                    "shape": list(ts[name].shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
h = json.dumps(header).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h))); f.write(h); f.write(b"".join(blobs))
)PY";
  }
  ASSERT_EQ(std::system(("/usr/bin/python3 " + script + " " + d.path("np.safetensors")).c_str()), 0);
  auto f = read_safetensors(d.path("np.safetensors"));
  EXPECT_EQ(f.tensors.at("wte.weight").shape(), (Shape{3, 4}));
  EXPECT_EQ(f.tensors.at("wte.weight").to_vector()[11], 11.0f);
  EXPECT_EQ(f.tensors.at("h.0.ln_1.bias").to_vector(), (std::vector<float>{0.5f, -1.25f}));
  EXPECT_EQ(f.tensors.at("ids").to_vector_i64(), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(f.metadata.at("source"), "numpy");
}

TEST(Safetensors, OurFileReadByPython) {
  // The other direction: Python parses what we write with the rules of the format.
  ASSERT_EQ(std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1"), 0)
      << "/usr/bin/python3 cannot import numpy: scripts/install_deps.sh installs python3-numpy";
  TempDir d;
  save_safetensors(d.path("o.safetensors"),
                   {{"z", Tensor::from_vector({1.5f, -2.f}, {2})}, {"a", Tensor::from_vector_i64({9, 8, 7}, {3})}},
                   {{"format", "pt"}});
  const std::string script = d.path("r.py");
  {
    std::ofstream py(script);
    py << R"PY(
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
assert (8 + n) % 8 == 0
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
assert h["__metadata__"] == {"format": "pt"}
z = np.frombuffer(data[h["z"]["data_offsets"][0]:h["z"]["data_offsets"][1]], dtype="<f4")
a = np.frombuffer(data[h["a"]["data_offsets"][0]:h["a"]["data_offsets"][1]], dtype="<i8")
assert list(z) == [1.5, -2.0] and list(a) == [9, 8, 7], (z, a)
assert h["z"]["data_offsets"] == [0, 8] and h["a"]["data_offsets"] == [8, 32]
assert len(data) == 32
)PY";
  }
  EXPECT_EQ(std::system(("/usr/bin/python3 " + script + " " + d.path("o.safetensors")).c_str()), 0);
}

TEST(Safetensors, WriteErrorsWriteNothing) {
  TempDir d;
  auto p = d.path("w.safetensors");
  auto t = Tensor::from_vector({1}, {1});
  EXPECT_THAT([&] { try { save_safetensors(p, {{"a", t}, {"a", t}}); } catch (const InputError& e) { throw std::string(e.what()); } },
              ::testing::Throws<std::string>(HasSubstr("duplicate tensor name 'a'")));
  EXPECT_THROW(save_safetensors(p, {{"", t}}), InputError);
  EXPECT_THROW(save_safetensors(p, {{"__metadata__", t}}), InputError);
  EXPECT_THROW(save_safetensors(p, {{"u", Tensor()}}), InputError);
  EXPECT_THROW(save_safetensors(d.path("no/dir/x.safetensors"), {{"a", t}}), IoError);
  EXPECT_EQ(d.count(), 0);
}

// ---- malformed files: every rule has its message ----

struct BadCase {
  const char* label;
  std::string header;  // "" = use raw bytes below
  std::string data;
  const char* expect;
};

TEST(Safetensors, RejectsMalformedHeaders) {
  TempDir d;
  const std::string f4(16, '\0');
  std::vector<BadCase> cases = {
      {"not json", "{\"a\": ", f4, "header is not valid JSON"},
      {"not object", "[1,2]   ", f4, "header is not a JSON object"},
      {"array entry", R"({"a":[1]})", f4, "tensor 'a' is not a JSON object"},
      {"no dtype", R"({"a":{"shape":[4],"data_offsets":[0,16]}})", f4, "tensor 'a' has no \"dtype\" string"},
      {"no shape", R"({"a":{"dtype":"F32","data_offsets":[0,16]}})", f4, "tensor 'a' has no \"shape\" array"},
      {"no offsets", R"({"a":{"dtype":"F32","shape":[4]}})", f4, "tensor 'a' has no \"data_offsets\" pair"},
      {"unknown dtype", R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", f4,
       "tensor 'a' has unsupported dtype 'F64'"},
      {"negative dim", R"({"a":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", f4,
       "tensor 'a' has a shape entry that is not a non-negative integer: -4"},
      {"float dim", R"({"a":{"dtype":"F32","shape":[4.5],"data_offsets":[0,16]}})", f4, "not a non-negative integer: 4.5"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", f4,
       "tensor 'a': shape [3] x F32 is 12 bytes but data_offsets span 16"},
      {"out of range", R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", f4,
       "tensor 'a' has data_offsets [0, 32] beyond the data section of 16 bytes"},
      {"reversed", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[16,0]}})", f4, "end before they begin"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
       f4, "tensor 'b' overlaps tensor 'a'"},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
       f4, "gap in the data section before tensor 'b' (bytes 8..12"},
      {"trailing", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", f4,
       "data section is 16 bytes but the tensors cover 8 (trailing bytes)"},
      {"bad metadata", R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", f4,
       "__metadata__ value of 'k' is not a string"},
      {"bad offsets", R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,-16]}})", f4,
       "data offset that is not a non-negative integer"},
  };
  for (const auto& c : cases) {
    auto p = d.path("bad.safetensors");
    write_bytes(p, file_bytes(c.header, c.data));
    auto msg = load_error(p);
    EXPECT_THAT(msg, HasSubstr(c.expect)) << c.label;
    EXPECT_THAT(msg, HasSubstr(p)) << c.label;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << c.label;
  }
}

TEST(Safetensors, RejectsBadLengthsAndMissingFile) {
  TempDir d;
  auto p = d.path("x.safetensors");
  EXPECT_THAT(load_error(d.path("missing.safetensors")), HasSubstr("No such file"));
  write_bytes(p, "abc");
  EXPECT_THAT(load_error(p), HasSubstr("truncated: 3 bytes, shorter than the 8-byte header length"));
  std::string big(8, '\0');
  uint64_t n = 1000;
  std::memcpy(big.data(), &n, 8);
  write_bytes(p, big + "{}");
  EXPECT_THAT(load_error(p), HasSubstr("header length 1000 is longer than the file's remaining 2 bytes"));
  // Header bigger than the file, expressed through a truncated data section.
  std::string h = R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})";
  write_bytes(p, file_bytes(h, std::string(8, '\0')));
  EXPECT_THAT(load_error(p), HasSubstr("beyond the data section of 8 bytes"));
}

TEST(Safetensors, IgnoresUnknownEntryFields) {
  TempDir d;
  write_bytes(d.path("x.safetensors"),
              file_bytes(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2],"extra":true}})", "\x01\x02"));
  EXPECT_EQ(load_safetensors(d.path("x.safetensors")).at("a").to_vector_i64(), (std::vector<int64_t>{1, 2}));
}

TEST(Safetensors, HeaderOnlyReadIsCheapAndValidated) {
  TempDir d;
  save_safetensors(d.path("h.safetensors"), {{"w", make(DType::BF16, {4, 8}, 3)}});
  auto h = read_safetensors_header(d.path("h.safetensors"));
  ASSERT_EQ(h.entries.size(), 1u);
  EXPECT_EQ(h.entries[0].dtype, DType::BF16);
  EXPECT_EQ(h.entries[0].shape, (Shape{4, 8}));
  EXPECT_EQ(h.entries[0].end, 64u);
}
