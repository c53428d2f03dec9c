// `paratrain train` and `paratrain sample`: command-line glue over train/trainer.h and
// nn/gpt.h. Both take argv with argv[0] = the subcommand name, return the exit code, and
// throw InputError for bad usage or input (main prints one line and exits 2).
#pragma once

namespace paratrain::cli {

int run_train(int argc, char** argv);
int run_sample(int argc, char** argv);

}  // namespace paratrain::cli
