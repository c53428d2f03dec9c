#include "paratrain/monitor/trace_file.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string_view>
#include <unistd.h>

#include "paratrain/base/atomic_file.h"
#include "paratrain/base/json_text.h"
#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"

namespace paratrain::monitor {

namespace {

namespace fs = std::filesystem;

constexpr int kGatherTag = 0x7472;  // "tr": the ranks' events on their way to rank 0

// Microseconds with three decimals, exactly (no trip through a double).
void append_us(std::string& o, int64_t ns) {
  char b[32];
  const char* sign = ns < 0 ? "-" : "";
  const int64_t a = ns < 0 ? -ns : ns;
  std::snprintf(b, sizeof(b), "%s%" PRId64 ".%03" PRId64, sign, a / 1000, a % 1000);
  o += b;
}

void append_number(std::string& o, double v) {
  char b[32];
  if (v == static_cast<double>(static_cast<int64_t>(v)) && v < 9e15 && v > -9e15)
    std::snprintf(b, sizeof(b), "%" PRId64, static_cast<int64_t>(v));
  else if (v != v || v - v != 0)  // NaN or inf: not JSON
    std::snprintf(b, sizeof(b), "null");
  else
    std::snprintf(b, sizeof(b), "%.6g", v);
  o += b;
}

void append_metadata(std::string& o, const char* what, int rank, uint32_t tid, const std::string& name) {
  o += "{\"name\":\"";
  o += what;
  o += "\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) + ",\"tid\":" + std::to_string(tid) + ",\"args\":{\"name\":";
  append_json_string(o, name);
  o += "}}";
}

void append_sort_index(std::string& o, const char* what, int rank, uint32_t tid, int64_t index) {
  o += "{\"name\":\"";
  o += what;
  o += "\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) + ",\"tid\":" + std::to_string(tid) +
       ",\"args\":{\"sort_index\":" + std::to_string(index) + "}}";
}

}  // namespace

std::string rank_trace_path(const std::string& dir, int rank) {
  return (fs::path(dir) / ("rank" + std::to_string(rank) + ".trace.json")).string();
}
std::string merged_trace_path(const std::string& dir) { return (fs::path(dir) / "trace.json").string(); }

int64_t steady_to_unix_offset_ns() {
  const int64_t unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  return unix_ns - trace::now_ns();
}

std::string trace_events_json(const trace::Recording& rec, int rank, int64_t unix_offset_ns) {
  std::string o;
  o.reserve(rec.events.size() * 160 + 256);
  append_metadata(o, "process_name", rank, 0, "rank " + std::to_string(rank));
  o += ',';
  append_sort_index(o, "process_sort_index", rank, 0, rank);
  for (const auto& [tid, name] : rec.tracks) {
    o += ',';
    append_metadata(o, "thread_name", rank, tid, name);
    o += ',';
    append_sort_index(o, "thread_sort_index", rank, tid, tid);
  }
  const std::string pid = std::to_string(rank);
  for (const trace::Event& e : rec.events) {
    o += ",\n{\"name\":";
    append_json_string(o, e.name ? e.name : "");
    o += ",\"cat\":";
    append_json_string(o, e.cat ? e.cat : "");
    o += ",\"ph\":\"X\",\"ts\":";
    append_us(o, e.start_ns + unix_offset_ns);
    o += ",\"dur\":";
    append_us(o, e.end_ns - e.start_ns);
    o += ",\"pid\":" + pid + ",\"tid\":" + std::to_string(e.track);
    if (e.nargs > 0) {
      o += ",\"args\":{";
      for (int i = 0; i < e.nargs; ++i) {
        const trace::Arg& a = e.args[i];
        if (i) o += ',';
        append_json_string(o, a.key ? a.key : "");
        o += ':';
        if (a.str) append_json_string(o, a.str);
        else append_number(o, a.num);
      }
      o += '}';
    }
    o += '}';
  }
  return o;
}

std::string trace_document(const std::vector<std::string>& bodies, const std::string& other_data) {
  size_t n = 0;
  for (const auto& b : bodies) n += b.size() + 2;
  std::string o;
  o.reserve(n + other_data.size() + 96);
  o += "{\"traceEvents\":[\n";
  bool first = true;
  for (const auto& b : bodies) {
    if (b.empty()) continue;
    if (!first) o += ",\n";
    o += b;
    first = false;
  }
  o += "\n],\"displayTimeUnit\":\"ms\",\"otherData\":";
  o += other_data;
  o += "}\n";
  return o;
}

TraceSession::TraceSession(std::string dir, int rank, size_t max_events) : dir_(std::move(dir)), rank_(rank) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec || !fs::is_directory(dir_))
    PT_THROW(InputError, "--trace ", dir_, ": cannot create the directory (", ec ? ec.message() : "not a directory",
             ")");
  if (::access(dir_.c_str(), W_OK) != 0) PT_THROW(InputError, "--trace ", dir_, ": the directory is not writable");
  trace::start(max_events);
}

