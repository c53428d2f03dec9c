// A rank program for the launcher's flight-recorder tests (launch_hang_test.cpp), started by
// `paratrain launch` (a process group from the environment). Usage: hang_helper MODE
//   skip      3 allreduces; then rank 2 sleeps (60 s) instead of the 4th, which the others
//             call and wait in: the job hangs at allreduce #3
//   mismatch  3 allreduces; then rank 1 calls broadcast where the others call allreduce,
//             then every rank but rank 1 calls one more allreduce (rank 1 sleeps 60 s)
//   loop      allreduces 20 ms apart until any rank sees the file stop in PARATRAIN_FR_DUMP_DIR
//             (at most 30 s; the ranks agree through the allreduce); exit 0
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/process_group.h"

using namespace paratrain;
using namespace paratrain::comm;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto pg = create_process_group_from_env();
    std::vector<float> x(16, 1.0f);
    if (mode == "loop") {
      const char* dir = std::getenv("PARATRAIN_FR_DUMP_DIR");
      const std::string stop = std::string(dir ? dir : ".") + "/stop";
      auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      // Every rank sees the stop file at its own moment; the allreduce carries each rank's
      // "stop" vote (x[0]), so all ranks leave the loop after the same allreduce.
      for (bool done = false; !done;) {
        std::fill(x.begin(), x.end(), 1.0f);
        x[0] = std::filesystem::exists(stop) || std::chrono::steady_clock::now() >= until ? 1.0f : 0.0f;
        pg->allreduce(x.data(), x.size(), DType::F32)->wait();
        done = x[0] > 0.0f;
        if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      pg->barrier()->wait();
      return 0;
    }
    for (int i = 0; i < 3; ++i) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
    if (mode == "skip") {
      if (pg->rank() == 2) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        return 0;
      }
      pg->allreduce(x.data(), x.size(), DType::F32)->wait();
      return 0;
    }
    if (mode == "mismatch") {
      if (pg->rank() == 1) pg->broadcast(x.data(), x.size(), DType::F32, 0)->wait();
      else pg->allreduce(x.data(), x.size(), DType::F32)->wait();
      if (pg->rank() == 1) {
        std::this_thread::sleep_for(std::chrono::seconds(60));
        return 0;
      }
      pg->allreduce(x.data(), x.size(), DType::F32)->wait();
      return 0;
    }
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}
