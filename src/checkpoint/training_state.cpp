#include "paratrain/checkpoint/training_state.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/error.h"

namespace paratrain::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kManifest = "manifest.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimFile = "optim.safetensors";
constexpr const char* kFormat = "paratrain-training-state";
constexpr const char* kShardFormat = "paratrain-optimizer-shard";
constexpr const char* kPartFormat = "paratrain-model-part";
constexpr const char* kOptimPrefix = "optim/";  // optimizer tensors inside a model part
constexpr const char* kModelPrefix = "model/";  // parameter pieces inside an optimizer shard (ZeRO 3)

bool has_prefix(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// InputError unless tp_index is one of tp_size tensor-parallel indices (`fn` names the caller).
void check_tp_index(const char* fn, int tp_index, int tp_size) {
  if (tp_size < 1 || tp_index < 0 || tp_index >= tp_size)
    PT_THROW(InputError, fn, ": tensor-parallel index ", tp_index, " of ", tp_size, " does not exist");
}

// InputError unless pp_index is one of pp_size pipeline stages (`fn` names the caller).
void check_pp_index(const char* fn, int pp_index, int pp_size) {
  if (pp_size < 1 || pp_index < 0 || pp_index >= pp_size)
    PT_THROW(InputError, fn, ": pipeline stage ", pp_index, " of ", pp_size, " does not exist");
}

// " on pipeline stage S" (pp > 1), for messages about one stage's tensors; "" without stages.
std::string stage_str(int stage, int pp) {
  return pp > 1 ? " on pipeline stage " + std::to_string(stage) : std::string();
}

// Writes a shard or part file D/step_<N>/<name> (atomically, as save_safetensors does) and
// returns what the manifest lists of it: name, size and CRC32.
template <typename Tensors>
ShardFileInfo write_listed_file(const std::string& dir, int64_t step, std::string name, const Tensors& tensors,
                                const Metadata& meta) {
  const fs::path path = fs::path(dir) / checkpoint_name(step) / name;
  save_safetensors(path.string(), tensors, meta);
  return {std::move(name), static_cast<uint64_t>(fs::file_size(path)), file_crc32(path.string())};
}

[[noreturn]] void damaged(const std::string& ckpt, const std::string& what) {
  PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", what, "; nothing was loaded");
}

nlohmann::json cuts_json(const std::map<std::string, TensorCut>& cuts) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, c] : cuts) j[name] = c.str();
  return j;
}

// The cuts of a JSON object name -> TensorCut text; InputError when malformed.
std::map<std::string, TensorCut> parse_cuts(const nlohmann::json& j) {
  if (!j.is_object()) PT_THROW(InputError, "not a JSON object");
  std::map<std::string, TensorCut> cuts;
  for (const auto& [name, c] : j.items()) {
    if (!c.is_string()) PT_THROW(InputError, "the cut of ", name, " is not a string");
    cuts[name] = TensorCut::parse(c.get<std::string>());
  }
  return cuts;
}

// The cut a tensor follows: a model tensor its own, an optimizer tensor "<param>.<state>" its
// parameter's; replicated when none is listed.
const TensorCut& cut_of(const std::map<std::string, TensorCut>& cuts, const std::string& key, bool optimizer) {
  static const TensorCut replicated;
  std::string name = key;
  if (optimizer) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos) return replicated;
    name = key.substr(0, dot);
  }
  const auto it = cuts.find(name);
  return it == cuts.end() ? replicated : it->second;
}

// A decimal integer metadata value; `fallback` when the key is absent, nullopt when malformed.
std::optional<int64_t> meta_int(const Metadata& md, const std::string& key, int64_t fallback) {
  const auto it = md.find(key);
  if (it == md.end()) return fallback;
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used != it->second.size()) return std::nullopt;
    return v;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// The whole tensors from the local tensors of each tensor-parallel index: locals[key][i] is
// index i's (undefined when it holds none). A cut tensor must be held by every index and is
// joined along its cut; a replicated one comes from the lowest index holding it. `holder(i)`
// names index i's file(s) in messages. The locals are released as they are joined.
std::map<std::string, Tensor> join_across_tp(const std::string& ckpt,
                                             std::map<std::string, std::vector<Tensor>>& locals,
                                             const std::map<std::string, TensorCut>& cuts, bool optimizer,
                                             const std::function<std::string(int)>& holder) {
  std::map<std::string, Tensor> out;
  for (auto& [key, parts] : locals) {
    const TensorCut& c = cut_of(cuts, key, optimizer);
    const int tp = static_cast<int>(parts.size());
    if (c.replicated()) {
      for (const Tensor& t : parts)
        if (t.defined()) {
          out[key] = t;
          break;
        }
    } else {
      for (int i = 0; i < tp; ++i)
        if (!parts[i].defined())
          damaged(ckpt, key + " (cut " + c.str() + " over " + std::to_string(tp) +
                            " tensor-parallel ranks) is missing from " + holder(i));
      try {
        out[key] = join_tensor(parts, c);
      } catch (const InputError& e) {
        damaged(ckpt, "cannot join " + key + " from its " + std::to_string(tp) + " tensor-parallel parts (" + e.what() +
                          ")");
      }
    }
    parts.clear();
  }
  return out;
}

