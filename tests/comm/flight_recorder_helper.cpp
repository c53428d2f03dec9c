// A rank program for the flight-recorder and liveness tests. Started N times with RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT. Usage: flight_recorder_helper MODE
//   usr1   5 allreduces; then rank 0 waits (up to 30 s) until its dump file exists (the test
//          sends it SIGUSR1 meanwhile), the others wait in a barrier; then one more
//          allreduce on every rank and "continued" (the rank kept running)
//   stop   (tcp, FR_MEET_DIR set) one allreduce; once every other rank has completed it
//          (files in FR_MEET_DIR), rank 1 SIGSTOPs itself and the others run another
//          allreduce, which must fail within the peer timeout naming rank 1: they print the
//          error, wait until every survivor has (files in FR_MEET_DIR) and exit 3 (0 would
//          mean it completed)
// Exit code 0 when the rank saw what it should; the failure is printed otherwise.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/comm/process_group.h"

using namespace paratrain;
using namespace paratrain::comm;

static int usr1() {
  auto pg = create_process_group_from_env();
  std::vector<float> x(16, 1.0f);
  for (int i = 0; i < 5; ++i) pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  if (pg->rank() == 0) {
    const std::string dump = flight_dump_path(FlightRecorder::instance().dump_dir(), 0);
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!std::filesystem::exists(dump) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!std::filesystem::exists(dump)) {
      std::fprintf(stderr, "no dump at %s after 30 s\n", dump.c_str());
      return 1;
    }
  }
  pg->barrier()->wait();
  pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  float want = 1.0f;
  for (int i = 0; i < 6; ++i) want *= static_cast<float>(pg->size());
  if (x[0] != want) {
    std::fprintf(stderr, "wrong sum %g\n", x[0]);
    return 1;
  }
  std::printf("rank %d continued\n", pg->rank());
  return 0;
}

// Waits (30 s at most) until FR_MEET_DIR holds `count` files whose names start with `prefix`.
static void wait_for_files(const std::string& dir, const std::string& prefix, long count) {
  auto arrived = [&] {
    long n = 0;
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().filename().string().rfind(prefix, 0) == 0) ++n;
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (arrived() < count && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

static void put_file(const std::string& dir, const std::string& name) {
  std::fclose(std::fopen((dir + "/" + name).c_str(), "w"));
}

static int stop() {
  const char* meet_env = std::getenv("FR_MEET_DIR");
  if (meet_env == nullptr) {
    std::fprintf(stderr, "stop needs FR_MEET_DIR\n");
    return 2;
  }
  const std::string meet = meet_env;
  auto pg = create_process_group_from_env();
  std::vector<float> x(16, 1.0f);
  pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  if (pg->rank() == 1) {
    // The call completed here, but its last bytes for the peers may still be in the tcp
    // sender threads, which SIGSTOP stops too: stop only once every peer has completed it.
    wait_for_files(meet, "completed_", pg->size() - 1);
    std::printf("rank 1 stops itself\n");
    std::fflush(stdout);
    ::raise(SIGSTOP);
    return 0;
  }
  put_file(meet, "completed_" + std::to_string(pg->rank()));
  try {
    pg->allreduce(x.data(), x.size(), DType::F32)->wait();
  } catch (const Error& e) {
    std::printf("rank %d: %s\n", pg->rank(), e.what());
    std::fflush(stdout);
    // The survivors leave together: one that exited at once could be noticed (its connection
    // closes) before the other survivor noticed rank 1's silence on its own.
    put_file(meet, "failed_" + std::to_string(pg->rank()));
    wait_for_files(meet, "failed_", pg->size() - 1);
    return 3;
  }
  std::printf("rank %d: the allreduce completed without rank 1\n", pg->rank());
  return 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  try {
    if (mode == "usr1") return usr1();
    if (mode == "stop") return stop();
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}
