#include "cli/launch_cmd.h"

#include <string>
#include <vector>

#include "paratrain/launch/launcher.h"

namespace paratrain::cli {

int run_launch(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return launch::run_launch_command(args);
}

}  // namespace paratrain::cli
