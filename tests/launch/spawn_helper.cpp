// A program that starts its ranks with paratrain::spawn (tests/launch/spawn_test.cpp).
//
//   spawn_helper MODE [ARGS...]
//
// Prints "BEFORE" from main before spawn() (so every process prints it) and, after spawn()
// returns, "SPAWN_RETURNED <code>" (the parent only, or each rank under a launcher); exits
// with spawn's result. MODE:
//   allreduce  2 ranks all-reduce rank+1 through create_process_group_from_env; each prints
//              "ARGS <argv[1..]>", "SUM rank=<r> size=<n> sum=<s>", and "VAR=<SPAWN_TEST_VAR>"
//              (set through SpawnOptions::env), "SPAWNED=<is_spawned_rank()>"; the parent
//              then prints "PARENT_VAR=<SPAWN_TEST_VAR or unset>"
//   fail       rank 0 prints "PID <pid>" then sleeps 300 s; rank 1 waits for rank 0's "PID"
//              line to be out (a file), then returns 3
//   signal     rank 1 aborts (SIGABRT); rank 0 sleeps 300 s
//   throw      rank 0 throws InputError("bad rank input"); rank 1 returns 0
//   zero       spawn(0, ...)
//   mismatch   spawn(3, ...) (run it with RANK/WORLD_SIZE=2 set)
//   twice      spawn(N, ...) twice in one process, N = WORLD_SIZE or 2
// Errors escaping spawn print "error: <what>" and exit 2 (InputError) or 1.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/launch/spawn.h"

namespace {

void sleep_s(int s) { std::this_thread::sleep_for(std::chrono::seconds(s)); }

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  std::printf("BEFORE\n");
  std::fflush(stdout);
  std::string args;
  for (int i = 1; i < argc; ++i) args += std::string(i > 1 ? " " : "") + argv[i];
  try {
    int rc = 0;
    if (mode == "allreduce") {
      paratrain::SpawnOptions o;
      o.env = {"SPAWN_TEST_VAR=hello"};
      rc = paratrain::spawn(
          2,
          [&](int rank) {
            auto pg = paratrain::comm::create_process_group_from_env();
            float x = static_cast<float>(rank + 1);
            pg->allreduce(&x, 1, paratrain::DType::F32)->wait(std::chrono::milliseconds(20000));
            const char* var = std::getenv("SPAWN_TEST_VAR");
            std::printf("ARGS %s\nSUM rank=%d size=%d sum=%g\nVAR=%s\nSPAWNED=%d\n", args.c_str(), pg->rank(),
                        pg->size(), static_cast<double>(x), var ? var : "unset",
                        paratrain::is_spawned_rank() ? 1 : 0);
            pg->barrier()->wait(std::chrono::milliseconds(20000));
            return 0;
          },
          o);
      const char* var = std::getenv("SPAWN_TEST_VAR");
      std::printf("PARENT_VAR=%s\n", var ? var : "unset");
    } else if (mode == "fail") {
      const std::string flag = argc > 2 ? argv[2] : "";
      rc = paratrain::spawn(2, [&](int rank) {
        if (rank == 0) {
          std::printf("PID %d\n", static_cast<int>(::getpid()));
          std::fflush(stdout);
          std::ofstream(flag) << "up\n";
          sleep_s(300);
          return 0;
        }
        for (int i = 0; i < 3000 && !std::ifstream(flag); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return 3;
      });
    } else if (mode == "signal") {
      rc = paratrain::spawn(2, [](int rank) {
        if (rank == 1) {
          struct rlimit none {0, 0};
          ::setrlimit(RLIMIT_CORE, &none);  // no core file
          std::abort();
        }
        sleep_s(300);
        return 0;
      });
    } else if (mode == "throw") {
      rc = paratrain::spawn(2, [](int rank) -> int {
        if (rank == 0) throw paratrain::InputError("bad rank input");
        return 0;
      });
    } else if (mode == "zero") {
      rc = paratrain::spawn(0, [](int) { return 0; });
    } else if (mode == "mismatch") {
      rc = paratrain::spawn(3, [](int) { return 0; });
    } else if (mode == "twice") {
      const char* ws = std::getenv("WORLD_SIZE");
      const int n = ws ? std::atoi(ws) : 2;
      rc = paratrain::spawn(n, [](int) { return 0; });
      std::printf("FIRST_RETURNED %d\n", rc);
      rc = paratrain::spawn(n, [](int) { return 0; });
    } else {
      std::fprintf(stderr, "usage: spawn_helper allreduce|fail FLAGFILE|signal|throw|zero|mismatch|twice\n");
      return 2;
    }
    std::printf("SPAWN_RETURNED %d\n", rc);
    return rc;
  } catch (const paratrain::InputError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
