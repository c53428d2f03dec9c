#include "paratrain/data/token_loader.h"

#include "paratrain/base/error.h"
#include "paratrain/base/log.h"

namespace paratrain::data {

int64_t num_windows(int64_t n_tokens, int64_t block_size) {
  PT_CHECK(block_size >= 1, "block size ", block_size);
  return n_tokens <= 1 ? 0 : (n_tokens - 1) / block_size;
}

namespace {

void ensure_shape(Tensor& t, int64_t B, int64_t T) {
  if (!t.defined() || t.dtype() != DType::I32 || t.dim() != 2 || t.size(0) != B || t.size(1) != T ||
      !t.is_contiguous() || t.device() != Device::CPU)
    t = Tensor::empty({B, T}, DType::I32);
}

void check_block(const std::string& path, int64_t block_size) {
  if (block_size < 1) PT_THROW(InputError, "block size ", block_size, " for ", path, " must be at least 1");
}

std::string file_what(const TokenFile& f, int64_t block_size) {
  return detail::concat("token file ", f.path(), " (", f.size(), " tokens, windows of ", block_size + 1, ")");
}

}  // namespace

void fill_windows(const TokenFile& file, int64_t block_size, const std::vector<int64_t>& windows, Tensor& inputs,
                  Tensor& targets) {
  const auto B = static_cast<int64_t>(windows.size());
  const int64_t T = block_size;
  ensure_shape(inputs, B, T);
  ensure_shape(targets, B, T);
  int32_t* in = inputs.data<int32_t>();
  int32_t* tg = targets.data<int32_t>();
  const uint16_t* tok = file.tokens().data();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = windows[b] * T;
    PT_CHECK(start + T + 1 <= file.size(), "window ", windows[b], " beyond the end of ", file.path());
    const uint16_t* w = tok + start;
    for (int64_t t = 0; t < T; ++t) {
      in[b * T + t] = w[t];
      tg[b * T + t] = w[t + 1];
    }
  }
}

TokenLoader::TokenLoader(const std::string& path, int64_t block_size, BatchLayout layout, uint64_t seed)
    : TokenLoader((check_block(path, block_size), std::make_shared<const TokenFile>(path)), block_size, layout,
                  seed) {}

TokenLoader::TokenLoader(std::shared_ptr<const TokenFile> file, int64_t block_size, BatchLayout layout,
                         uint64_t seed)
    : file_(std::move(file)),
      block_size_((check_block(file_->path(), block_size), block_size)),
      order_(data::num_windows(file_->size(), block_size), layout, seed, file_what(*file_, block_size)) {
  PT_LOG_DEBUG(kData, "token file ", file_->path(), ": ", file_->size(), " tokens, ",
               data::num_windows(file_->size(), block_size), " windows of ", block_size + 1, " tokens, seed ", seed);
}

void TokenLoader::fill(int64_t step, int64_t micro_step, int64_t dp_rank, Tensor& inputs, Tensor& targets) {
  fill_windows(*file_, block_size_, order_.items(step, micro_step, dp_rank), inputs, targets);
}

void TokenLoader::fill_range(int64_t step, int64_t micro_step, int64_t first, int64_t count, Tensor& inputs,
                             Tensor& targets) {
  fill_windows(*file_, block_size_, order_.items_range(step, micro_step, first, count), inputs, targets);
}

TokenEvalLoader::TokenEvalLoader(const std::string& path, int64_t block_size, int64_t micro_batch)
    : TokenEvalLoader((check_block(path, block_size), std::make_shared<const TokenFile>(path)), block_size,
                      micro_batch) {}

TokenEvalLoader::TokenEvalLoader(std::shared_ptr<const TokenFile> file, int64_t block_size, int64_t micro_batch)
    : file_(std::move(file)), block_size_(block_size), micro_batch_(micro_batch) {
  check_block(file_->path(), block_size);
  if (micro_batch < 1) PT_THROW(InputError, "micro-batch ", micro_batch, " must be at least 1");
  num_windows_ = data::num_windows(file_->size(), block_size);
  if (num_windows_ < micro_batch)
    PT_THROW(InputError, file_what(*file_, block_size), " has ", num_windows_,
             " windows, fewer than one evaluation batch of ", micro_batch);
}

void TokenEvalLoader::fill(int64_t batch, Tensor& inputs, Tensor& targets) const {
  PT_CHECK(batch >= 0 && batch < num_batches(), "evaluation batch ", batch, " outside [0, ", num_batches(), ")");
  std::vector<int64_t> windows(static_cast<size_t>(micro_batch_));
  for (int64_t i = 0; i < micro_batch_; ++i) windows[i] = batch * micro_batch_ + i;
  fill_windows(*file_, block_size_, windows, inputs, targets);
}

}  // namespace paratrain::data
