#include "paratrain/data/fashion_mnist.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
#include <filesystem>

#include "data/temp_dir.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::data;
using paratrain::testing::error_of;
using paratrain::testing::TempDir;
using ::testing::HasSubstr;

namespace {

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

void write_gz(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

std::string images_idx(uint32_t n, uint32_t rows = 28, uint32_t cols = 28, uint32_t magic = 2051) {
  std::string s = be32(magic) + be32(n) + be32(rows) + be32(cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) s.push_back(static_cast<char>((i * 7) % 256));
  return s;
}

std::string labels_idx(uint32_t n, uint32_t magic = 2049) {
  std::string s = be32(magic) + be32(n);
  for (uint32_t i = 0; i < n; ++i) s.push_back(static_cast<char>(i % 10));
  return s;
}

// A small fake dataset directory with `n` training and test examples.
void make_dir(const TempDir& d, uint32_t n) {
  write_gz(d.path("train-images-idx3-ubyte.gz"), images_idx(n));
  write_gz(d.path("train-labels-idx1-ubyte.gz"), labels_idx(n));
  write_gz(d.path("t10k-images-idx3-ubyte.gz"), images_idx(n));
  write_gz(d.path("t10k-labels-idx1-ubyte.gz"), labels_idx(n));
}

bool have_debian_files() {
  return std::filesystem::exists(std::string(kFashionMnistDir) + "/t10k-images-idx3-ubyte.gz");
}

}  // namespace

TEST(FashionMnist, LoadsFakeDirAndNormalises) {
  TempDir d;
  make_dir(d, 5);
  auto ds = load_fashion_mnist(Split::Train, d.dir.string());
  ASSERT_EQ(ds.size(), 5);
  EXPECT_EQ(ds.images.shape(), (Shape{5, 1, 28, 28}));
  EXPECT_EQ(ds.images.dtype(), DType::F32);
  EXPECT_EQ(ds.labels.dtype(), DType::I32);
  EXPECT_EQ(ds.labels.to_vector_i64(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  const float* x = ds.images.data<float>();
  for (int i : {0, 1, 100, 3919}) {
    const float want = (static_cast<float>((i * 7) % 256) / 255.0f - 0.2860f) / 0.3530f;
    EXPECT_NEAR(x[i], want, 1e-5f) << i;
  }
  auto limited = load_fashion_mnist(Split::Test, d.dir.string(), 2);
  EXPECT_EQ(limited.size(), 2);
}

TEST(FashionMnist, AcceptsUncompressedFiles) {
  TempDir d;
  paratrain::testing::write_bytes(d.path("t10k-images-idx3-ubyte"), images_idx(3));
  paratrain::testing::write_bytes(d.path("t10k-labels-idx1-ubyte"), labels_idx(3));
  EXPECT_EQ(load_fashion_mnist(Split::Test, d.dir.string()).size(), 3);
}

TEST(FashionMnist, MissingDirNamesTheFile) {
  auto msg = error_of<InputError>([] { load_fashion_mnist(Split::Train, "/nonexistent/fmnist"); });
  EXPECT_THAT(msg, HasSubstr("/nonexistent/fmnist/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(msg, HasSubstr("No such file"));
}

TEST(FashionMnist, WrongMagic) {
  TempDir d;
  write_gz(d.path("i.gz"), images_idx(1, 28, 28, 2049));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_images(d.path("i.gz")); }),
              HasSubstr("wrong magic 2049 (expected 2051)"));
  write_gz(d.path("l.gz"), labels_idx(1, 2051));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_labels(d.path("l.gz")); }),
              HasSubstr("wrong magic 2051 (expected 2049)"));
}

TEST(FashionMnist, WrongImageSize) {
  TempDir d;
  write_gz(d.path("i.gz"), images_idx(1, 32, 32));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_images(d.path("i.gz")); }),
              HasSubstr("images of 32x32 (expected 28x28)"));
}

TEST(FashionMnist, TruncatedAndTrailing) {
  TempDir d;
  auto im = images_idx(3);
  write_gz(d.path("t.gz"), im.substr(0, im.size() - 10));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_images(d.path("t.gz")); }),
              HasSubstr("truncated: header says 3 images"));
  write_gz(d.path("x.gz"), im + "zz");
  EXPECT_THAT(error_of<InputError>([&] { read_idx_images(d.path("x.gz")); }), HasSubstr("2 bytes after its 3 images"));
  write_gz(d.path("h.gz"), im.substr(0, 9));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_images(d.path("h.gz")); }),
              HasSubstr("shorter than the 16-byte header"));
  auto lb = labels_idx(5);
  write_gz(d.path("lt.gz"), lb.substr(0, lb.size() - 1));
  EXPECT_THAT(error_of<InputError>([&] { read_idx_labels(d.path("lt.gz")); }),
              HasSubstr("truncated: header says 5 labels but it holds 4"));
}

