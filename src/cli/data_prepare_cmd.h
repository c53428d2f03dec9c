// `paratrain data prepare`: command-line glue over data/text_prepare.h.
#pragma once

namespace paratrain::cli {

// argv[0] is "prepare". Parses the flags, runs prepare_text and prints its summary to stdout.
// Returns 0 on success (and for --help). Bad flags or input throw InputError (main prints
// one line and exits 2); other failures throw paratrain::Error.
int run_data_prepare(int argc, char** argv);

}  // namespace paratrain::cli
