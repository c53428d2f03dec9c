#include "paratrain/base/trace.h"

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <unordered_set>

namespace paratrain::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

struct Sink {
  std::mutex mu;  // events, dropped, max_events, track names
  std::vector<Event> events;
  uint64_t dropped = 0;
  size_t max_events = kDefaultMaxEvents;
  uint32_t next_track = 1;
  std::map<uint32_t, std::string> track_names;
  std::map<std::string, uint32_t, std::less<>> virtual_tracks;

  std::mutex intern_mu;
  std::unordered_set<std::string> interned;
};

Sink& sink() {
  static Sink* s = new Sink();  // never destroyed: threads may emit while the process exits
  return *s;
}

thread_local uint32_t t_track = 0;
thread_local const char* t_label = nullptr;
thread_local CallTag t_call_tag;

}  // namespace

void start(size_t max_events) {
  Sink& s = sink();
  {
    std::lock_guard<std::mutex> l(s.mu);
    s.events.clear();
    s.dropped = 0;
    s.max_events = max_events > 0 ? max_events : 1;
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void stop() { detail::g_enabled.store(false, std::memory_order_relaxed); }

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* intern(std::string_view str) {
  Sink& s = sink();
  std::lock_guard<std::mutex> l(s.intern_mu);
  return s.interned.emplace(str).first->c_str();
}

Args& Args::num(const char* key, double v) {
  if (n_ < kMaxArgs) args_[n_++] = Arg{key, v, nullptr};
  return *this;
}

Args& Args::str(const char* key, const char* interned_value) {
  if (n_ < kMaxArgs) args_[n_++] = Arg{key, 0, interned_value ? interned_value : ""};
  return *this;
}

uint32_t this_thread_track() {
  if (t_track == 0) {
    Sink& s = sink();
    std::lock_guard<std::mutex> l(s.mu);
    t_track = s.next_track++;
    s.track_names[t_track] = "thread " + std::to_string(t_track);
  }
  return t_track;
}

void set_thread_name(std::string_view name) {
  const uint32_t id = this_thread_track();
  Sink& s = sink();
  std::lock_guard<std::mutex> l(s.mu);
  s.track_names[id] = std::string(name);
}

uint32_t track(std::string_view name) {
  Sink& s = sink();
  std::lock_guard<std::mutex> l(s.mu);
  auto it = s.virtual_tracks.find(name);
  if (it != s.virtual_tracks.end()) return it->second;
  const uint32_t id = s.next_track++;
  s.virtual_tracks.emplace(std::string(name), id);
  s.track_names[id] = std::string(name);
  return id;
}

void complete(const char* name, const char* cat, uint32_t track_id, int64_t start_ns, int64_t end_ns,
              const Args& args) {
  if (!enabled()) return;
  Event e;
  e.name = name;
  e.cat = cat ? cat : "";
  e.track = track_id;
  e.start_ns = start_ns;
  e.end_ns = end_ns < start_ns ? start_ns : end_ns;
  e.nargs = static_cast<uint8_t>(args.size());
  for (int i = 0; i < args.size(); ++i) e.args[i] = args.data()[i];
  Sink& s = sink();
  std::lock_guard<std::mutex> l(s.mu);
  if (s.events.size() >= s.max_events) {
    ++s.dropped;
    return;
  }
  s.events.push_back(e);
}

Span::~Span() {
  if (on_) complete(name_, cat_, this_thread_track(), start_, now_ns(), args_);
}

const char* current_label() { return t_label; }

LabelScope::LabelScope(const char* label) : previous_(t_label) { t_label = label; }
LabelScope::~LabelScope() { t_label = previous_; }

CallTag current_call_tag() { return t_call_tag; }

CallTagScope::CallTagScope(const char* key, int64_t value) : previous_(t_call_tag) { t_call_tag = CallTag{key, value}; }
CallTagScope::~CallTagScope() { t_call_tag = previous_; }

Recording take() {
  Sink& s = sink();
  Recording r;
  std::lock_guard<std::mutex> l(s.mu);
  r.events.swap(s.events);
  r.dropped = s.dropped;
  r.max_events = s.max_events;
  s.dropped = 0;
  for (const auto& [id, name] : s.track_names) r.tracks.emplace_back(id, name);
  return r;
}

}  // namespace paratrain::trace
