// PARATRAIN_LOG parsing, the process-wide filter, and the one-write-per-line sink (log.h).
#include "paratrain/base/log.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "paratrain/base/env.h"

namespace paratrain::log {
namespace {

constexpr std::array<std::string_view, 4> kLevelNames = {"debug", "info", "warn", "error"};
constexpr std::array<std::string_view, kTagCount> kTagNames = {"general", "comm", "launch", "train",
                                                               "data", "checkpoint", "parallel", "monitor"};

// The configuration as atomics, so enabled() is one load on the hot path.
std::array<std::atomic<uint8_t>, kTagCount> g_least{};
std::atomic<int> g_rank{-1};
std::atomic<bool> g_configured{false};
std::mutex g_configure_mutex;  // first configuration from the environment
std::mutex g_write_mutex;      // one line at a time within the process

std::string choices(const auto& names) {
  std::string s;
  for (auto n : names) s += (s.empty() ? "" : "|") + std::string(n);
  return s;
}

Level parse_level(const std::string& value, const std::string& item, const std::string& word) {
  for (size_t i = 0; i < kLevelNames.size(); ++i)
    if (word == kLevelNames[i]) return static_cast<Level>(i);
  PT_THROW(InputError, "PARATRAIN_LOG='", value, "': '", item, "' is not a level (", choices(kLevelNames),
           ") or TAG=LEVEL with TAG one of ", choices(kTagNames));
}

void store(const Config& c, int rank) {
  for (size_t i = 0; i < kTagCount; ++i) g_least[i].store(static_cast<uint8_t>(c.least[i]), std::memory_order_relaxed);
  g_rank.store(rank, std::memory_order_relaxed);
  g_configured.store(true, std::memory_order_release);
}

}  // namespace

std::string_view name(Level level) { return kLevelNames[static_cast<size_t>(level)]; }
std::string_view name(Tag tag) { return kTagNames[static_cast<size_t>(tag)]; }

Config parse(const std::string& value) {
  Config c;
  bool have_default = false;
  std::array<bool, kTagCount> have_tag{};
  Level fallback = Level::kInfo;
  size_t start = 0;
  while (start <= value.size() && !value.empty()) {
    size_t comma = value.find(',', start);
    if (comma == std::string::npos) comma = value.size();
    const std::string item = value.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) PT_THROW(InputError, "PARATRAIN_LOG='", value, "' has an empty item (e.g. info,comm=debug)");
    const size_t eq = item.find('=');
    if (eq == std::string::npos) {
      if (have_default) PT_THROW(InputError, "PARATRAIN_LOG='", value, "' names the default level twice");
      fallback = parse_level(value, item, item);
      have_default = true;
      continue;
    }
    const std::string tag = item.substr(0, eq);
    size_t t = 0;
    while (t < kTagCount && kTagNames[t] != tag) ++t;
    if (t == kTagCount)
      PT_THROW(InputError, "PARATRAIN_LOG='", value, "': '", tag, "' is not a tag (", choices(kTagNames), ")");
    if (have_tag[t]) PT_THROW(InputError, "PARATRAIN_LOG='", value, "' names tag ", tag, " twice");
    c.least[t] = parse_level(value, item, item.substr(eq + 1));
    have_tag[t] = true;
  }
  for (size_t t = 0; t < kTagCount; ++t)
    if (!have_tag[t]) c.least[t] = fallback;
  return c;
}

void configure_from_env() {
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  const Config c = parse(env::get_string("PARATRAIN_LOG"));
  int rank = -1;
  try {
    if (auto r = env::raw_int("RANK")) rank = static_cast<int>(*r);
  } catch (const InputError&) {
    rank = -1;  // a malformed RANK is the job's business (read_job_env reports it); lines carry none
  }
  store(c, rank);
}

void set_config(const Config& config, int rank) {
  std::lock_guard<std::mutex> lock(g_configure_mutex);
  store(config, rank);
}

bool enabled(Tag tag, Level level) {
  if (!g_configured.load(std::memory_order_acquire)) [[unlikely]]
    configure_from_env();
  return static_cast<uint8_t>(level) >= g_least[static_cast<size_t>(tag)].load(std::memory_order_relaxed);
}

std::string format_line(Tag tag, Level level, int rank, std::string_view message) {
  std::string s;
  s.reserve(message.size() + 32);
  s += '[';
  if (rank >= 0) s += "rank " + std::to_string(rank) + " ";
  s += name(tag);
  s += "] ";
  s += name(level);
  s += ": ";
  // One message, one line: embedded newlines would break the line format.
  for (char ch : message) s += ch == '\n' ? ' ' : ch;
  s += '\n';
  return s;
}

void write(Tag tag, Level level, std::string_view message) {
  if (!enabled(tag, level)) return;
  const std::string line = format_line(tag, level, g_rank.load(std::memory_order_relaxed), message);
  std::lock_guard<std::mutex> lock(g_write_mutex);
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(2, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr is gone: nothing to report to
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace paratrain::log
