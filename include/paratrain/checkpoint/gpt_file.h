// A GPT from a safetensors model file (what `paratrain train --save-final` writes, or a
// Hugging Face GPT-2 file): the configuration is read off the tensors, the weights loaded.
//
// The file holds the DESIGN.md GPT names, optionally behind a "transformer." prefix:
// vocab_size and n_embd come from wte.weight [V,C], block_size from wpe.weight [T,C],
// n_layer is the number of h.{i}.ln_1.weight tensors, n_head comes from the options, else
// the file's "n_head" metadata (paratrain writes it), else max(1, n_embd / 64) (GPT-2's head
// size). Weights of any float dtype (F32, BF16, F16) are converted to the model's f32.
// Strict: a missing, extra or misshapen tensor is an InputError naming the file and the
// tensor, as is a file without wte/wpe (not a GPT) or a configuration GPTConfig::validate
// refuses. I/O and format errors are those of read_safetensors (checkpoint/safetensors.h).
//
// Thread-safety: no shared state; concurrent calls may read the same file. The returned
// model is the caller's, independent of the file (its tensors are copies); it comes back in
// eval mode, without gradients.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/nn/gpt.h"

namespace paratrain::checkpoint {

struct GPTFileOptions {
  // Attention heads; 0 = the file's "n_head" metadata, else max(1, n_embd / 64).
  int64_t n_head = 0;
};

// The configuration a GPT file describes (see above; `path` only names the file in errors).
// dropout stays 0.
nn::GPTConfig gpt_config_from_file(const SafetensorsFile& file, const std::string& path,
                                   const GPTFileOptions& options = {});

// Reads `path` and returns the GPT it holds, in eval mode.
std::unique_ptr<nn::GPT> load_gpt(const std::string& path, const GPTFileOptions& options = {});

}  // namespace paratrain::checkpoint
