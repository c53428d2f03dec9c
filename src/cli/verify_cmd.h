// `paratrain verify [train flags] --steps N [--json FILE]`: is the gradient synchronisation
// correct? Runs N steps of the training configuration and checks them (train/verify.h,
// docs/verify.md). Exit 0 when every check passes, 1 on a divergence (the verdict line names
// the first step and tensor), 2 on bad input (InputError, one line).
#pragma once

namespace paratrain::cli {

int run_verify(int argc, char** argv);

}  // namespace paratrain::cli
