// The one place that reads PARATRAIN_* environment variables.
//
// Each variable is declared once (name, default, meaning) in src/base/env.cpp's table, so
// `paratrain doctor` can list them all with their current values. Reading an undeclared
// PARATRAIN_ name is an InternalError; a malformed value is an InputError naming the variable.
//
// Values are read from the process environment at each call (nothing is cached), so a
// variable set before a call is seen by it. declared() returns a table that lives as long as
// the program.
// Thread-safety: all functions may be called from any thread, as long as nothing changes the
// environment (setenv/putenv) at the same time (getenv's own rule).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace paratrain::env {

struct VarInfo {
  std::string name;
  std::string default_value;  // as text; "" = unset
  std::string meaning;
};

// All declared PARATRAIN_* variables.
const std::vector<VarInfo>& declared();

// Typed readers for declared PARATRAIN_* variables; fall back to the declared default.
std::string get_string(const std::string& name);
int64_t get_int(const std::string& name);
double get_double(const std::string& name);
bool get_bool(const std::string& name);

// Any environment variable (RANK, OMPI_COMM_WORLD_RANK, ...); nullopt when unset or empty.
std::optional<std::string> raw(const std::string& name);
// An integer variable from outside (RANK, WORLD_SIZE, SLURM_PROCID, ...); InputError if malformed.
std::optional<int64_t> raw_int(const std::string& name);

}  // namespace paratrain::env