TEST(FashionMnist, CorruptGzip) {
  TempDir d;
  write_gz(d.path("c.gz"), images_idx(20));
  std::string bytes = paratrain::testing::read_bytes(d.path("c.gz"));
  // Cut the compressed stream in half: a truncated download.
  paratrain::testing::write_bytes(d.path("c.gz"), bytes.substr(0, bytes.size() / 2));
  auto msg = error_of<InputError>([&] { read_idx_images(d.path("c.gz")); });
  EXPECT_THAT(msg, HasSubstr(d.path("c.gz")));
}

TEST(FashionMnist, BadLabel) {
  TempDir d;
  std::string s = be32(2049) + be32(2) + std::string{1, 12};
  write_gz(d.path("l.gz"), s);
  EXPECT_THAT(error_of<InputError>([&] { read_idx_labels(d.path("l.gz")); }),
              HasSubstr("label 12 at index 1 (expected 0..9)"));
}

TEST(FashionMnist, CountMismatch) {
  TempDir d;
  write_gz(d.path("train-images-idx3-ubyte.gz"), images_idx(4));
  write_gz(d.path("train-labels-idx1-ubyte.gz"), labels_idx(3));
  EXPECT_THAT(error_of<InputError>([&] { load_fashion_mnist(Split::Train, d.dir.string()); }),
              HasSubstr("has 4 images but"));
}

TEST(FashionMnist, LoaderFollowsDataOrder) {
  TempDir d;
  make_dir(d, 23);
  auto ds = load_fashion_mnist(Split::Train, d.dir.string());
  BatchLayout L{2, 2, 1};
  ImageLoader loader(ds, L, 77);
  EXPECT_EQ(loader.steps_per_epoch(), 5);
  DataOrder order(23, L, 77);
  Tensor x, y;
  for (int64_t s : {0, 4, 5, 9})
    for (int64_t k = 0; k < 2; ++k) {
      loader.fill(s, k, 0, x, y);
      ASSERT_EQ(x.shape(), (Shape{2, 1, 28, 28}));
      auto items = order.items(s, k, 0);
      for (int b = 0; b < 2; ++b) {
        EXPECT_EQ(y.data<int32_t>()[b], items[b] % 10);
        EXPECT_EQ(x.data<float>()[b * 784 + 5], ds.images.data<float>()[items[b] * 784 + 5]);
      }
    }
}

TEST(FashionMnist, EvalCoversEveryExample) {
  TempDir d;
  make_dir(d, 10);
  auto ds = load_fashion_mnist(Split::Test, d.dir.string());
  ImageEvalLoader ev(ds, 4);
  ASSERT_EQ(ev.num_batches(), 3);
  Tensor x, y;
  EXPECT_EQ(ev.fill(0, x, y), 4);
  EXPECT_EQ(ev.fill(2, x, y), 2);
  EXPECT_EQ(y.shape(), (Shape{2}));
  EXPECT_EQ(y.to_vector_i64(), (std::vector<int64_t>{8, 9}));
}

TEST(FashionMnist, DebianFiles) {
  ASSERT_TRUE(have_debian_files()) << "dataset-fashion-mnist is missing: scripts/install_deps.sh installs it";
  auto test = load_fashion_mnist(Split::Test);
  ASSERT_EQ(test.size(), 10000);
  std::vector<int64_t> per_class(10, 0);
  for (auto l : test.labels.to_vector_i64()) ++per_class[l];
  for (auto c : per_class) EXPECT_EQ(c, 1000);
  // The normalisation constants are the training set's statistics; the test set is close.
  double sum = 0, sq = 0;
  const float* x = test.images.data<float>();
  const int64_t n = test.images.numel();
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sq += static_cast<double>(x[i]) * x[i];
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(std::sqrt(var), 1.0, 0.02);
}

TEST(FashionMnist, DebianTrainSet) {
  ASSERT_TRUE(have_debian_files()) << "dataset-fashion-mnist is missing: scripts/install_deps.sh installs it";
  auto train = load_fashion_mnist(Split::Train);
  ASSERT_EQ(train.size(), 60000);
  double sum = 0, sq = 0;
  const float* x = train.images.data<float>();
  const int64_t n = train.images.numel();
  for (int64_t i = 0; i < n; ++i) {
    sum += x[i];
    sq += static_cast<double>(x[i]) * x[i];
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 1e-3);
  EXPECT_NEAR(std::sqrt(var), 1.0, 1e-3);
}
