#include "paratrain/checkpoint/training_state.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
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
  for (const char* f : {kModelFile, kOptimFile}) {
    if (!m["files"].contains(f)) bad(std::string("does not list ") + f);
    const auto& e = m["files"][f];
    if (!e.is_object() || !e.contains("bytes") || !e["bytes"].is_number_unsigned() || !e.contains("crc32") ||
        !e["crc32"].is_string())
      bad(std::string("entry for ") + f + " lacks \"bytes\" / \"crc32\"");
  }
  return m;
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

std::string save_training_state(const std::string& dir, const TrainingState& s, int keep_last) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) PT_THROW(IoError, "cannot create checkpoint directory ", dir, ": ", ec.message());
  const std::string name = checkpoint_name(s.step);
  const fs::path ckpt = fs::path(dir) / name;
  std::string latest;
  try {
    latest = read_latest(dir);
  } catch (const InputError&) {
    latest.clear();  // an unreadable pointer is replaced below
  }
  if (latest == name && fs::exists(ckpt / kManifest, ec)) return ckpt.string();  // already saved
  fs::remove_all(ckpt, ec);  // a leftover from an interrupted save
  fs::create_directories(ckpt, ec);
  if (ec) PT_THROW(IoError, "cannot create checkpoint directory ", ckpt.string(), ": ", ec.message());

  const std::string model_path = (ckpt / kModelFile).string();
  const std::string optim_path = (ckpt / kOptimFile).string();
  save_safetensors(model_path, s.model, s.model_metadata);
  save_safetensors(optim_path, s.optimizer, Metadata{{"optimizer_steps", std::to_string(s.optimizer_steps)}});

  nlohmann::json m;
  m["format"] = kFormat;
  m["version"] = 1;
  m["step"] = s.step;
  m["world_size"] = s.world_size;
  m["optimizer_steps"] = s.optimizer_steps;
  m["loss_scale"] = s.loss_scale;
  if (s.rng) {
    nlohmann::json r = nlohmann::json::array();
    for (uint64_t w : *s.rng) r.push_back(hex_u64(w));
    m["rng"] = r;
  } else {
    m["rng"] = nullptr;
  }
  m["config"] = s.config;
  m["files"] = nlohmann::json::object();
  for (const auto& [fname, p] : {std::pair<const char*, std::string>{kModelFile, model_path}, {kOptimFile, optim_path}})
    m["files"][fname] = {{"bytes", static_cast<uint64_t>(fs::file_size(p))}, {"crc32", file_crc32(p)}};
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

std::optional<std::string> find_latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const std::string latest = read_latest(dir);
  auto dirs = step_dirs(dir);
  if (!latest.empty()) {
    const fs::path p = fs::path(dir) / latest;
    if (!fs::is_directory(p, ec))
      PT_THROW(InputError, "checkpoint directory ", dir, ": 'latest' names ", latest, ", which does not exist");
    // A kill between a manifest and the `latest` update leaves a newer complete checkpoint.
    for (const auto& [step, q] : dirs)
      if (step > parse_step_name(latest) && fs::exists(q / kManifest, ec)) return q.string();
    return p.string();
  }
  if (dirs.empty()) return std::nullopt;
  for (const auto& [step, p] : dirs)
    if (fs::exists(p / kManifest, ec)) return p.string();
  std::string names;
  for (const auto& [step, p] : dirs) names += (names.empty() ? "" : ", ") + p.string();
  PT_THROW(InputError, "checkpoint directory ", dir, " holds only incomplete checkpoints (no ", kManifest,
           "): ", names, "; nothing was loaded");
}

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
  s.optimizer = load_safetensors((fs::path(ckpt) / kOptimFile).string());
  return s;
}

}  // namespace paratrain::checkpoint
