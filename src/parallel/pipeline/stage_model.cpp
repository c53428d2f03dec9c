#include "paratrain/parallel/pipeline/stage_model.h"

#include "paratrain/base/error.h"

namespace paratrain::parallel::pipeline {

namespace {

// What replaces a released child: a module with no parameters.
class Released final : public nn::Module {};

double param_count(const nn::Module& m) { return static_cast<double>(m.num_parameters()); }

}  // namespace

StageCosts parameter_costs(const nn::GPT& model) {
  StageCosts c;
  for (const auto& b : model.h) c.blocks.push_back(param_count(*b));
  // The first stage holds the token and position tables; the last the final norm and the
  // tied head (its copy of the token table).
  c.first_extra = param_count(*model.wte) + param_count(*model.wpe);
  c.last_extra = param_count(*model.ln_f) + param_count(*model.wte);
  return c;
}

std::vector<StageRange> all_stages(const StageCosts& costs, int pp, int virtual_chunks) {
  if (pp < 1 || virtual_chunks < 1)
    PT_THROW(InputError, "pipeline: --pp ", pp, " and --pp-virtual ", virtual_chunks, " must be at least 1");
  const int stages = pp * virtual_chunks;
  if (stages > static_cast<int>(costs.blocks.size()))
    PT_THROW(InputError, "--pp ", pp, virtual_chunks > 1 ? " x --pp-virtual " + std::to_string(virtual_chunks) : "",
             " = ", stages, " pipeline stages, but the model has only ", costs.blocks.size(),
             " blocks (every stage needs at least one; use fewer stages or more --n-layer)");
  return balance_stages(costs.blocks, costs.first_extra, costs.last_extra, stages);
}

std::vector<StageRange> stage_chunks(const StageCosts& costs, int pp, int virtual_chunks, int pp_rank) {
  const auto stages = all_stages(costs, pp, virtual_chunks);
  std::vector<StageRange> mine;
  for (int c = 0; c < virtual_chunks; ++c) mine.push_back(stages[static_cast<size_t>(c * pp + pp_rank)]);
  return mine;
}

bool holds_first_stage(const std::vector<StageRange>& chunks) {
  for (const auto& c : chunks)
    if (c.first_block == 0) return true;
  return false;
}

bool holds_last_stage(const std::vector<StageRange>& chunks, int64_t n_layer) {
  for (const auto& c : chunks)
    if (c.end_block == n_layer) return true;
  return false;
}

void keep_stage_parameters(nn::GPT& model, const std::vector<StageRange>& chunks) {
  const int64_t L = static_cast<int64_t>(model.h.size());
  std::vector<bool> keep(static_cast<size_t>(L), false);
  for (const auto& c : chunks)
    for (int64_t b = c.first_block; b < c.end_block; ++b) keep[static_cast<size_t>(b)] = true;
  nn::Module* list = &model.child("h");
  for (int64_t b = 0; b < L; ++b)
    if (!keep[static_cast<size_t>(b)]) {
      list->replace_module(std::to_string(b), std::make_shared<Released>());
      model.h[static_cast<size_t>(b)].reset();
    }
  const bool first = holds_first_stage(chunks), last = holds_last_stage(chunks, L);
  if (!first) {
    model.replace_module("wpe", std::make_shared<Released>());
    model.wpe.reset();
  }
  if (!last) {
    model.replace_module("ln_f", std::make_shared<Released>());
    model.ln_f.reset();
  }
  if (!first && !last) {
    model.replace_module("wte", std::make_shared<Released>());
    model.wte.reset();
  }
}

TiedHeadGroup::TiedHeadGroup(const DeviceMesh& mesh, bool holds_first, bool holds_last) {
  const MeshShape& s = mesh.shape();
  if (s.pp == 1 || !mesh.world()) return;
  // One group per (dp, tp) coordinate: its first-stage rank and its last-stage rank. Every
  // rank creates all of them in the same order (new_group is collective over the world).
  for (int d = 0; d < s.dp; ++d)
    for (int t = 0; t < s.tp; ++t) {
      const int first = mesh_rank({d, t, 0}, s), last = mesh_rank({d, t, s.pp - 1}, s);
      auto g = mesh.world()->new_group({first, last});
      if (g) group_ = g;
    }
  duplicate_ = holds_last && !holds_first;
}

void TiedHeadGroup::broadcast_from_first(Tensor& param) const {
  if (!group_) return;
  if (!param.is_contiguous()) PT_THROW(Error, "TiedHeadGroup: wte is not contiguous");
  group_->broadcast(param.data<float>(), static_cast<size_t>(param.numel()), DType::F32, 0)->wait();
}

void TiedHeadGroup::sum_gradients(Tensor& grad) const {
  if (!group_ || !grad.defined()) return;
  if (!grad.is_contiguous()) PT_THROW(Error, "TiedHeadGroup: wte's gradient is not contiguous");
  group_->allreduce(grad.data<float>(), static_cast<size_t>(grad.numel()), DType::F32)->wait();
}

}  // namespace paratrain::parallel::pipeline

