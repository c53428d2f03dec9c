// env_checks() and variables_json(): the PARATRAIN_* variables in effect, each set one's value
// checked through the one reader (base/env.h), unknown names matched to the nearest known.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "monitor/doctor/check_util.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/base/log.h"

extern char** environ;

namespace paratrain::monitor::doctor {
namespace {

using detail::make;

// What a declared variable's value must look like. Variables declared later in
// src/base/env.cpp that are not listed here are checked by their default's form (an
// integer default: an integer), else accepted as text.
enum class Kind { kText, kInt, kNumber, kBool, kPort, kChoice, kRankPair, kLogSpec };
struct Rule {
  Kind kind;
  double min = 0;
  std::vector<std::string> choices = {};
};
const std::map<std::string, Rule>& rules() {
  static const std::map<std::string, Rule> r = {
      {"PARATRAIN_THREADS", {Kind::kInt, 0}},
      {"PARATRAIN_COMM_TIMEOUT_S", {Kind::kNumber, 1e-9}},
      {"PARATRAIN_PEER_TIMEOUT_S", {Kind::kNumber, 1e-9}},
      {"PARATRAIN_BACKEND", {Kind::kChoice, 0, {"auto", "shm", "tcp", "mpi", "nccl"}}},
      {"PARATRAIN_SHM_STAGING_BYTES", {Kind::kInt, 1}},
      {"PARATRAIN_TCP_STREAMS", {Kind::kInt, 1}},
      {"PARATRAIN_SEGMENT_BYTES", {Kind::kInt, 0}},
      {"PARATRAIN_STORE_EXTERNAL", {Kind::kBool}},
      {"PARATRAIN_STORE_PORT", {Kind::kPort}},
      {"PARATRAIN_PROFILE", {Kind::kBool}},
      {"PARATRAIN_SLOW_RANK_LAG", {Kind::kNumber, 0}},
      {"PARATRAIN_LOG", {Kind::kLogSpec}},
      {"PARATRAIN_DEBUG", {Kind::kChoice, 0, {"detail", "off", "0"}}},
      {"PARATRAIN_CUDA_ATTENTION", {Kind::kChoice, 0, {"flash", "gemm", "gemm-bf16", "tiles"}}},
      {"PARATRAIN_SIMULATE_SLOWDOWN", {Kind::kRankPair}},
      {"PARATRAIN_TEST_KILL_IN_SAVE", {Kind::kRankPair}},
      {"PARATRAIN_TEST_INJECT_INF", {Kind::kRankPair}},
      {"PARATRAIN_TEST_STOP_AT_STEP", {Kind::kRankPair}},
      {"PARATRAIN_TEST_SKIP_ALLREDUCE", {Kind::kRankPair}},
  };
  return r;
}

Rule rule_for(const env::VarInfo& v) {
  if (auto it = rules().find(v.name); it != rules().end()) return it->second;
  const std::string& d = v.default_value;
  if (!d.empty() && d.find_first_not_of("0123456789") == std::string::npos) return {Kind::kInt, 0};
  return {Kind::kText};
}

bool is_number(const std::string& s) {
  try {
    size_t pos = 0;
    std::stod(s, &pos);
    return pos == s.size();
  } catch (const std::exception&) {
    return false;
  }
}

// Throws InputError naming the variable when its value is malformed.
void validate(const env::VarInfo& v, const std::string& value) {
  const Rule r = rule_for(v);
  switch (r.kind) {
    case Kind::kText: return;
    case Kind::kInt: {
      int64_t x = env::get_int(v.name);
      if (x < r.min) PT_THROW(InputError, v.name, "=", value, " must be at least ", int64_t(r.min));
      return;
    }
    case Kind::kNumber: {
      double x = env::get_double(v.name);
      if (x < r.min) PT_THROW(InputError, v.name, "=", value, " must be positive");
      return;
    }
    case Kind::kBool: env::get_bool(v.name); return;
    case Kind::kPort: {
      int64_t x = env::get_int(v.name);
      if (x < 1 || x > 65535) PT_THROW(InputError, v.name, "=", value, " is not a TCP port (1..65535)");
      return;
    }
    case Kind::kChoice: {
      if (std::find(r.choices.begin(), r.choices.end(), value) == r.choices.end()) {
        std::string list;
        for (const auto& c : r.choices) list += (list.empty() ? "" : "|") + c;
        PT_THROW(InputError, v.name, "='", value, "' is not one of ", list);
      }
      return;
    }
    case Kind::kLogSpec: log::parse(value); return;  // LEVEL[,TAG=LEVEL...] (base/log.h)
    case Kind::kRankPair: {  // R:N
      auto colon = value.find(':');
      if (colon == std::string::npos || !is_number(value.substr(0, colon)) || !is_number(value.substr(colon + 1)))
        PT_THROW(InputError, v.name, "='", value, "' is not of the form RANK:NUMBER");
      return;
    }
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

const env::VarInfo* declared(const std::string& name) {
  for (const auto& v : env::declared())
    if (v.name == name) return &v;
  return nullptr;
}

// Every PARATRAIN_* name set in the environment (non-empty), in sorted order.
std::vector<std::pair<std::string, std::string>> set_variables() {
  std::vector<std::pair<std::string, std::string>> r;
  for (char** e = environ; e && *e; ++e) {
    if (std::strncmp(*e, "PARATRAIN_", 10) != 0) continue;
    const char* eq = std::strchr(*e, '=');
    if (!eq || eq[1] == '\0') continue;
    r.emplace_back(std::string(*e, static_cast<size_t>(eq - *e)), std::string(eq + 1));
  }
  std::sort(r.begin(), r.end());
  return r;
}

std::string shown(const std::string& name, const std::string& value) {
  if (name == "PARATRAIN_TOKEN") return "(set, " + std::to_string(value.size()) + " characters)";
  return value;
}

}  // namespace

std::vector<Check> env_checks() {
  std::vector<Check> out;
  const auto vars = set_variables();
  int known = 0, unknown = 0, bad = 0;
  for (const auto& [name, value] : vars) {
    const env::VarInfo* v = declared(name);
    if (!v) {
      ++unknown;
      std::string best;
      size_t best_d = SIZE_MAX;
      for (const auto& d : env::declared())
        if (size_t x = edit_distance(name, d.name); x < best_d) best_d = x, best = d.name;
      out.push_back(make("env." + name, Status::kWarn, name + " is not a paratrain variable (nearest: " + best + ")",
                         "paratrain ignores it: rename it to " + best + " if that was meant, or unset it",
                         {{"variable", name}, {"known", false}, {"nearest", best}}));
      continue;
    }
    ++known;
    try {
      validate(*v, value);
      out.push_back(make("env." + name, Status::kPass, name + "=" + shown(name, value), "",
                         {{"variable", name}, {"known", true}, {"value", shown(name, value)}}));
    } catch (const Error& e) {
      ++bad;
      out.push_back(make("env." + name, Status::kFail, e.what(),
                         "fix or unset " + name + " (" + v->meaning + ")",
                         {{"variable", name}, {"known", true}, {"value", shown(name, value)}}));
    }
  }
  out.insert(out.begin(), make("env.variables", Status::kPass,
                               std::to_string(vars.size()) + " PARATRAIN_* variables set (" + std::to_string(known) +
                                   " known, " + std::to_string(unknown) + " unknown, " + std::to_string(bad) +
                                   " malformed); the others at their defaults",
                               "", {{"set", vars.size()}, {"known", known}, {"unknown", unknown}, {"malformed", bad}}));
  return out;
}

nlohmann::json variables_json() {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& v : env::declared()) {
    auto val = env::raw(v.name);
    arr.push_back({{"name", v.name},
                   {"value", val ? shown(v.name, *val) : v.default_value},
                   {"source", val ? "set" : (v.default_value.empty() ? "unset" : "default")},
                   {"known", true},
                   {"meaning", v.meaning}});
  }
  for (const auto& [name, value] : set_variables())
    if (!declared(name))
      arr.push_back({{"name", name}, {"value", value}, {"source", "set"}, {"known", false}, {"meaning", ""}});
  return arr;
}

}  // namespace paratrain::monitor::doctor
