#include "paratrain/checkpoint/tensor_cut.h"

#include <algorithm>
#include <cstring>

#include "paratrain/base/error.h"

namespace paratrain::checkpoint {

namespace {

// Reads the decimal number starting at s[pos] (at least one digit, at most 18), advancing
// pos; -1 when there is none.
int64_t read_number(const std::string& s, size_t& pos) {
  const size_t start = pos;
  int64_t v = 0;
  while (pos < s.size() && s[pos] >= '0' && s[pos] <= '9' && pos - start < 18) v = v * 10 + (s[pos++] - '0');
  return pos == start ? -1 : v;
}

// The tensor as a contiguous CPU tensor (InputError naming `what` otherwise).
Tensor cpu_contiguous(const Tensor& t, const char* fn, const std::string& what) {
  if (!t.defined()) PT_THROW(InputError, fn, ": ", what, " is an undefined tensor");
  if (t.device() != Device::CPU)
    PT_THROW(InputError, fn, ": ", what, " ", shape_str(t.shape()), " is on ", device_name(t.device()),
             ", cuts copy CPU tensors only");
  return t.contiguous();
}

// The tensor seen as [outer, rows, inner] around `dim`: outer = product of the sizes before
// dim, inner_bytes = product of the sizes after it times the element size.
struct Around {
  int64_t outer = 1;
  size_t inner_bytes = 0;
};
Around around(const Shape& shape, int dim, DType dtype) {
  Around a;
  int64_t inner = 1;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (d < dim) a.outer *= shape[d];
    if (d > dim) inner *= shape[d];
  }
  a.inner_bytes = static_cast<size_t>(inner) * dtype_size(dtype);
  return a;
}

void copy_rows(char* dst, const char* src, int64_t rows, size_t inner_bytes) {
  const size_t n = static_cast<size_t>(rows) * inner_bytes;
  if (n > 0) std::memcpy(dst, src, n);
}

}  // namespace

std::string TensorCut::str() const {
  if (replicated()) return "-";
  std::string s = std::to_string(dim);
  if (blocks != 1) {
    s += 'x';
    s += std::to_string(blocks);
  }
  if (full > 0) {
    s += '/';
    s += std::to_string(full);
  }
  return s;
}

TensorCut TensorCut::parse(const std::string& text) {
  if (text == "-") return TensorCut{};
  auto bad = [&]() {
    PT_THROW(InputError, "malformed tensor cut '", text,
             "' (expected '-', or <dim>[x<blocks>][/<full>] such as '1', '1x3', '0/50257')");
  };
  TensorCut c;
  size_t pos = 0;
  const int64_t dim = read_number(text, pos);
  if (dim < 0 || dim > 1024) bad();
  c.dim = static_cast<int>(dim);
  if (pos < text.size() && text[pos] == 'x') {
    ++pos;
    const int64_t b = read_number(text, pos);
    if (b < 1 || b > (int64_t(1) << 30)) bad();
    c.blocks = static_cast<int>(b);
  }
  if (pos < text.size() && text[pos] == '/') {
    ++pos;
    c.full = read_number(text, pos);
    if (c.full < 1) bad();
  }
  if (pos != text.size()) bad();
  return c;
}

Tensor cut_tensor(const Tensor& whole_in, const TensorCut& cut, int index, int count) {
  static const char* fn = "cut_tensor";
  if (count < 1 || index < 0 || index >= count)
    PT_THROW(InputError, fn, ": part ", index, " of ", count, " does not exist (parts are 0..count-1, count >= 1)");
  const Tensor whole = cpu_contiguous(whole_in, fn, "the whole tensor");
  if (cut.replicated()) return whole.clone();
  const std::string what =
      detail::concat("cut ", cut.str(), " of a tensor ", shape_str(whole.shape()), " into ", count, " parts");
  if (cut.dim >= whole.dim()) PT_THROW(InputError, fn, ": ", what, ": the tensor has no dimension ", cut.dim);
  if (cut.blocks < 1) PT_THROW(InputError, fn, ": ", what, ": blocks must be >= 1");
  if (cut.full < 0) PT_THROW(InputError, fn, ": ", what, ": full must be >= 0");
  if (cut.blocks > 1 && cut.full > 0)
    PT_THROW(InputError, fn, ": ", what, ": padding (full > 0) cannot be combined with blocks > 1");
  const int64_t rows = whole.size(cut.dim);
  if (cut.full > 0 && rows != cut.full)
    PT_THROW(InputError, fn, ": ", what, ": the tensor has ", rows, " rows along dim ", cut.dim, ", the cut says ",
             cut.full);
  const int64_t padded = cut.full > 0 ? (rows + count - 1) / count * count : rows;
  const int64_t per = static_cast<int64_t>(count) * cut.blocks;
  if (padded % per != 0)
    PT_THROW(InputError, fn, ": ", what, ": size ", padded, " along dim ", cut.dim, " is not divisible by ", count,
             " parts x ", cut.blocks, " blocks");
  const int64_t sub = padded / per;            // rows of one block in one part
  const int64_t block_rows = padded / cut.blocks;
  Shape part_shape = whole.shape();
  part_shape[cut.dim] = padded / count;
  Tensor out = Tensor::empty(part_shape, whole.dtype());
  const Around a = around(whole.shape(), cut.dim, whole.dtype());
  const char* src = static_cast<const char*>(whole.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int64_t o = 0; o < a.outer; ++o)
    for (int b = 0; b < cut.blocks; ++b) {
      const int64_t begin = b * block_rows + index * sub;                   // first row in the padded whole
      const int64_t n = std::clamp<int64_t>(rows - begin, 0, sub);          // rows that are not padding
      char* d = dst + static_cast<size_t>(o * part_shape[cut.dim] + b * sub) * a.inner_bytes;
      copy_rows(d, src + static_cast<size_t>(o * rows + begin) * a.inner_bytes, n, a.inner_bytes);
      const size_t pad = static_cast<size_t>(sub - n) * a.inner_bytes;
      if (pad > 0) std::memset(d + static_cast<size_t>(n) * a.inner_bytes, 0, pad);
    }
  return out;
}