// The whole model (or optimizer state) from each pipeline stage's whole tensors (stages[p]:
// stage p's, already joined across tp): their union. A name more than one stage holds (GPT's
// tied wte.weight on the first and last stage, and its optimizer state) is taken from the
// lowest stage holding it; every other stage's copy must equal it in shape, dtype and every
// bit, else the checkpoint is damaged (an inconsistent save), named with the tensor and the two
// stages. `what` prefixes the tensor's name in messages. The stages are released as united.
std::map<std::string, Tensor> unite_stages(const std::string& ckpt, std::vector<std::map<std::string, Tensor>>& stages,
                                           const std::string& what, bool check_copies = true) {
  if (stages.size() == 1) return std::move(stages[0]);
  std::map<std::string, Tensor> out;
  std::map<std::string, int> from;  // the stage each name was taken from
  for (size_t p = 0; p < stages.size(); ++p) {
    for (auto& [name, t] : stages[p]) {
      const auto it = out.find(name);
      if (it == out.end()) {
        out.emplace(name, std::move(t));
        from[name] = static_cast<int>(p);
        continue;
      }
      if (!check_copies) continue;  // the lowest stage's copy
      const Tensor& first = it->second;
      const std::string pair = " differs between pipeline stages " + std::to_string(from[name]) + " and " +
                               std::to_string(p) + " (";
      const std::string tail = "; every stage holding a tensor must hold the same copy)";
      if (first.shape() != t.shape())
        damaged(ckpt, what + name + pair + shape_str(first.shape()) + " against " + shape_str(t.shape()) + tail);
      if (first.dtype() != t.dtype())
        damaged(ckpt, what + name + pair + dtype_name(first.dtype()) + " against " + dtype_name(t.dtype()) + tail);
      const Tensor a = first.contiguous(), b = t.contiguous();
      if (std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) != 0) {
        const size_t esize = a.numel() > 0 ? a.nbytes() / static_cast<size_t>(a.numel()) : 1;
        const auto* pa = static_cast<const unsigned char*>(a.data_ptr());
        const auto* pb = static_cast<const unsigned char*>(b.data_ptr());
        size_t at = 0;
        while (at < a.nbytes() && pa[at] == pb[at]) ++at;
        damaged(ckpt, what + name + pair + "the bytes differ from flat element " + std::to_string(at / esize) + tail);
      }
    }
    stages[p].clear();
  }
  return out;
}

// step_<N> -> N; -1 when the name is not of that form.
int64_t parse_step_name(const std::string& name) {
  if (name.size() <= 5 || name.compare(0, 5, "step_") != 0) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
    if (v > (int64_t(1) << 50)) return -1;
  }
  return v;
}

// Step directories in D, newest first.
std::vector<std::pair<int64_t, fs::path>> step_dirs(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_directory(ec)) continue;
    const int64_t s = parse_step_name(e.path().filename().string());
    if (s >= 0) out.emplace_back(s, e.path());
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

std::string read_latest(const std::string& dir) {
  std::ifstream f(fs::path(dir) / "latest");
  if (!f) return "";
  std::string name;
  std::getline(f, name);
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.pop_back();
  if (parse_step_name(name) < 0)
    PT_THROW(InputError, "checkpoint directory ", dir, ": 'latest' holds '", name, "', not a step_<N> name");
  return name;
}

nlohmann::json read_manifest(const std::string& ckpt) {
  const fs::path mp = fs::path(ckpt) / kManifest;
  std::error_code ec;
  if (!fs::exists(mp, ec))
    PT_THROW(InputError, "checkpoint ", ckpt, " is incomplete: it has no ", kManifest,
             " (a save was interrupted or the file was removed); nothing was loaded");
  std::ifstream f(mp, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(ss.str());
  } catch (const std::exception& e) {
    PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", kManifest, " is not valid JSON (", e.what(),
             "); nothing was loaded");
  }
  auto bad = [&](const std::string& what) {
    PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", kManifest, " ", what, "; nothing was loaded");
  };
  if (!m.is_object()) bad("is not a JSON object");
  if (m.value("format", "") != kFormat) bad(std::string("has no \"format\": \"") + kFormat + "\"");
  if (!m.contains("step") || !m["step"].is_number_integer()) bad("has no integer \"step\"");
  if (!m.contains("files") || !m["files"].is_object()) bad("has no \"files\" object");
  // The model is model.safetensors, or one part per tensor-parallel index listed in
  // "model_parts"; the optimizer state optim.safetensors, one shard per rank listed in
  // "optimizer_shards", or (with model parts and no shards) inside the parts.
  std::vector<std::string> required;
  int64_t tp = 1;
  if (m.contains("tp_size")) {
    if (!m["tp_size"].is_number_integer() || m["tp_size"].get<int64_t>() < 1) bad("has a malformed \"tp_size\"");
    tp = m["tp_size"].get<int64_t>();
  }
  int64_t pp = 1;
  if (m.contains("pp_size")) {
    if (!m["pp_size"].is_number_integer() || m["pp_size"].get<int64_t>() < 1) bad("has a malformed \"pp_size\"");
    pp = m["pp_size"].get<int64_t>();
  }
  if (m.contains("cuts")) {
    try {
      parse_cuts(m["cuts"]);
    } catch (const std::exception& e) {
      bad(std::string("has malformed \"cuts\" (") + e.what() + ")");
    }
  }
  if (m.contains("model_metadata")) {
    if (!m["model_metadata"].is_object()) bad("has a malformed \"model_metadata\"");
    for (const auto& [k, v] : m["model_metadata"].items())
      if (!v.is_string()) bad("has a malformed \"model_metadata\"");
  }
  const bool parted = m.contains("model_parts");
  // With "model_in_shards" (ZeRO 3) the model is in the optimizer shards: no model file.
  bool in_shards = false;
  if (m.contains("model_in_shards")) {
    if (!m["model_in_shards"].is_boolean()) bad("has a malformed \"model_in_shards\"");
    in_shards = m["model_in_shards"].get<bool>();
  }
  if (in_shards && parted) bad("says \"model_in_shards\" and lists \"model_parts\" too");
  if (in_shards && !m.contains("optimizer_shards")) bad("says \"model_in_shards\" but lists no \"optimizer_shards\"");
  if (parted) {
    if (!m["model_parts"].is_array() || m["model_parts"].empty()) bad("has a malformed \"model_parts\"");
    if (static_cast<int64_t>(m["model_parts"].size()) != tp * pp)
      bad("lists " + std::to_string(m["model_parts"].size()) + " model parts for a tp_size of " + std::to_string(tp) +
          (pp > 1 ? " x a pp_size of " + std::to_string(pp) + " = " + std::to_string(tp * pp) : std::string()));
    for (const auto& f : m["model_parts"]) {
      if (!f.is_string()) bad("has a malformed \"model_parts\"");
      required.push_back(f.get<std::string>());
    }
  } else if (!in_shards) {
    required.push_back(kModelFile);
  }
  if (m.contains("optimizer_shards")) {
    if (!m["optimizer_shards"].is_array() || m["optimizer_shards"].empty()) bad("has a malformed \"optimizer_shards\"");
    for (const auto& f : m["optimizer_shards"]) {
      if (!f.is_string()) bad("has a malformed \"optimizer_shards\"");
      required.push_back(f.get<std::string>());
    }
  } else if (!parted) {
    required.push_back(kOptimFile);
  }
  for (const std::string& f : required) {
    if (!m["files"].contains(f)) bad(std::string("does not list ") + f);
    const auto& e = m["files"][f];
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("crc32") ||
        !e["crc32"].is_string())
      bad(std::string("entry for ") + f + " lacks \"bytes\" / \"crc32\"");
  }
  return m;
}

