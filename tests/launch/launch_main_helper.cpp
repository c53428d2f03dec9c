// Stands in for `paratrain launch` until src/cli/main.cpp dispatches to it: the same
// library entry point and the same error handling as main (InputError -> exit 2).
#include <cstdio>
#include <string>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/launch/launcher.h"

int main(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  try {
    return paratrain::launch::run_launch_command(args);
  } catch (const paratrain::InputError& e) {
    std::fprintf(stderr, "paratrain: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paratrain: error: %s\n", e.what());
    return 1;
  }
}
