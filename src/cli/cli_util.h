// Helpers shared by the subcommands: CLI11 parsing that turns every parse error into a
// one-line InputError.
#pragma once

#include <CLI/CLI.hpp>

#include "paratrain/base/error.h"

namespace paratrain::cli {

// Parses argv into `app`. Returns false when --help was printed (the caller returns 0).
inline bool parse_or_throw(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return false;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help("", CLI::AppFormatMode::All);
    return false;
  } catch (const CLI::ParseError& e) {
    throw InputError(app.get_name() + ": " + e.what());
  }
  return true;
}

}  // namespace paratrain::cli