// The local tensors of each tensor-parallel index of one pipeline stage (state[i]: index i's)
// made whole: as they are without tensor parallelism, else joined across tp along the cuts
// (join_across_tp; an optimizer tensor "<param>.<state>" follows its parameter's cut).
// `stage` names the stage in messages ("" without pipeline parallelism).
std::map<std::string, Tensor> join_shard_locals(const std::string& ckpt,
                                                std::vector<std::map<std::string, Tensor>>& state,
                                                const std::map<std::string, TensorCut>& cuts, bool optimizer,
                                                const std::string& stage) {
  const int tp = static_cast<int>(state.size());
  if (tp == 1) return std::move(state[0]);
  std::map<std::string, std::vector<Tensor>> locals;
  for (int i = 0; i < tp; ++i)
    for (auto& [key, t] : state[static_cast<size_t>(i)]) {
      auto& v = locals[key];
      v.resize(static_cast<size_t>(tp));
      v[static_cast<size_t>(i)] = std::move(t);
    }
  state.clear();
  return join_across_tp(ckpt, locals, cuts, optimizer, [&stage](int i) {
    return "the optimizer shards of tensor-parallel index " + std::to_string(i) + stage;
  });
}

// What the shards of a checkpoint hold, whole: the optimizer state and, with the model in the
// shards (ZeRO 3), the model.
struct ShardState {
  std::map<std::string, Tensor> model, optimizer;
};

