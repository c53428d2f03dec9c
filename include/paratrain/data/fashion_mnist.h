// Fashion-MNIST from the IDX files of Debian's dataset-fashion-mnist, and its batches.
//
// Files (in `dir`, default kFashionMnistDir): train-images-idx3-ubyte.gz,
// train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz. Each is
// gzip-compressed IDX with a big-endian header: images magic 2051, count, rows 28, cols 28,
// then count x 28 x 28 uint8 pixels; labels magic 2049, count, then uint8 labels 0..9.
// Uncompressed files (same names without .gz) are accepted too.
//
// Normalisation: x = (pixel / 255 - kFashionMnistMean) / kFashionMnistStd, with the mean and
// standard deviation of the training pixels (0.2860, 0.3530), in f32.
//
// Every malformed input (missing file, not gzip, wrong magic, wrong size, truncated, label
// > 9, image and label counts that differ) is an InputError naming the file and the problem.
//
// Lifetimes: an ImageDataset owns its tensors; ImageLoader and ImageEvalLoader share them
// (Tensor handles, no copy), so the data stays alive as long as any of them.
// Thread-safety: the readers keep no state and may run concurrently. An ImageLoader caches
// an epoch's permutation (data_order.h) and is not thread-safe: one per thread. An
// ImageEvalLoader changes nothing (fill is const) and may fill distinct tensors from several
// threads. The tensors they fill are the caller's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/data/data_order.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::data {

constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr float kFashionMnistMean = 0.2860f;
constexpr float kFashionMnistStd = 0.3530f;
constexpr int64_t kFashionMnistClasses = 10;
inline constexpr const char* kFashionMnistClassNames[10] = {"T-shirt/top", "Trouser", "Pullover", "Dress",
                                                     "Coat",        "Sandal",  "Shirt",    "Sneaker",
                                                     "Bag",         "Ankle boot"};

enum class Split { Train, Test };

// A labelled image set: images f32 (N, 1, 28, 28) normalised as above, labels I32 (N).
struct ImageDataset {
  Tensor images;
  Tensor labels;
  int64_t size() const { return labels.defined() ? labels.numel() : 0; }
};

// Raw IDX readers (gzip or plain): pixels as uint8 (N, rows, cols) row-major, labels uint8.
struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;
};
IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);

// Loads a split from `dir` (the images and labels files above). `limit` > 0 keeps only the
// first `limit` examples (for quick tests).
ImageDataset load_fashion_mnist(Split split, const std::string& dir = kFashionMnistDir,
                                int64_t limit = 0);

// Training batches in the order of data_order.h (items = examples).
class ImageLoader {
 public:
  // Shares `data`'s tensors. InputError if there are fewer examples than one global batch.
  ImageLoader(const ImageDataset& data, BatchLayout layout, uint64_t seed);

  // images f32 (B, 1, 28, 28), labels I32 (B); reallocated when undefined or misshapen.
  void fill(int64_t step, int64_t micro_step, int64_t dp_rank, Tensor& images, Tensor& labels);
  // Examples DataOrder::items_range(step, k, first, count): images (count, 1, 28, 28).
  void fill_range(int64_t step, int64_t micro_step, int64_t first, int64_t count, Tensor& images,
                  Tensor& labels);

  int64_t steps_per_epoch() const { return order_.steps_per_epoch(); }
  const BatchLayout& layout() const { return order_.layout(); }
  int64_t size() const { return data_.size(); }

 private:
  ImageDataset data_;
  DataOrder order_;
};

// Evaluation batches in file order: batch b = examples [b*B, min((b+1)*B, N)); the last batch
// may be smaller so that every example is evaluated; num_batches() = ceil(N / B).
class ImageEvalLoader {
 public:
  ImageEvalLoader(const ImageDataset& data, int64_t micro_batch);
  int64_t num_batches() const;
  // Returns the number of examples filled (B, or fewer for the last batch); images and
  // labels get that many rows.
  int64_t fill(int64_t batch, Tensor& images, Tensor& labels) const;
  int64_t size() const { return data_.size(); }

 private:
  ImageDataset data_;
  int64_t micro_batch_;
};

// Copies examples `indices` of `data` into images (n,1,28,28) / labels (n).
void gather_examples(const ImageDataset& data, const std::vector<int64_t>& indices, Tensor& images,
                     Tensor& labels);

}  // namespace paratrain::data