namespace paratrain::parallel::pipeline {

std::map<std::string, Tensor> gather_stages(const std::map<std::string, Tensor>& mine, comm::ProcessGroup* pp) {
  if (!pp || pp->size() == 1) return mine;
  constexpr int kHeaderTag = 1 << 28, kDataTag = kHeaderTag + 1;
  if (pp->rank() != 0) {
    // Header: count, then per tensor its name length, ndim and dims; then the names' bytes
    // (as i32), then every tensor's f32 data in one buffer.
    std::vector<int64_t> header = {static_cast<int64_t>(mine.size())};
    std::vector<int32_t> names;
    int64_t total = 0;
    for (const auto& [name, t] : mine) {
      if (t.dtype() != DType::F32) PT_THROW(Error, "gather_stages: ", name, " is not f32");
      header.push_back(static_cast<int64_t>(name.size()));
      header.push_back(t.dim());
      for (int64_t d : t.shape()) header.push_back(d);
      for (char ch : name) names.push_back(static_cast<unsigned char>(ch));
      total += t.numel();
    }
    std::vector<float> data;
    data.reserve(static_cast<size_t>(total));
    for (const auto& [name, t] : mine) {
      const Tensor c = t.contiguous();
      data.insert(data.end(), c.data<float>(), c.data<float>() + c.numel());
    }
    const int64_t sizes[3] = {static_cast<int64_t>(header.size()), static_cast<int64_t>(names.size()), total};
    pp->send(sizes, 3, DType::I64, 0, kHeaderTag)->wait();
    pp->send(header.data(), header.size(), DType::I64, 0, kHeaderTag)->wait();
    if (!names.empty()) pp->send(names.data(), names.size(), DType::I32, 0, kHeaderTag)->wait();
    if (total) pp->send(data.data(), data.size(), DType::F32, 0, kDataTag)->wait();
    return mine;
  }
  std::map<std::string, Tensor> all = mine;
  for (int src = 1; src < pp->size(); ++src) {
    int64_t sizes[3];
    pp->recv(sizes, 3, DType::I64, src, kHeaderTag)->wait();
    std::vector<int64_t> header(static_cast<size_t>(sizes[0]));
    std::vector<int32_t> names(static_cast<size_t>(sizes[1]));
    std::vector<float> data(static_cast<size_t>(sizes[2]));
    pp->recv(header.data(), header.size(), DType::I64, src, kHeaderTag)->wait();
    if (!names.empty()) pp->recv(names.data(), names.size(), DType::I32, src, kHeaderTag)->wait();
    if (!data.empty()) pp->recv(data.data(), data.size(), DType::F32, src, kDataTag)->wait();
    size_t h = 1, n = 0, d = 0;
    for (int64_t i = 0; i < header[0]; ++i) {
      const size_t len = static_cast<size_t>(header[h++]);
      const int64_t ndim = header[h++];
      Shape shape(header.begin() + static_cast<std::ptrdiff_t>(h), header.begin() + static_cast<std::ptrdiff_t>(h + ndim));
      h += static_cast<size_t>(ndim);
      std::string name;
      for (size_t k = 0; k < len; ++k) name.push_back(static_cast<char>(names[n + k]));
      n += len;
      Tensor t = Tensor::empty(shape, DType::F32);
      std::copy(data.begin() + static_cast<std::ptrdiff_t>(d), data.begin() + static_cast<std::ptrdiff_t>(d + t.numel()),
                t.data<float>());
      d += static_cast<size_t>(t.numel());
      all.emplace(std::move(name), std::move(t));  // the lowest stage's copy wins
    }
  }
  return all;
}

}  // namespace paratrain::parallel::pipeline

#include <chrono>

#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/tensor/random.h"

namespace paratrain::parallel::pipeline {

StageCosts measured_costs(nn::GPT& model, int64_t micro_batch, comm::ProcessGroup* world) {
  const nn::GPTConfig& cfg = model.config();
  const int64_t B = micro_batch, T = cfg.block_size, C = cfg.n_embd;
  Generator gen(1234);
  std::vector<float> values(static_cast<size_t>(B * T * C));
  for (float& v : values) v = static_cast<float>(gen.normal());
  const Tensor hidden = Tensor::from_vector(values, {B, T, C});
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i % static_cast<size_t>(cfg.vocab_size));
  const Tensor tokens = Tensor::from_vector_i32(ids, {B, T});
  // The fastest of three forward + backward runs of `f`, in ms (the first run warms up).
  const auto time_ms = [](const std::function<Tensor()>& f) {
    double best = 1e300;
    for (int run = 0; run < 4; ++run) {
      const auto t0 = std::chrono::steady_clock::now();
      Tensor out = f();
      autograd::backward(ops::sum(out));
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (run > 0) best = std::min(best, ms);
    }
    return best;
  };
  std::vector<double> costs;
  for (auto& block : model.h) {
    costs.push_back(time_ms([&] {
      Tensor x = hidden.clone();
      x.set_requires_grad(true);
      return block->forward(x);
    }));
  }
  costs.push_back(time_ms([&] { return model.wte->forward_with_positions(tokens, *model.wpe); }));
  costs.push_back(time_ms([&] {
    Tensor x = hidden.clone();
    x.set_requires_grad(true);
    return model.wte->tied_loss(model.ln_f->forward(x), tokens);
  }));
  model.zero_grad();
  std::vector<float> all(costs.begin(), costs.end());
  if (world) world->broadcast(all.data(), all.size(), DType::F32, 0)->wait();
  StageCosts c;
  c.blocks.assign(all.begin(), all.end() - 2);
  c.first_extra = all[all.size() - 2];
  c.last_extra = all[all.size() - 1];
  return c;
}

}  // namespace paratrain::parallel::pipeline
