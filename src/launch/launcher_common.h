// What the launcher's files share (launcher.cpp, job_setup.cpp, local_ranks.cpp,
// attempt_supervisor.cpp): say(), one line of the launcher's own on stderr, "paratrain launch:
// <line>" (the lines a user reads: choices made, failures, restarts; the detail goes to the
// log, PT_LOG_DEBUG), and seconds_since() on the steady clock.
#pragma once

#include <chrono>
#include <string>

#include "paratrain/launch/process.h"

namespace paratrain::launch {

inline void say(const std::string& line) {
  std::string s = "paratrain launch: " + line + "\n";
  write_all(2, s.data(), s.size());
}

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace paratrain::launch
