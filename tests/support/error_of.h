// error_of<E>(f): runs f, expects it to throw E, and returns the message, so a test can check
// what an error says ("" and a test failure when f throws something else or nothing).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace paratrain::testing {

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
    return "";
  }
  ADD_FAILURE() << "no exception";
  return "";
}

}  // namespace paratrain::testing