// The whole state from the shards listed in the manifest: every "<param>.<state>" tensor, and
// with `model_in_shards` every "model/<param>" tensor, gets its parameter's shape, and its
// pieces must cover each element exactly once. Under tensor parallelism (tp > 1) the pieces are
// ranges of each tp index's local tensors: each index's locals are assembled that way from its
// ranks' shards, then joined across tp along the cuts. Under pipeline parallelism (pp > 1) each
// shard says its stage: every stage's tensors are assembled (and joined across tp) from that
// stage's shards alone, then the stages are united (unite_stages: a tensor held by several
// stages, the tied wte.weight, from the lowest, the other copies checked bit for bit). With
// `model_in_shards` every piece of a shard must have its "model/<param>" tensor; without it a
// shard must hold none.
ShardState assemble_shards(const std::string& ckpt, const std::vector<ShardFileInfo>& files, int tp, int pp,
                           const std::map<std::string, TensorCut>& cuts, bool model_in_shards) {
  struct Whole {
    Tensor t;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of the pieces seen
    std::string first_file;
  };
  // Per (stage, tp index) at out[stage * tp + tp index], keyed by the name in the shard file
  // ("<param>.<state>" or "model/<param>").
  std::vector<std::map<std::string, Whole>> out(static_cast<size_t>(tp * pp));
  std::vector<int> shards_of_stage(static_cast<size_t>(pp), 0);
  const size_t model_prefix = std::strlen(kModelPrefix);
  const int world = static_cast<int>(files.size());
  for (int r = 0; r < world; ++r) {
    const ShardFileInfo& f = files[r];
    auto bad = [&](const std::string& what) {
      PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", f.name, " ", what, "; nothing was loaded");
    };
    if (f.name != optimizer_shard_file_name(r, world))
      PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", kManifest, " lists ", f.name, " as shard ", r, " of ",
               world, " (expected ", optimizer_shard_file_name(r, world), "); nothing was loaded");
    SafetensorsFile file = read_safetensors((fs::path(ckpt) / f.name).string());
    auto it = file.metadata.find("pieces");
    if (file.metadata.count("format") == 0 || file.metadata.at("format") != kShardFormat || it == file.metadata.end())
      bad(std::string("is not an optimizer shard (no \"format\": \"") + kShardFormat + "\" and \"pieces\" metadata)");
    if (file.metadata.count("rank") == 0 || file.metadata.at("rank") != std::to_string(r) ||
        file.metadata.count("world_size") == 0 || file.metadata.at("world_size") != std::to_string(world))
      bad("does not say it is shard " + std::to_string(r) + " of " + std::to_string(world));
    const std::optional<int64_t> shard_tp = meta_int(file.metadata, "tp_size", 1),
                                 shard_tp_index = meta_int(file.metadata, "tp_index", 0);
    if (!shard_tp || *shard_tp != tp)
      bad("does not say it belongs to a tensor-parallel size of " + std::to_string(tp) + " (its tp_size: " +
          (file.metadata.count("tp_size") ? file.metadata.at("tp_size") : std::string("none")) + ")");
    if (!shard_tp_index || *shard_tp_index < 0 || *shard_tp_index >= tp)
      bad("has a malformed \"tp_index\" (not in 0.." + std::to_string(tp - 1) + ")");
    const std::optional<int64_t> shard_pp = meta_int(file.metadata, "pp_size", 1),
                                 shard_pp_index = meta_int(file.metadata, "pp_index", 0);
    if (!shard_pp || *shard_pp != pp)
      bad("does not say it belongs to a pipeline of " + std::to_string(pp) + " stages (its pp_size: " +
          (file.metadata.count("pp_size") ? file.metadata.at("pp_size") : std::string("none")) + ")");
    if (!shard_pp_index || *shard_pp_index < 0 || *shard_pp_index >= pp)
      bad("has a malformed \"pp_index\" (not in 0.." + std::to_string(pp - 1) + ")");
    ++shards_of_stage[static_cast<size_t>(*shard_pp_index)];
    std::map<std::string, Whole>& local = out[static_cast<size_t>(*shard_pp_index * tp + *shard_tp_index)];
    nlohmann::json pieces;
    try {
      pieces = nlohmann::json::parse(it->second);
    } catch (const std::exception&) {
      bad("has malformed \"pieces\" metadata (not JSON)");
    }
    if (!pieces.is_array()) bad("has malformed \"pieces\" metadata (not an array)");
    std::map<std::string, const nlohmann::json*> by_name;
    for (const auto& p : pieces) {
      if (!p.is_object() || !p.contains("name") || !p["name"].is_string() || !p.contains("begin") ||
          !p["begin"].is_number_integer() || !p.contains("numel") || !p["numel"].is_number_integer() ||
          !p.contains("shape") || !p["shape"].is_array())
        bad("has a malformed piece in its \"pieces\" metadata");
      by_name[p["name"].get<std::string>()] = &p;
    }
    if (model_in_shards)
      for (const auto& [name, p] : by_name)
        if (file.tensors.count(kModelPrefix + name) == 0)
          bad(std::string("holds no ") + kModelPrefix + name + " for its piece of " + name + " (elements " +
              std::to_string((*p)["begin"].get<int64_t>()) + ".." +
              std::to_string((*p)["begin"].get<int64_t>() + (*p)["numel"].get<int64_t>()) +
              "), though the manifest says the model is in the shards");
    for (auto& [key, t] : file.tensors) {
      // The piece a tensor belongs to: "model/<param>" is the parameter's, "<param>.<state>"
      // its optimizer state's.
      const bool is_model = has_prefix(key, kModelPrefix);
      if (is_model && !model_in_shards)
        bad("holds the model tensor " + key + ", though the manifest does not say the model is in the shards");
      const auto dot = key.rfind('.');
      auto pit = is_model                   ? by_name.find(key.substr(model_prefix))
                 : dot == std::string::npos ? by_name.end()
                                            : by_name.find(key.substr(0, dot));
      if (pit == by_name.end()) bad("holds tensor " + key + ", which belongs to no piece in its metadata");
      const nlohmann::json& p = *pit->second;
      Shape shape;
      try {
        shape = p["shape"].get<Shape>();
      } catch (const std::exception&) {
        bad("has a malformed shape for " + key);
      }
      const int64_t total = shape_numel(shape), begin = p["begin"].get<int64_t>(), n = p["numel"].get<int64_t>();
      if (begin < 0 || n < 0 || begin + n > total || t.numel() != n || t.dtype() != DType::F32)
        bad("holds " + key + " [" + shape_str(t.shape()) + "] for elements " + std::to_string(begin) + ".." +
            std::to_string(begin + n) + " of a parameter of " + std::to_string(total) + " elements");
      Whole& w = local[key];
      if (!w.t.defined()) {
        w.t = Tensor::zeros(shape);
        w.first_file = f.name;
      } else if (w.t.shape() != shape) {
        bad("gives " + key + " the shape [" + shape_str(shape) + "], " + w.first_file + " [" +
            shape_str(w.t.shape()) + "]");
      }
      if (n > 0) std::memcpy(w.t.data<float>() + begin, t.data<float>(), static_cast<size_t>(n) * sizeof(float));
      w.ranges.emplace_back(begin, begin + n);
    }
  }
  for (int p = 0; p < pp; ++p)
    if (shards_of_stage[static_cast<size_t>(p)] == 0)
      damaged(ckpt, "no optimizer shard is of pipeline stage " + std::to_string(p) + " of " + std::to_string(pp) +
                        " (every stage's ranks write their shards)");
  // Per (stage, tp index), as `out`.
  std::vector<std::map<std::string, Tensor>> model(static_cast<size_t>(tp * pp)),
      optimizer(static_cast<size_t>(tp * pp));
  for (int j = 0; j < tp * pp; ++j)
    for (auto& [key, w] : out[static_cast<size_t>(j)]) {
      const int i = j % tp, stage = j / tp;
      // Under tensor (pipeline) parallelism the tensor is a local one (a stage's): say whose.
      const std::string of = key + stage_str(stage, pp) +
                             (tp > 1 ? (pp > 1 ? ", tensor-parallel index " : " on tensor-parallel index ") +
                                           std::to_string(i)
                                     : std::string());
      std::sort(w.ranges.begin(), w.ranges.end());
      int64_t covered = 0;
      for (const auto& [b, e] : w.ranges) {
        if (b != covered)
          PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: the optimizer shards ",
                   b > covered ? "leave out" : "overlap at", " elements ", std::min(b, covered), "..",
                   std::max(b, covered), " of ", of, "; nothing was loaded");
        covered = e;
      }
      if (covered != w.t.numel())
        PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: the optimizer shards leave out elements ", covered,
                 "..", w.t.numel(), " of ", of, "; nothing was loaded");
      if (has_prefix(key, kModelPrefix))
        model[static_cast<size_t>(j)][key.substr(model_prefix)] = std::move(w.t);
      else
        optimizer[static_cast<size_t>(j)][key] = std::move(w.t);
    }
  out.clear();
  // Each stage's locals joined across tp, then the stages united.
  std::vector<std::map<std::string, Tensor>> model_stages(static_cast<size_t>(pp)),
      optim_stages(static_cast<size_t>(pp));
  for (int p = 0; p < pp; ++p) {
    const auto slice = [&](std::vector<std::map<std::string, Tensor>>& all) {
      std::vector<std::map<std::string, Tensor>> v;
      for (int i = 0; i < tp; ++i) v.push_back(std::move(all[static_cast<size_t>(p * tp + i)]));
      return v;
    };
    auto m = slice(model), o = slice(optimizer);
    model_stages[static_cast<size_t>(p)] = join_shard_locals(ckpt, m, cuts, /*optimizer=*/false, stage_str(p, pp));
    optim_stages[static_cast<size_t>(p)] = join_shard_locals(ckpt, o, cuts, /*optimizer=*/true, stage_str(p, pp));
  }
  ShardState whole;
  whole.model = unite_stages(ckpt, model_stages, std::string(kModelPrefix));
  // The tied head's optimizer state from the lowest stage: with ZeRO the two stages shard it
  // differently, so their data-parallel sums may round apart in the last bits (the trainer
  // keeps the parameters themselves identical).
  whole.optimizer = unite_stages(ckpt, optim_stages, "the optimizer tensor ", false);
  return whole;
}

