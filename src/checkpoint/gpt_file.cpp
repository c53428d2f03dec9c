#include "paratrain/checkpoint/gpt_file.h"

#include <algorithm>

#include "paratrain/base/error.h"

namespace paratrain::checkpoint {

namespace {

const Tensor* find_either(const SafetensorsFile& file, const std::string& name) {
  auto it = file.tensors.find(name);
  if (it == file.tensors.end()) it = file.tensors.find("transformer." + name);
  return it == file.tensors.end() ? nullptr : &it->second;
}

int64_t meta_int(const Metadata& m, const std::string& path, const std::string& key, int64_t fallback) {
  auto it = m.find(key);
  if (it == m.end()) return fallback;
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  PT_THROW(InputError, path, ": model metadata '", key, "' is not an integer: '", it->second, "'");
}

}  // namespace

nn::GPTConfig gpt_config_from_file(const SafetensorsFile& file, const std::string& path,
                                   const GPTFileOptions& options) {
  const Tensor* wte = find_either(file, "wte.weight");
  const Tensor* wpe = find_either(file, "wpe.weight");
  if (!wte || !wpe) PT_THROW(InputError, path, ": not a GPT model (no wte.weight / wpe.weight)");
  if (wte->dim() != 2 || wpe->dim() != 2 || wte->size(1) != wpe->size(1))
    PT_THROW(InputError, path, ": not a GPT model (wte.weight ", wte->to_string(), " and wpe.weight ",
             wpe->to_string(), " should be [vocab, n_embd] and [block_size, n_embd])");
  if (options.n_head < 0) PT_THROW(InputError, "GPTFileOptions::n_head must be >= 0 (0 = from the file), got ", options.n_head);
  nn::GPTConfig g;
  g.vocab_size = wte->size(0);
  g.n_embd = wte->size(1);
  g.block_size = wpe->size(0);
  g.dropout = 0.0f;
  g.n_layer = 0;
  for (const auto& [name, t] : file.tensors)
    if (name.ends_with(".ln_1.weight")) g.n_layer++;
  const char* from = "GPTFileOptions::n_head";
  if (options.n_head > 0) {
    g.n_head = options.n_head;
  } else if (file.metadata.count("n_head")) {
    g.n_head = meta_int(file.metadata, path, "n_head", 0);
    from = "the file's n_head metadata";
  } else {
    g.n_head = std::max<int64_t>(1, g.n_embd / 64);
    from = "n_embd / 64, the file has no n_head metadata";
  }
  if (g.n_layer == 0) PT_THROW(InputError, path, ": not a GPT model (no h.{i}.ln_1.weight blocks)");
  if (g.n_head <= 0 || g.n_embd % g.n_head != 0)
    PT_THROW(InputError, path, ": n_embd ", g.n_embd, " (of wte.weight) is not divisible by n_head ", g.n_head, " (",
             from, "); give the head count (GPTFileOptions::n_head; paratrain sample --n-head)");
  try {
    g.validate();
  } catch (const InputError& e) {
    PT_THROW(InputError, path, ": ", e.what());
  }
  return g;
}

std::unique_ptr<nn::GPT> load_gpt(const std::string& path, const GPTFileOptions& options) {
  SafetensorsFile file = read_safetensors(path);
  const nn::GPTConfig g = gpt_config_from_file(file, path, options);
  auto model = std::make_unique<nn::GPT>(g, 0);
  try {
    model->load_state_dict(file.tensors, true, "transformer.");
  } catch (const InputError& e) {
    PT_THROW(InputError, path, ": ", e.what());
  }
  model->eval();
  return model;
}

}  // namespace paratrain::checkpoint
