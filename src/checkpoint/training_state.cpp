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
  // The optimizer state is optim.safetensors, or one shard per rank listed in "optimizer_shards".
  std::vector<std::string> required = {kModelFile};
  if (m.contains("optimizer_shards")) {
    if (!m["optimizer_shards"].is_array() || m["optimizer_shards"].empty()) bad("has a malformed \"optimizer_shards\"");
    for (const auto& f : m["optimizer_shards"]) {
      if (!f.is_string()) bad("has a malformed \"optimizer_shards\"");
      required.push_back(f.get<std::string>());
    }
  } else {
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

// The whole optimizer state from the shards listed in the manifest: every "<param>.<state>"
// tensor gets its parameter's shape, and its pieces must cover each element exactly once.
std::map<std::string, Tensor> assemble_shards(const std::string& ckpt, const std::vector<ShardFileInfo>& files) {
  struct Whole {
    Tensor t;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // [begin, end) of the pieces seen
    std::string first_file;
  };
  std::map<std::string, Whole> out;
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
    for (auto& [key, t] : file.tensors) {
      const auto dot = key.rfind('.');
      auto pit = dot == std::string::npos ? by_name.end() : by_name.find(key.substr(0, dot));
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
      Whole& w = out[key];
      if (!w.t.defined()) {
        w.t = Tensor::zeros(shape);
        w.first_file = f.name;
      } else if (w.t.shape() != shape) {
        bad("gives " + key + " the shape [" + shape_str(shape) + "], " + w.first_file + " [" +
            shape_str(w.t.shape()) + "]");
      }
      std::memcpy(w.t.data<float>() + begin, t.data<float>(), static_cast<size_t>(n) * sizeof(float));
      w.ranges.emplace_back(begin, begin + n);
    }
  }
  std::map<std::string, Tensor> state;
  for (auto& [key, w] : out) {
    std::sort(w.ranges.begin(), w.ranges.end());
    int64_t covered = 0;
    for (const auto& [b, e] : w.ranges) {
      if (b != covered)
        PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: the optimizer shards ",
                 b > covered ? "leave out" : "overlap at", " elements ", std::min(b, covered), "..",
                 std::max(b, covered), " of ", key, "; nothing was loaded");
      covered = e;
    }
    if (covered != w.t.numel())
      PT_THROW(InputError, "checkpoint ", ckpt, " is damaged: the optimizer shards leave out elements ", covered, "..",
               w.t.numel(), " of ", key, "; nothing was loaded");
    state[key] = std::move(w.t);
  }
  return state;
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
                                    const OptimizerShard& shard, int64_t optimizer_steps) {
  nlohmann::json pieces = nlohmann::json::array();
  for (const auto& p : shard.pieces)
    pieces.push_back({{"name", p.name}, {"begin", p.begin}, {"numel", p.numel}, {"shape", p.shape}});
  const Metadata meta = {{"format", kShardFormat},
                         {"rank", std::to_string(rank)},
                         {"world_size", std::to_string(world_size)},
                         {"optimizer_steps", std::to_string(optimizer_steps)},
                         {"pieces", pieces.dump()}};
  ShardFileInfo info;
  info.name = optimizer_shard_file_name(rank, world_size);
  const fs::path path = fs::path(dir) / checkpoint_name(step) / info.name;
  save_safetensors(path.string(), shard.tensors, meta);
  info.bytes = static_cast<uint64_t>(fs::file_size(path));
  info.crc32 = file_crc32(path.string());
  return info;
}

std::string save_training_state(const std::string& dir, const TrainingState& s, int keep_last,
                                const std::function<void()>& before_manifest) {
  std::error_code ec;
  const std::string name = checkpoint_name(s.step);
  const fs::path ckpt = fs::path(dir) / name;
  const bool sharded = !s.optimizer_shards.empty();
  if (!sharded && !prepare_checkpoint(dir, s.step)) return ckpt.string();  // already saved
  if (sharded)
    for (const auto& f : s.optimizer_shards)
      if (!fs::exists(ckpt / f.name, ec))
        PT_THROW(InputError, "save_training_state: the shard ", (ckpt / f.name).string(),
                 " is missing (every rank writes its shard before rank 0 writes the manifest)");

  const std::string model_path = (ckpt / kModelFile).string();
  const std::string optim_path = (ckpt / kOptimFile).string();
  save_safetensors(model_path, s.model, s.model_metadata);
  if (!sharded)
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
  m["files"] = nlohmann::json::object();
  m["files"][kModelFile] = {{"bytes", static_cast<uint64_t>(fs::file_size(model_path))},
                            {"crc32", file_crc32(model_path)}};
  if (sharded) {
    m["optimizer_shards"] = nlohmann::json::array();
    for (const auto& f : s.optimizer_shards) {
      m["optimizer_shards"].push_back(f.name);
      m["files"][f.name] = {{"bytes", f.bytes}, {"crc32", f.crc32}};
    }
  } else {
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
  auto model = read_safetensors((fs::path(ckpt) / kModelFile).string());
  s.model = std::move(model.tensors);
  s.model_metadata = std::move(model.metadata);
  s.zero_stage = m.value("zero_stage", 0);
  if (m.contains("optimizer_shards")) {
    for (const auto& f : m["optimizer_shards"])
      s.optimizer_shards.push_back({f.get<std::string>(), m["files"][f.get<std::string>()]["bytes"].get<uint64_t>(),
                                    m["files"][f.get<std::string>()]["crc32"].get<std::string>()});
    s.optimizer = assemble_shards(ckpt, s.optimizer_shards);
  } else {
    s.optimizer = load_safetensors((fs::path(ckpt) / kOptimFile).string());
  }
  return s;
}

}  // namespace paratrain::checkpoint
