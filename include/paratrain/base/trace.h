// The process-wide trace-event sink: any layer records timed spans here; the monitor layer
// writes them out as Chrome trace-event JSON (monitor/trace_file.h, `--trace DIR`).
//
// Off by default. enabled() is one relaxed atomic load, so an emission point costs a branch
// when tracing is off and records nothing. start() turns it on (clearing what was recorded),
// stop() turns it off; take() hands over what was recorded.
//
// An Event is a complete span ("X" in Chrome's format): a name and a category (static
// strings, or strings made stable by intern()), a track, start and end on the steady clock
// (nanoseconds, now_ns()), and up to kMaxArgs arguments (numbers or interned strings). The hot
// path stores these fields under one short mutex: no formatting, no allocation beyond the
// event buffer's growth. The buffer holds at most `max_events` events; later ones are counted
// as dropped (Recording::dropped, written into the file's metadata).
//
// Tracks: by default the calling thread's (each thread gets its own small id on its first
// event; set_thread_name() labels it, e.g. "train"), or a named virtual track (track("comm
// world")) for work that is not one thread's, such as a process group's collectives.
//
// Scope labels: LabelScope sets the calling thread's current label (an interned string, e.g.
// "block 3"); the autograd engine stamps it on the nodes recorded meanwhile and opens one span
// "backward <label>" per run of nodes with the same label. Labels nest (the scope restores the
// previous one).
//
// Thread-safety: every function may be called from any thread. Interned strings live until
// the process exits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace paratrain::trace {

namespace detail {
extern std::atomic<bool> g_enabled;
}

// Whether events are being recorded (one relaxed load).
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }

constexpr size_t kDefaultMaxEvents = size_t{1} << 18;  // about 60 MiB at most
constexpr int kMaxArgs = 8;

// Clears what was recorded and starts recording (at most max_events events, > 0).
void start(size_t max_events = kDefaultMaxEvents);
// Stops recording; what was recorded stays until take() or the next start().
void stop();

// Steady clock, nanoseconds (the clock of Event::start_ns/end_ns).
int64_t now_ns();

// A stable copy of `s` (same pointer for equal strings), for names, labels and string args.
const char* intern(std::string_view s);

struct Arg {
  const char* key = nullptr;  // static or interned
  double num = 0;
  const char* str = nullptr;  // non-null: a string argument (static or interned)
};

struct Event {
  const char* name = nullptr;
  const char* cat = nullptr;
  uint32_t track = 0;
  int64_t start_ns = 0, end_ns = 0;
  uint8_t nargs = 0;
  Arg args[kMaxArgs];
};

// Arguments being collected for an event (at most kMaxArgs; more are ignored).
class Args {
 public:
  Args& num(const char* key, double v);
  Args& str(const char* key, const char* interned_value);
  const Arg* data() const { return args_; }
  int size() const { return n_; }

 private:
  Arg args_[kMaxArgs];
  int n_ = 0;
};

// The calling thread's track (assigned on first use).
uint32_t this_thread_track();
// Names the calling thread's track ("train", "data loader", ...).
void set_thread_name(std::string_view name);
// The virtual track named `name` (the same id for the same name).
uint32_t track(std::string_view name);

// Records a span timed elsewhere (steady-clock ns); nothing when disabled.
void complete(const char* name, const char* cat, uint32_t track, int64_t start_ns, int64_t end_ns,
              const Args& args = Args());

// A span on the calling thread's track from construction to destruction.
class Span {
 public:
  Span(const char* name, const char* cat) : on_(enabled()) {
    if (on_) {
      name_ = name;
      cat_ = cat;
      start_ = now_ns();
    }
  }
  // `name` made stable with intern() (only when enabled).
  Span(std::string_view name, const char* cat, bool) : on_(enabled()) {
    if (on_) {
      name_ = intern(name);
      cat_ = cat;
      start_ = now_ns();
    }
  }
  ~Span();
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;
  bool on() const { return on_; }
  Span& num(const char* key, double v) {
    if (on_) args_.num(key, v);
    return *this;
  }
  Span& str(const char* key, const char* interned_value) {
    if (on_) args_.str(key, interned_value);
    return *this;
  }

 private:
  bool on_;
  const char* name_ = nullptr;
  const char* cat_ = nullptr;
  int64_t start_ = 0;
  Args args_;
};

// The calling thread's current scope label (interned), or nullptr.
const char* current_label();
// Sets the calling thread's scope label for its lifetime (`label` interned or static).
class LabelScope {
 public:
  explicit LabelScope(const char* label);
  ~LabelScope();
  LabelScope(const LabelScope&) = delete;
  LabelScope& operator=(const LabelScope&) = delete;

 private:
  const char* previous_;
};

// The calling thread's call tag: a (key, value) that a layer issuing work sets for a layer
// below, which copies it into its events (DDP tags its all-reduces "bucket" i; the comm flight
// recorder captures the tag when a call is recorded). key nullptr = none.
struct CallTag {
  const char* key = nullptr;  // static
  int64_t value = 0;
};
CallTag current_call_tag();
// Sets the calling thread's call tag for its lifetime (restoring the previous one).
class CallTagScope {
 public:
  CallTagScope(const char* key, int64_t value);
  ~CallTagScope();
  CallTagScope(const CallTagScope&) = delete;
  CallTagScope& operator=(const CallTagScope&) = delete;

 private:
  CallTag previous_;
};

// What was recorded: the events in the order they completed, the tracks' names (id, name;
// thread tracks "thread <n>" unless named), and the events dropped over the cap.
struct Recording {
  std::vector<Event> events;
  std::vector<std::pair<uint32_t, std::string>> tracks;
  uint64_t dropped = 0;
  size_t max_events = 0;
};
// Hands over the recorded events (the sink keeps recording if enabled, from empty).
Recording take();

}  // namespace paratrain::trace