TraceSession::~TraceSession() {
  if (finished_) return;
  try {
    write_own();
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank_ << ": --trace: " << e.what() << "\n";
  }
}

std::string TraceSession::write_own() {
  finished_ = true;
  trace::stop();
  trace::Recording rec = trace::take();
  dropped_ = rec.dropped;
  max_events_ = rec.max_events;
  std::string body = trace_events_json(rec, rank_, steady_to_unix_offset_ns());
  const std::string other = "{\"rank\":" + std::to_string(rank_) + ",\"clock\":\"unix\",\"max_events\":" +
                            std::to_string(max_events_) + ",\"dropped_events\":" + std::to_string(dropped_) + "}";
  write_file_atomic(rank_trace_path(dir_, rank_), trace_document({body}, other));
  return body;
}

void TraceSession::finish(comm::ProcessGroup* world, std::chrono::milliseconds timeout) {
  if (finished_) return;
  std::string body = write_own();
  const int size = world ? world->size() : 1;
  std::vector<std::string> bodies(static_cast<size_t>(size));
  std::vector<int64_t> dropped(static_cast<size_t>(size), 0);
  if (!world) {
    bodies[0] = std::move(body);
    dropped[0] = static_cast<int64_t>(dropped_);
  } else {
    const int rank = world->rank();
    const char* step = "exchanging the sizes of the ranks' events (allgather)";
    try {
      // Every rank's [bytes, dropped events], then each rank's events to rank 0 as i32 words
      // (the transports reduce and move f32/bf16/f16/i32/i64).
      int64_t mine[2] = {static_cast<int64_t>(body.size()), static_cast<int64_t>(dropped_)};
      std::vector<int64_t> all(2 * static_cast<size_t>(size));
      world->allgather(mine, all.data(), 2, DType::I64)->wait(timeout);
      auto words_of = [](int64_t bytes) { return static_cast<size_t>((bytes + 3) / 4); };
      if (rank != 0) {
        step = "sending this rank's events to rank 0";
        std::vector<int32_t> words(words_of(mine[0]), 0);
        if (!body.empty()) std::memcpy(words.data(), body.data(), body.size());
        if (!words.empty()) world->send(words.data(), words.size(), DType::I32, 0, kGatherTag)->wait(timeout);
      } else {
        bodies[0] = std::move(body);
        for (int r = 0; r < size; ++r) dropped[static_cast<size_t>(r)] = all[2 * static_cast<size_t>(r) + 1];
        for (int r = 1; r < size; ++r) {
          const int64_t bytes = all[2 * static_cast<size_t>(r)];
          if (bytes <= 0) continue;
          step = "receiving a rank's events";
          std::vector<int32_t> words(words_of(bytes));
          world->recv(words.data(), words.size(), DType::I32, r, kGatherTag)->wait(timeout);
          bodies[static_cast<size_t>(r)].assign(reinterpret_cast<const char*>(words.data()),
                                                static_cast<size_t>(bytes));
        }
      }
    } catch (const TimeoutError& e) {
      PT_THROW(TimeoutError, "rank ", rank, ": --trace ", dir_, ": ", step, ": ", e.what());
    } catch (const CommError& e) {
      PT_THROW(CommError, "rank ", rank, ": --trace ", dir_, ": ", step, ": ", e.what());
    }
    if (rank != 0) return;
  }
  std::string other = "{\"ranks\":" + std::to_string(size) + ",\"clock\":\"unix\",\"max_events\":" +
                      std::to_string(max_events_) + ",\"dropped_events_per_rank\":[";
  for (int r = 0; r < size; ++r) {
    if (r) other += ',';
    other += std::to_string(dropped[static_cast<size_t>(r)]);
  }
  other += "]}";
  write_file_atomic(merged_trace_path(dir_), trace_document(bodies, other));
}

}  // namespace paratrain::monitor
