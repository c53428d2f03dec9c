// Helpers shared by the subcommands: CLI11 parsing that turns every parse error into a
// one-line InputError.
#pragma once

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "paratrain/base/error.h"

namespace paratrain::cli {

// Parses argv into `app`. Returns false when --help was printed (the caller returns 0).
// A parse error becomes an InputError "<command>: <first line of CLI11's message>".
inline bool parse_or_throw(CLI::App& app, int argc, char** argv, const std::string& command = "") {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return false;
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    if (auto nl = what.find('\n'); nl != std::string::npos) what.resize(nl);
    throw InputError((command.empty() ? app.get_name() : command) + ": " + what);
  }
  return true;
}

}  // namespace paratrain::cli
