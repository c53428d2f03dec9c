// paratrain's error model (docs/errors.md).
//
// Everything that can go wrong at run time is thrown as a paratrain::Error subclass whose
// message a user can act on. InputError is bad input or usage (the CLI exits 2 for it);
// every other Error exits 1. PT_CHECK guards invariants of our own code and throws
// InternalError. The library never calls exit().
//
// Error types carry only their message (a std::string copy), so an exception may be kept,
// copied, or rethrown on another thread (std::exception_ptr) after what threw it is gone.
// Thread-safety: the types and macros have no shared state; any thread may throw and catch.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace paratrain {

// Base of all paratrain errors.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// Bad input or usage: a missing or malformed file, an unknown flag, a bad value.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(what) {}
};

// Reading or writing a file or socket failed.
class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(what) {}
};

// A blocking wait passed its deadline. The message names the rank, operation and sequence.
class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what) {}
};

// A communication failure: a dead peer, a mismatched collective, a refused connection.
class CommError : public Error {
 public:
  explicit CommError(const std::string& what) : Error(what) {}
};

// A broken invariant inside paratrain (a bug), raised by PT_CHECK.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& what) : Error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void check_failed(const char* cond, const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace paratrain

// PT_CHECK(cond, message parts...): throws InternalError naming the condition and location.
#define PT_CHECK(cond, ...)                                                                     \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::paratrain::detail::check_failed(#cond, __FILE__, __LINE__,                              \
                                        ::paratrain::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// PT_THROW(Type, message parts...): throws Type with the concatenated message.
#define PT_THROW(Type, ...) throw Type(::paratrain::detail::concat(__VA_ARGS__))
