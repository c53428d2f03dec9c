// Diagnostic logging with subsystem tags, filtered by PARATRAIN_LOG.
//
// A message has a level (debug < info < warn < error) and a subsystem tag (comm, launch,
// train, data, checkpoint, parallel, ...). PARATRAIN_LOG sets the least level shown, for all
// tags and optionally per tag: "info" (the default), "debug", "warn,comm=debug",
// "error,launch=info,train=debug". A malformed value is an InputError naming the variable.
//
// Each message is one line on stderr:
//   [rank R TAG] LEVEL: message        (RANK set in the environment)
//   [TAG] LEVEL: message               (no RANK, e.g. the launcher itself)
// e.g. "[rank 1 comm] debug: process group ready: backend shm, rank 1 of 2". A line is
// written with one write(2) under a process-wide mutex, so lines of different threads never
// interleave (and lines under PIPE_BUF bytes of different processes sharing a pipe neither).
//
// PT_LOG_DEBUG / PT_LOG_INFO / PT_LOG_WARN / PT_LOG_ERROR(kTag, parts...) test the level first
// (one relaxed atomic load once configured) and format the parts only when the line is shown.
// The configuration is read from the environment on first use, or by configure_from_env()
// (which a program calls early so that a bad value fails at once, on its main thread).
// Thread-safety: every function may be called from any thread. Configuration is a global
// of the process; set_config() is for tests and for programs that configure in code.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "paratrain/base/error.h"

namespace paratrain::log {

enum class Level : uint8_t { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

// Subsystems; name() gives the tag shown in a line and accepted in PARATRAIN_LOG.
enum class Tag : uint8_t { kGeneral, kComm, kLaunch, kTrain, kData, kCheckpoint, kParallel, kMonitor, kCount };
inline constexpr size_t kTagCount = static_cast<size_t>(Tag::kCount);

std::string_view name(Level level);  // "debug", "info", "warn", "error"
std::string_view name(Tag tag);      // "general", "comm", "launch", ...

// The least level shown per tag.
struct Config {
  std::array<Level, kTagCount> least{};  // indexed by Tag
  Config() { least.fill(Level::kInfo); }
  Level least_for(Tag t) const { return least[static_cast<size_t>(t)]; }
};

// Parses a PARATRAIN_LOG value (see the top of this file); "" is the default (info).
// InputError naming PARATRAIN_LOG and the bad item when malformed.
Config parse(const std::string& value);

// Reads PARATRAIN_LOG (through base/env.h) and RANK, and makes them the configuration.
// InputError when PARATRAIN_LOG is malformed (the configuration is then left as it was).
void configure_from_env();
// Replaces the configuration; rank < 0: no rank in the lines.
void set_config(const Config& config, int rank);

// Whether a message of this tag and level is shown (configures from the environment first
// if nothing has configured yet).
bool enabled(Tag tag, Level level);

// The line for a message, with its newline: "[rank 1 comm] debug: message\n".
std::string format_line(Tag tag, Level level, int rank, std::string_view message);

// Writes the message as one line to stderr if enabled(tag, level).
void write(Tag tag, Level level, std::string_view message);

}  // namespace paratrain::log

#define PT_LOG(tag, level, ...)                                                                        \
  do {                                                                                                 \
    if (::paratrain::log::enabled(::paratrain::log::Tag::tag, level))                                  \
      ::paratrain::log::write(::paratrain::log::Tag::tag, level, ::paratrain::detail::concat(__VA_ARGS__)); \
  } while (0)
#define PT_LOG_DEBUG(tag, ...) PT_LOG(tag, ::paratrain::log::Level::kDebug, __VA_ARGS__)
#define PT_LOG_INFO(tag, ...) PT_LOG(tag, ::paratrain::log::Level::kInfo, __VA_ARGS__)
#define PT_LOG_WARN(tag, ...) PT_LOG(tag, ::paratrain::log::Level::kWarn, __VA_ARGS__)
#define PT_LOG_ERROR(tag, ...) PT_LOG(tag, ::paratrain::log::Level::kError, __VA_ARGS__)
