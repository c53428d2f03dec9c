#include "doctor_cmd.h"

#include <iomanip>
#include <iostream>
#include <thread>

#include "cli_util.h"
#include "paratrain/base/env.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/version.h"

namespace paratrain::cli {

int run_doctor(int argc, char** argv) {
  CLI::App app{"Show the environment paratrain sees", "doctor"};
  if (!parse_or_throw(app, argc, argv)) return 0;
  std::cout << "paratrain " PARATRAIN_VERSION_STRING "\n\nbuild: cpu kernels (oneDNN GEMM)";
#ifdef PARATRAIN_HAVE_MPI
  std::cout << ", mpi backend";
#endif
  std::cout << "\nhost: " << std::thread::hardware_concurrency() << " cores, kernel threads "
            << kernels::cpu::num_threads() << "\nhalf-type GEMM path: bf16 " << kernels::cpu::gemm_path(DType::BF16)
            << ", f16 " << kernels::cpu::gemm_path(DType::F16) << " (native bf16 instructions: "
            << (kernels::cpu::cpu_has_native_bf16() ? "yes" : "no") << "; conversions "
            << kernels::cpu::half_convert_path() << ")\n\nPARATRAIN_* variables:\n";
  for (const auto& v : env::declared()) {
    auto val = env::raw(v.name);
    std::cout << "  " << std::left << std::setw(30) << v.name << std::setw(14)
              << (val ? *val : (v.default_value.empty() ? "(unset)" : v.default_value + " (default)")) << " "
              << v.meaning << "\n";
  }
  std::cout << "\nrank variables:\n";
  for (const char* n : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                        "SLURM_NTASKS", "SLURM_LOCALID", "OMP_NUM_THREADS"}) {
    auto val = env::raw(n);
    if (val) std::cout << "  " << std::left << std::setw(30) << n << *val << "\n";
  }
  return 0;
}

}  // namespace paratrain::cli
