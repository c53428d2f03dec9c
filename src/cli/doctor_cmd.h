// `paratrain doctor`: prints what paratrain sees of its environment (every PARATRAIN_*
// variable with its value and meaning, the rank variables, threads, build features).
#pragma once

namespace paratrain::cli {

int run_doctor(int argc, char** argv);

}  // namespace paratrain::cli