// The whole model (and, when `optimizer` is set, optimizer state) from the tensor-parallel /
// pipeline parts listed in the manifest (pp-major: files[stage * tp + tp index]): each part's
// metadata must agree with the manifest, then every tensor of a stage is joined across the
// stage's tp parts, and the stages are united (unite_stages: a tensor several stages hold from
// the lowest, the other copies checked bit for bit).
void load_model_parts(const std::string& ckpt, const std::vector<ShardFileInfo>& files, int tp, int pp,
                      const std::map<std::string, TensorCut>& cuts, std::map<std::string, Tensor>& model,
                      std::map<std::string, Tensor>* optimizer) {
  const size_t prefix = std::strlen(kOptimPrefix);
  std::vector<std::map<std::string, Tensor>> model_stages(static_cast<size_t>(pp)),
      optim_stages(static_cast<size_t>(pp));
  for (int stage = 0; stage < pp; ++stage) {
    std::map<std::string, std::vector<Tensor>> model_locals, optim_locals;
    for (int i = 0; i < tp; ++i) {
      const ShardFileInfo& f = files[static_cast<size_t>(stage * tp + i)];
      auto bad = [&](const std::string& what) { damaged(ckpt, f.name + " " + what); };
      const std::string expected = model_part_file_name(i, tp, stage, pp);
      if (f.name != expected)
        damaged(ckpt, std::string(kManifest) + " lists " + f.name + " as model part " +
                          (pp > 1 ? "(stage " + std::to_string(stage) + ", tp index " + std::to_string(i) + ")"
                                  : std::to_string(i)) +
                          " of " + (pp > 1 ? std::to_string(pp) + " x " : std::string()) + std::to_string(tp) +
                          " (expected " + expected + ")");
      SafetensorsFile file = read_safetensors((fs::path(ckpt) / f.name).string());
      const Metadata& md = file.metadata;
      if (md.count("format") == 0 || md.at("format") != kPartFormat)
        bad(std::string("is not a model part (no \"format\": \"") + kPartFormat + "\" metadata)");
      if (md.count("tp_index") == 0 || md.at("tp_index") != std::to_string(i) || md.count("tp_size") == 0 ||
          md.at("tp_size") != std::to_string(tp))
        bad("does not say it is tensor-parallel part " + std::to_string(i) + " of " + std::to_string(tp));
      // Parts written before pipeline parallelism have no pp keys: stage 0 of 1.
      const std::optional<int64_t> part_pp = meta_int(md, "pp_size", 1), part_pp_index = meta_int(md, "pp_index", 0);
      if (!part_pp || *part_pp != pp || !part_pp_index || *part_pp_index != stage)
        bad("does not say it is pipeline stage " + std::to_string(stage) + " of " + std::to_string(pp) +
            " (its pp_index " + (md.count("pp_index") ? md.at("pp_index") : std::string("none")) + ", pp_size " +
            (md.count("pp_size") ? md.at("pp_size") : std::string("none")) + ")");
      std::map<std::string, TensorCut> part_cuts;
      try {
        part_cuts = parse_cuts(nlohmann::json::parse(md.count("cuts") ? md.at("cuts") : std::string("null")));
      } catch (const std::exception& e) {
        bad(std::string("has malformed \"cuts\" metadata (") + e.what() + ")");
      }
      // Without stages every part records all the cuts; a stage's part those of the tensors it
      // holds (the manifest's cuts cover every stage).
      std::map<std::string, TensorCut> want = cuts;
      if (pp > 1)
        std::erase_if(want, [&](const auto& kv) { return file.tensors.count(kv.first) == 0; });
      if (part_cuts != want)
        bad("records the cuts " + cuts_json(part_cuts).dump() + ", the manifest " + cuts_json(want).dump() +
            (pp > 1 ? " for the tensors it holds" : ""));
      for (auto& [name, t] : file.tensors) {
        const bool is_optim = name.compare(0, prefix, kOptimPrefix) == 0;
        if (is_optim && !optimizer)
          bad("holds the optimizer tensor " + name + ", but the checkpoint's optimizer state is in its shards");
        auto& v = (is_optim ? optim_locals : model_locals)[is_optim ? name.substr(prefix) : name];
        v.resize(static_cast<size_t>(tp));
        v[static_cast<size_t>(i)] = std::move(t);
      }
    }
    const auto holder = [&](int i) { return files[static_cast<size_t>(stage * tp + i)].name; };
    model_stages[static_cast<size_t>(stage)] = join_across_tp(ckpt, model_locals, cuts, /*optimizer=*/false, holder);
    if (optimizer)
      optim_stages[static_cast<size_t>(stage)] = join_across_tp(ckpt, optim_locals, cuts, /*optimizer=*/true, holder);
  }
  model = unite_stages(ckpt, model_stages, "");
  if (optimizer) *optimizer = unite_stages(ckpt, optim_stages, "the optimizer tensor ");
}

std::string hex_u64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string checkpoint_name(int64_t step) { return "step_" + std::to_string(step); }

std::string file_crc32(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) PT_THROW(IoError, "cannot read ", path);
  uLong crc = crc32(0L, Z_NULL, 0);
  std::vector<char> buf(1 << 20);
  while (f) {
    f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = f.gcount();
    if (n > 0) crc = crc32(crc, reinterpret_cast<const Bytef*>(buf.data()), static_cast<uInt>(n));
  }
  char out[9];
  std::snprintf(out, sizeof out, "%08lx", static_cast<unsigned long>(crc));
  return out;
}

