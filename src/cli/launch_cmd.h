// `paratrain launch`: the command-line face of the launch layer (docs/launch.md).
#pragma once

namespace paratrain::cli {

// argv[0] is "launch". Returns the exit code (0, or the first failed rank's code); throws
// paratrain::InputError for bad usage (main prints it and exits 2) and paratrain::Error
// for a failed rendezvous (exit 1).
int run_launch(int argc, char** argv);

}  // namespace paratrain::cli
