#include "paratrain/data/fashion_mnist.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "paratrain/base/error.h"

namespace paratrain::data {

namespace {

constexpr uint32_t kImagesMagic = 2051;
constexpr uint32_t kLabelsMagic = 2049;

// Reads a whole gzip (or plain) file.
std::vector<uint8_t> read_gz(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    PT_THROW(InputError, "cannot open IDX file ", path, ": ",
             std::filesystem::exists(path, ec) ? "not a regular file" : "No such file or directory");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) {
    int err = errno;
    PT_THROW(InputError, "cannot open IDX file ", path, ": ", std::strerror(err));
  }
  gzbuffer(f, 1 << 17);
  std::vector<uint8_t> out;
  uint8_t buf[1 << 16];
  for (;;) {
    int n = gzread(f, buf, sizeof(buf));
    if (n < 0) {
      int errnum = 0;
      std::string msg = gzerror(f, &errnum);
      gzclose(f);
      PT_THROW(InputError, "IDX file ", path, " is corrupt: ", msg);
    }
    if (n == 0) break;
    out.insert(out.end(), buf, buf + n);
  }
  // gzread reports a truncated gzip stream as EOF with Z_BUF_ERROR.
  int errnum = 0;
  const char* msg = gzerror(f, &errnum);
  if (errnum != Z_OK && errnum != Z_STREAM_END) {
    std::string m = msg;
    gzclose(f);
    PT_THROW(InputError, "IDX file ", path, " is corrupt or truncated: ", m);
  }
  gzclose(f);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string resolve(const std::string& dir, const std::string& name) {
  std::string gz = dir + "/" + name + ".gz";
  std::error_code ec;
  if (std::filesystem::exists(gz, ec)) return gz;
  std::string plain = dir + "/" + name;
  if (std::filesystem::exists(plain, ec)) return plain;
  return gz;  // missing: the error names the .gz file
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  auto bytes = read_gz(path);
  if (bytes.size() < 16)
    PT_THROW(InputError, "IDX images file ", path, " is truncated: ", bytes.size(), " bytes, shorter than the 16-byte header");
  const uint32_t magic = be32(&bytes[0]);
  if (magic != kImagesMagic)
    PT_THROW(InputError, "IDX images file ", path, " has wrong magic ", magic, " (expected ", kImagesMagic, ")");
  IdxImages im;
  im.count = be32(&bytes[4]);
  im.rows = be32(&bytes[8]);
  im.cols = be32(&bytes[12]);
  if (im.rows != 28 || im.cols != 28)
    PT_THROW(InputError, "IDX images file ", path, " has images of ", im.rows, "x", im.cols, " (expected 28x28)");
  const size_t expect = 16 + static_cast<size_t>(im.count) * 28 * 28;
  if (bytes.size() < expect)
    PT_THROW(InputError, "IDX images file ", path, " is truncated: header says ", im.count, " images (", expect,
             " bytes) but it holds ", bytes.size(), " bytes");
  if (bytes.size() > expect)
    PT_THROW(InputError, "IDX images file ", path, " has ", bytes.size() - expect, " bytes after its ", im.count,
             " images");
  im.pixels.assign(bytes.begin() + 16, bytes.end());
  return im;
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  auto bytes = read_gz(path);
  if (bytes.size() < 8)
    PT_THROW(InputError, "IDX labels file ", path, " is truncated: ", bytes.size(), " bytes, shorter than the 8-byte header");
  const uint32_t magic = be32(&bytes[0]);
  if (magic != kLabelsMagic)
    PT_THROW(InputError, "IDX labels file ", path, " has wrong magic ", magic, " (expected ", kLabelsMagic, ")");
  const size_t count = be32(&bytes[4]);
  if (bytes.size() < 8 + count)
    PT_THROW(InputError, "IDX labels file ", path, " is truncated: header says ", count, " labels but it holds ",
             bytes.size() - 8);
  if (bytes.size() > 8 + count)
    PT_THROW(InputError, "IDX labels file ", path, " has ", bytes.size() - 8 - count, " bytes after its ", count,
             " labels");
  std::vector<uint8_t> labels(bytes.begin() + 8, bytes.end());
  for (size_t i = 0; i < labels.size(); ++i)
    if (labels[i] >= kFashionMnistClasses)
      PT_THROW(InputError, "IDX labels file ", path, " has label ", int{labels[i]}, " at index ", i,
               " (expected 0..9)");
  return labels;
}

ImageDataset load_fashion_mnist(Split split, const std::string& dir, int64_t limit) {
  const std::string prefix = split == Split::Train ? "train" : "t10k";
  const std::string ipath = resolve(dir, prefix + "-images-idx3-ubyte");
  const std::string lpath = resolve(dir, prefix + "-labels-idx1-ubyte");
  IdxImages im = read_idx_images(ipath);
  std::vector<uint8_t> lab = read_idx_labels(lpath);
  if (static_cast<int64_t>(lab.size()) != im.count)
    PT_THROW(InputError, "Fashion-MNIST in ", dir, ": ", ipath, " has ", im.count, " images but ", lpath, " has ",
             lab.size(), " labels");
  int64_t n = im.count;
  if (limit > 0 && limit < n) n = limit;
  ImageDataset ds;
  ds.images = Tensor::empty({n, 1, 28, 28}, DType::F32);
  ds.labels = Tensor::empty({n}, DType::I32);
  float* x = ds.images.data<float>();
  const float scale = 1.0f / (255.0f * kFashionMnistStd);
  const float shift = kFashionMnistMean / kFashionMnistStd;
  // x = (p/255 - mean) / std, computed as p * scale - shift.
  for (int64_t i = 0, m = n * 28 * 28; i < m; ++i) x[i] = static_cast<float>(im.pixels[i]) * scale - shift;
  int32_t* y = ds.labels.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) y[i] = lab[i];
  return ds;
}

void gather_examples(const ImageDataset& data, const std::vector<int64_t>& indices, Tensor& images, Tensor& labels) {
  const auto n = static_cast<int64_t>(indices.size());
  if (!images.defined() || images.dtype() != DType::F32 || images.shape() != Shape{n, 1, 28, 28} ||
      !images.is_contiguous())
    images = Tensor::empty({n, 1, 28, 28}, DType::F32);
  if (!labels.defined() || labels.dtype() != DType::I32 || labels.shape() != Shape{n} || !labels.is_contiguous())
    labels = Tensor::empty({n}, DType::I32);
  const float* src = data.images.data<float>();
  const int32_t* lab = data.labels.data<int32_t>();
  float* dst = images.data<float>();
  int32_t* dl = labels.data<int32_t>();
  constexpr int64_t kPix = 28 * 28;
  for (int64_t i = 0; i < n; ++i) {
    PT_CHECK(indices[i] >= 0 && indices[i] < data.size(), "example ", indices[i], " outside [0, ", data.size(), ")");
    std::memcpy(dst + i * kPix, src + indices[i] * kPix, kPix * sizeof(float));
    dl[i] = lab[indices[i]];
  }
}

ImageLoader::ImageLoader(const ImageDataset& data, BatchLayout layout, uint64_t seed)
    : data_(data), order_(data.size(), layout, seed, "image dataset") {
  PT_CHECK(data.images.defined() && data.images.is_contiguous() && data.images.dtype() == DType::F32 &&
               data.images.dim() == 4 && data.images.size(0) == data.size(),
           "ImageLoader needs contiguous f32 (N,1,28,28) images");
}

void ImageLoader::fill(int64_t step, int64_t micro_step, int64_t dp_rank, Tensor& images, Tensor& labels) {
  gather_examples(data_, order_.items(step, micro_step, dp_rank), images, labels);
}

void ImageLoader::fill_range(int64_t step, int64_t micro_step, int64_t first, int64_t count, Tensor& images,
                             Tensor& labels) {
  gather_examples(data_, order_.items_range(step, micro_step, first, count), images, labels);
}

ImageEvalLoader::ImageEvalLoader(const ImageDataset& data, int64_t micro_batch) : data_(data), micro_batch_(micro_batch) {
  if (micro_batch < 1) PT_THROW(InputError, "micro-batch ", micro_batch, " must be at least 1");
}

int64_t ImageEvalLoader::num_batches() const { return (data_.size() + micro_batch_ - 1) / micro_batch_; }

int64_t ImageEvalLoader::fill(int64_t batch, Tensor& images, Tensor& labels) const {
  PT_CHECK(batch >= 0 && batch < num_batches(), "evaluation batch ", batch, " outside [0, ", num_batches(), ")");
  const int64_t begin = batch * micro_batch_;
  const int64_t n = std::min(micro_batch_, data_.size() - begin);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[i] = begin + i;
  gather_examples(data_, idx, images, labels);
  return n;
}

}  // namespace paratrain::data