Tensor join_tensor(const std::vector<Tensor>& parts_in, const TensorCut& cut) {
  static const char* fn = "join_tensor";
  if (parts_in.empty()) PT_THROW(InputError, fn, ": no parts to join (cut ", cut.str(), ")");
  if (cut.replicated()) return cpu_contiguous(parts_in[0], fn, "part 0").clone();
  const int count = static_cast<int>(parts_in.size());
  std::vector<Tensor> parts;
  parts.reserve(parts_in.size());
  for (int i = 0; i < count; ++i) parts.push_back(cpu_contiguous(parts_in[i], fn, detail::concat("part ", i)));
  const Tensor& p0 = parts[0];
  const std::string what = detail::concat("join of ", count, " parts ", shape_str(p0.shape()), " cut ", cut.str());
  for (int i = 1; i < count; ++i)
    if (parts[i].shape() != p0.shape() || parts[i].dtype() != p0.dtype())
      PT_THROW(InputError, fn, ": ", what, ": part ", i, " is ", dtype_name(parts[i].dtype()), " ",
               shape_str(parts[i].shape()), ", part 0 ", dtype_name(p0.dtype()), " ", shape_str(p0.shape()));
  if (cut.dim >= p0.dim()) PT_THROW(InputError, fn, ": ", what, ": the parts have no dimension ", cut.dim);
  if (cut.blocks < 1) PT_THROW(InputError, fn, ": ", what, ": blocks must be >= 1");
  if (cut.blocks > 1 && cut.full > 0)
    PT_THROW(InputError, fn, ": ", what, ": padding (full > 0) cannot be combined with blocks > 1");
  const int64_t part_rows = p0.size(cut.dim);
  if (part_rows % cut.blocks != 0)
    PT_THROW(InputError, fn, ": ", what, ": size ", part_rows, " along dim ", cut.dim, " is not divisible by ",
             cut.blocks, " blocks");
  const int64_t padded = part_rows * count;
  if (cut.full < 0 || (cut.full > 0 && (cut.full + count - 1) / count * count != padded))
    PT_THROW(InputError, fn, ": ", what, ": ", count, " parts of ", part_rows, " rows cannot hold a tensor of ",
             cut.full, " rows padded to a multiple of ", count);
  const int64_t rows = cut.full > 0 ? cut.full : padded;
  const int64_t sub = part_rows / cut.blocks;
  const int64_t block_rows = padded / cut.blocks;
  Shape whole_shape = p0.shape();
  whole_shape[cut.dim] = rows;
  Tensor out = Tensor::empty(whole_shape, p0.dtype());
  const Around a = around(whole_shape, cut.dim, p0.dtype());
  char* dst = static_cast<char*>(out.data_ptr());
  for (int i = 0; i < count; ++i) {
    const char* src = static_cast<const char*>(parts[i].data_ptr());
    for (int64_t o = 0; o < a.outer; ++o)
      for (int b = 0; b < cut.blocks; ++b) {
        const int64_t begin = b * block_rows + static_cast<int64_t>(i) * sub;
        const int64_t n = std::clamp<int64_t>(rows - begin, 0, sub);  // the padding is dropped
        copy_rows(dst + static_cast<size_t>(o * rows + begin) * a.inner_bytes,
                  src + static_cast<size_t>(o * part_rows + b * sub) * a.inner_bytes, n, a.inner_bytes);
      }
  }
  return out;
}

}  // namespace paratrain::checkpoint