bool prepare_checkpoint(const std::string& dir, int64_t step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) PT_THROW(IoError, "cannot create checkpoint directory ", dir, ": ", ec.message());
  const std::string name = checkpoint_name(step);
  const fs::path ckpt = fs::path(dir) / name;
  std::string latest;
  try {
    latest = read_latest(dir);
  } catch (const InputError&) {
    latest.clear();  // an unreadable pointer is replaced by the save
  }
  if (latest == name && fs::exists(ckpt / kManifest, ec)) return false;  // already saved
  fs::remove_all(ckpt, ec);  // a leftover from an interrupted save
  fs::create_directories(ckpt, ec);
  if (ec) PT_THROW(IoError, "cannot create checkpoint directory ", ckpt.string(), ": ", ec.message());
  return true;
}

std::string optimizer_shard_file_name(int rank, int world_size) {
  return "optim.rank" + std::to_string(rank) + "-of-" + std::to_string(world_size) + ".safetensors";
}

ShardFileInfo write_optimizer_shard(const std::string& dir, int64_t step, int rank, int world_size,
                                    const OptimizerShard& shard, int64_t optimizer_steps, int tp_index, int tp_size,
                                    int pp_index, int pp_size) {
  check_tp_index("write_optimizer_shard", tp_index, tp_size);
  check_pp_index("write_optimizer_shard", pp_index, pp_size);
  for (const auto& [key, t] : shard.tensors)
    if (has_prefix(key, kModelPrefix))
      PT_THROW(InputError, "write_optimizer_shard: the state tensor ", key, " has the prefix ", kModelPrefix,
               " reserved for the parameters");
  // The optimizer state under its names, then the parameters' pieces (ZeRO 3) under "model/".
  NamedTensors tensors(shard.tensors.begin(), shard.tensors.end());
  if (!shard.params.empty()) {
    std::map<std::string, const OptimizerShard::Piece*> by_name;
    for (const auto& p : shard.pieces) by_name[p.name] = &p;
    for (const auto& [name, t] : shard.params) {
      const auto it = by_name.find(name);
      if (it == by_name.end())
        PT_THROW(InputError, "write_optimizer_shard: the parameter piece ", name, " belongs to no piece of the shard");
      if (t.dim() != 1 || t.numel() != it->second->numel || t.dtype() != DType::F32)
        PT_THROW(InputError, "write_optimizer_shard: the parameter piece ", name, " is ", dtype_name(t.dtype()), " [",
                 shape_str(t.shape()), "], its piece 1-D f32 of ", it->second->numel, " elements");
      tensors.emplace_back(kModelPrefix + name, t);
    }
    for (const auto& p : shard.pieces)
      if (shard.params.count(p.name) == 0)
        PT_THROW(InputError, "write_optimizer_shard: the piece ", p.name,
                 " has no parameter tensor (params holds one for every piece, or none)");
  }
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& p : shard.pieces)
    pieces.push_back({{"name", p.name}, {"begin", p.begin}, {"numel", p.numel}, {"shape", p.shape}});
  Metadata meta = {{"format", kShardFormat},
                   {"rank", std::to_string(rank)},
                   {"world_size", std::to_string(world_size)},
                   {"optimizer_steps", std::to_string(optimizer_steps)},
                   {"pieces", pieces.dump()}};
  if (tp_size != 1) {  // without tensor parallelism the metadata stays as it always was
    meta["tp_index"] = std::to_string(tp_index);
    meta["tp_size"] = std::to_string(tp_size);
  }
  if (pp_size != 1) {  // nor without pipeline parallelism
    meta["pp_index"] = std::to_string(pp_index);
    meta["pp_size"] = std::to_string(pp_size);
  }
  return write_listed_file(dir, step, optimizer_shard_file_name(rank, world_size), tensors, meta);
}

std::string model_part_file_name(int tp_index, int tp_size, int pp_index, int pp_size) {
  const std::string tp = "tp" + std::to_string(tp_index) + "-of-" + std::to_string(tp_size);
  if (pp_size == 1) return "model." + tp + ".safetensors";  // the name from before pipeline parallelism
  return "model.pp" + std::to_string(pp_index) + "-of-" + std::to_string(pp_size) + "." + tp + ".safetensors";
}

ShardFileInfo write_model_part(const std::string& dir, int64_t step, int tp_index, int tp_size,
                               const std::map<std::string, Tensor>& local_model,
                               const std::map<std::string, Tensor>& local_optimizer,
                               const std::map<std::string, TensorCut>& cuts, int64_t optimizer_steps, int pp_index,
                               int pp_size) {
  check_tp_index("write_model_part", tp_index, tp_size);
  check_pp_index("write_model_part", pp_index, pp_size);
  // A pipeline stage holds some of the model's tensors: it records the cuts of those.
  std::map<std::string, TensorCut> part_cuts;
  for (const auto& [name, c] : cuts) {
    const auto it = local_model.find(name);
    if (it == local_model.end() && pp_size > 1) continue;  // another stage's tensor
    if (it == local_model.end())
      PT_THROW(InputError, "write_model_part: the cut ", c.str(), " of ", name, " names no local model tensor");
    part_cuts[name] = c;
    if (!c.replicated() && c.dim >= it->second.dim())
      PT_THROW(InputError, "write_model_part: the cut ", c.str(), " of ", name, " names a dimension the local tensor ",
               shape_str(it->second.shape()), " does not have");
  }
  NamedTensors tensors;
  for (const auto& [name, t] : local_model) {
    if (name.rfind(kOptimPrefix, 0) == 0)
      PT_THROW(InputError, "write_model_part: the model tensor ", name, " has the prefix ", kOptimPrefix,
               " reserved for the optimizer state");
    tensors.emplace_back(name, t);
  }
  for (const auto& [name, t] : local_optimizer) tensors.emplace_back(kOptimPrefix + name, t);
  Metadata meta = {{"format", kPartFormat},
                   {"tp_index", std::to_string(tp_index)},
                   {"tp_size", std::to_string(tp_size)},
                   {"cuts", cuts_json(part_cuts).dump()},
                   {"optimizer_steps", std::to_string(optimizer_steps)}};
  if (pp_size != 1) {  // without pipeline parallelism the metadata stays as it always was
    meta["pp_index"] = std::to_string(pp_index);
    meta["pp_size"] = std::to_string(pp_size);
  }
  return write_listed_file(dir, step, model_part_file_name(tp_index, tp_size, pp_index, pp_size), tensors, meta);
}

