// `paratrain train` and `paratrain sample`: command-line glue over train/trainer.h and
// nn/gpt.h. Both take argv with argv[0] = the subcommand name, return the exit code, and
// throw InputError for bad usage or input (main prints one line and exits 2).
#pragma once

#include <CLI/CLI.hpp>

#include "paratrain/train/config.h"

namespace paratrain::cli {

// Adds every `paratrain train` option to `app`, each bound to its field of `c` (the defaults
// shown are c's values when this is called). Shared by train and verify.
void add_train_flags(CLI::App& app, train::TrainConfig& c);

int run_train(int argc, char** argv);
int run_sample(int argc, char** argv);

}  // namespace paratrain::cli
