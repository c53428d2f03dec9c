// A rank that builds the comm layer's ProcessGroup from the launcher's environment
// (create_process_group_from_env: MASTER_ADDR/PARATRAIN_STORE_PORT/PARATRAIN_TOKEN, the
// launcher's store) and all-reduces rank+1; prints
// "PG_OK rank=<r> size=<n> sum=<s>". With --fail-first-attempt R it exits 7 on rank R after
// the all-reduce while TORCHELASTIC_RESTART_COUNT is 0.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "paratrain/comm/process_group.h"

int main(int argc, char** argv) {
  int fail_rank = -1;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--fail-first-attempt") fail_rank = std::atoi(argv[i + 1]);
  try {
    auto pg = paratrain::comm::create_process_group_from_env();
    float x = static_cast<float>(pg->rank() + 1);
    pg->allreduce(&x, 1, paratrain::DType::F32)->wait(std::chrono::milliseconds(20000));
    std::printf("PG_OK rank=%d size=%d sum=%g\n", pg->rank(), pg->size(), static_cast<double>(x));
    std::fflush(stdout);
    const char* rc = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (pg->rank() == fail_rank && rc != nullptr && std::string(rc) == "0") return 7;
    pg->barrier()->wait(std::chrono::milliseconds(20000));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pg_helper: %s\n", e.what());
    return 1;
  }
  return 0;
}