std::string save_training_state(const std::string& dir, const TrainingState& s, int keep_last,
                                const std::function<void()>& before_manifest) {
  std::error_code ec;
  const std::string name = checkpoint_name(s.step);
  const fs::path ckpt = fs::path(dir) / name;
  const bool sharded = !s.optimizer_shards.empty();
  const bool parted = !s.model_parts.empty();  // the model (and optimizer state) in tensor-parallel parts
  const bool in_shards = s.model_in_shards;      // the model in the optimizer shards (ZeRO 3)
  if (in_shards && !sharded)
    PT_THROW(InputError, "save_training_state: model_in_shards is set but optimizer_shards is empty (the shards "
                         "hold the model)");
  if (in_shards && parted)
    PT_THROW(InputError, "save_training_state: model_in_shards and model_parts are both given (with the model in "
                         "the shards, under tensor parallelism too, no model parts are written)");
  if (s.pp_size < 1) PT_THROW(InputError, "save_training_state: pp_size ", s.pp_size, " (at least 1)");
  if (!sharded && !parted && !prepare_checkpoint(dir, s.step)) return ckpt.string();  // already saved
  if (parted) {
    const int n = s.tp_size * s.pp_size;
    if (static_cast<int>(s.model_parts.size()) != n) {
      if (s.pp_size == 1)
        PT_THROW(InputError, "save_training_state: ", s.model_parts.size(), " model parts for a tp_size of ",
                 s.tp_size);
      PT_THROW(InputError, "save_training_state: ", s.model_parts.size(), " model parts for a tp_size of ", s.tp_size,
               " x a pp_size of ", s.pp_size, " = ", n);
    }
    for (int i = 0; i < n; ++i) {
      const ShardFileInfo& f = s.model_parts[static_cast<size_t>(i)];
      const std::string want = model_part_file_name(i % s.tp_size, s.tp_size, i / s.tp_size, s.pp_size);
      if (f.name != want)
        PT_THROW(InputError, "save_training_state: model part ", i, " of ", n, " is ", f.name, ", expected ", want,
                 s.pp_size > 1 ? " (the parts are pp-major: index pp_index x tp_size + tp_index)" : "");
      if (!fs::exists(ckpt / f.name, ec))
        PT_THROW(InputError, "save_training_state: the model part ", (ckpt / f.name).string(), " is missing (every ",
                 s.pp_size > 1 ? "(pipeline stage, tensor-parallel index)" : "tensor-parallel index",
                 " writes its part before rank 0 writes the manifest)");
    }
  }
  if (sharded)
    for (const auto& f : s.optimizer_shards)
      if (!fs::exists(ckpt / f.name, ec))
        PT_THROW(InputError, "save_training_state: the shard ", (ckpt / f.name).string(),
                 " is missing (every rank writes its shard before rank 0 writes the manifest)");

  const std::string model_path = (ckpt / kModelFile).string();
  const std::string optim_path = (ckpt / kOptimFile).string();
  if (!parted && !in_shards) save_safetensors(model_path, s.model, s.model_metadata);
  if (!sharded && !parted)
    save_safetensors(optim_path, s.optimizer, Metadata{{"optimizer_steps", std::to_string(s.optimizer_steps)}});

  nlohmann::json m;
  m["format"] = kFormat;
  m["version"] = 1;
  m["step"] = s.step;
  m["world_size"] = s.world_size;
  m["optimizer_steps"] = s.optimizer_steps;
  m["loss_scale"] = s.loss_scale;
  m["loss_scale_growth_tracker"] = s.loss_scale_growth_tracker;
  if (s.rng) {
    nlohmann::json r = nlohmann::json::array();
    for (uint64_t w : *s.rng) r.push_back(hex_u64(w));
    m["rng"] = r;
  } else {
    m["rng"] = nullptr;
  }
  m["config"] = s.config;
  m["zero_stage"] = s.zero_stage;
  if (parted || s.tp_size != 1) {
    m["tp_size"] = s.tp_size;
    m["cuts"] = cuts_json(s.cuts);
  }
  if (s.pp_size != 1) m["pp_size"] = s.pp_size;
  m["files"] = nlohmann::json::object();
  if (parted) {
    m["model_parts"] = nlohmann::json::array();
    for (const auto& f : s.model_parts) {
      m["model_parts"].push_back(f.name);
      m["files"][f.name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
    }
  } else if (in_shards) {
    m["model_in_shards"] = true;
  } else {
    m["files"][kModelFile] = {{"bytes", static_cast<uint64_t>(fs::file_size(model_path))},
                              {"crc32", file_crc32(model_path)}};
  }
  if (parted || in_shards) m["model_metadata"] = s.model_metadata;
  if (sharded) {
    m["optimizer_shards"] = nlohmann::json::array();
    for (const auto& f : s.optimizer_shards) {
      m["optimizer_shards"].push_back(f.name);
      m["files"][f.name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
    }
  } else if (!parted) {
    m["files"][kOptimFile] = {{"bytes", static_cast<uint64_t>(fs::file_size(optim_path))},
                              {"crc32", file_crc32(optim_path)}};
  }
  if (before_manifest) before_manifest();
  write_file_atomic((ckpt / kManifest).string(), m.dump(2) + "\n");
  write_file_atomic((fs::path(dir) / "latest").string(), name + "\n");

  // Keep the newest keep_last complete checkpoints; older step_* (complete or not) go.
  int kept = 0;
  int64_t oldest_kept = s.step;
  for (const auto& [step, p] : step_dirs(dir)) {
    if (step > s.step) continue;  // newer leftovers (another run's) are not ours to judge
    if (kept < keep_last && fs::exists(p / kManifest, ec)) {
      ++kept;
      oldest_kept = step;
    }
  }
  for (const auto& [step, p] : step_dirs(dir))
    if (step < oldest_kept) fs::remove_all(p, ec);
  return ckpt.string();
}

ResumePoint find_resume_point(const std::string& dir) {
  ResumePoint rp;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return rp;
  const std::string latest = read_latest(dir);
  const auto dirs = step_dirs(dir);
  const auto complete = [&](const fs::path& p) { return fs::exists(p / kManifest, ec); };
  if (!latest.empty()) {
    const fs::path p = fs::path(dir) / latest;
    if (!fs::is_directory(p, ec))
      PT_THROW(InputError, "checkpoint directory ", dir, ": 'latest' names ", latest, ", which does not exist");
    rp.checkpoint = p.string();
    // A kill between a manifest and the `latest` update leaves a newer complete checkpoint.
    for (const auto& [step, q] : dirs)
      if (step > parse_step_name(latest) && complete(q)) {
        rp.checkpoint = q.string();
        break;
      }
  } else {
    for (const auto& [step, q] : dirs)
      if (complete(q)) {
        rp.checkpoint = q.string();
        break;
      }
  }
  for (const auto& [step, q] : dirs)
    if (!complete(q) && !(rp.checkpoint && fs::path(*rp.checkpoint).filename() == q.filename()))
      rp.ignored.push_back(q.string());
  return rp;
}

std::optional<std::string> find_latest_checkpoint(const std::string& dir) { return find_resume_point(dir).checkpoint; }

void verify_training_state(const std::string& ckpt) {
  const nlohmann::json m = read_manifest(ckpt);
  for (const auto& [fname, e] : m["files"].items()) {
    const fs::path p = fs::path(ckpt) / fname;
    std::error_code ec;
    if (!fs::exists(p, ec))
      PT_THROW(InputError, "checkpoint ", ckpt, " is incomplete: ", fname, " is missing; nothing was loaded");
    const uint64_t bytes = fs::file_size(p, ec);
    if (bytes != e["bytes"].get<uint64_t>())
      PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", fname, " has ", bytes, " bytes, the manifest says ",
               e["bytes"].get<uint64_t>(), "; nothing was loaded");
    const std::string crc = file_crc32(p.string());
    if (crc != e["crc32"].get<std::string>())
      PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", fname, " fails its checksum (CRC32 ", crc,
               ", the manifest says ", e["crc32"].get<std::string>(), "); nothing was loaded");
  }
}

TrainingState load_training_state(const std::string& ckpt) {
  verify_training_state(ckpt);
  const nlohmann::json m = read_manifest(ckpt);
  TrainingState s;
  try {
    s.step = m.at("step").get<int64_t>();
    s.world_size = m.value("world_size", 1);
    s.optimizer_steps = m.value("optimizer_steps", s.step);
    s.loss_scale = m.value("loss_scale", 1.0);
    s.loss_scale_growth_tracker = m.value("loss_scale_growth_tracker", int64_t{0});
    s.config = m.value("config", nlohmann::json::object());
    if (m.contains("rng") && m["rng"].is_array()) {
      if (m["rng"].size() != 4) PT_THROW(InputError, "rng must hold 4 words");
      std::array<uint64_t, 4> r{};
      for (size_t i = 0; i < 4; ++i) r[i] = std::stoull(m["rng"][i].get<std::string>(), nullptr, 16);
      s.rng = r;
    }
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: ", kManifest, ": ", e.what(), "; nothing was loaded");
  }
  s.zero_stage = m.value("zero_stage", 0);
  // read_manifest() has checked the shapes of these fields.
  s.tp_size = m.value("tp_size", 1);
  s.pp_size = m.value("pp_size", 1);
  if (m.contains("cuts")) s.cuts = parse_cuts(m["cuts"]);
  const auto listed = [&](const std::string& key) {
    std::vector<ShardFileInfo> out;
    for (const auto& f : m[key])
      out.push_back({f.get<std::string>(), m["files"][f.get<std::string>()]["bytes"].get<uint64_t>(),
                     m["files"][f.get<std::string>()]["crc32"].get<std::string>()});
    return out;
  };
  const bool sharded = m.contains("optimizer_shards");
  s.model_in_shards = m.value("model_in_shards", false);  // then sharded, without model parts
  if ((m.contains("model_parts") || s.model_in_shards) && m.contains("model_metadata"))
    s.model_metadata = m["model_metadata"].get<Metadata>();
  if (m.contains("model_parts")) {
    s.model_parts = listed("model_parts");
    load_model_parts(ckpt, s.model_parts, s.tp_size, s.pp_size, s.cuts, s.model, sharded ? nullptr : &s.optimizer);
  } else if (!s.model_in_shards) {
    auto model = read_safetensors((fs::path(ckpt) / kModelFile).string());
    s.model = std::move(model.tensors);
    s.model_metadata = std::move(model.metadata);
  }
  if (sharded) {
    s.optimizer_shards = listed("optimizer_shards");
    ShardState whole = assemble_shards(ckpt, s.optimizer_shards, s.tp_size, s.pp_size, s.cuts, s.model_in_shards);
    s.optimizer = std::move(whole.optimizer);
    if (s.model_in_shards) s.model = std::move(whole.model);
  } else if (!m.contains("model_parts")) {
    s.optimizer = load_safetensors((fs::path(ckpt) / kOptimFile).string());
  }
  for (const auto& [name, c] : s.cuts)
    if (s.model.count(name) == 0)
      damaged(ckpt,
              std::string(kManifest) + " gives the cut " + c.str() + " to " + name + ", which is no model tensor");
  return s;
}

}  // namespace paratrain::checkpoint
