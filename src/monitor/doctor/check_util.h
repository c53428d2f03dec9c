// Helpers shared by the doctor's check files (src/monitor/doctor/*.cpp): building a Check,
// running a check so that an exception becomes a failure naming it, and reading small
// system files.
#pragma once

#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/monitor/doctor.h"

namespace paratrain::monitor::doctor::detail {

inline Check make(std::string name, Status s, std::string value, std::string fix = "",
                  nlohmann::json data = nlohmann::json::object()) {
  Check c;
  c.name = std::move(name);
  c.status = s;
  c.value = std::move(value);
  c.fix = std::move(fix);
  c.data = std::move(data);
  return c;
}

// Runs fn, appending what it returns to out; an exception becomes one failed check `name`
// whose value is the exception's message.
inline void guarded(std::vector<Check>& out, const std::string& name, const std::function<void(std::vector<Check>&)>& fn) {
  try {
    fn(out);
  } catch (const std::exception& e) {
    out.push_back(make(name, Status::kFail, std::string("check could not run: ") + e.what(),
                       "see the message; it names what failed"));
  }
}

// The whole file, or nullopt when it cannot be read; trailing newlines removed.
std::optional<std::string> read_text(const std::string& path);
// The first line of /proc/cpuinfo or /proc/meminfo style "key : value" for `key`.
std::optional<std::string> proc_field(const std::string& path, const std::string& key);
// "1.5 GiB", "64 MiB", "512 B"
std::string human_bytes(double bytes);
// Output of a shell command line run under `timeout` (stdout only), or nullopt if it failed.
std::optional<std::string> command_output(const std::string& cmd, int timeout_s);
// This host's name (gethostname).
std::string hostname();
// A check as one JSON object (the "checks" entries of docs/doctor.md's schema) and back.
nlohmann::json check_to_json(const Check& c);
Check check_from_json(const nlohmann::json& j);

}  // namespace paratrain::monitor::doctor::detail
