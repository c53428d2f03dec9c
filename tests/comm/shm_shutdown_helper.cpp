// A rank program for the shutdown test of process_group_multiprocess_test (RankExits): the
// end of a run, where one rank finishes its part of the last collective, destroys its group
// and exits while its peers are still in that collective. Started 3 times with RANK,
// WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and PARATRAIN_BACKEND, PARATRAIN_PEER_TIMEOUT_S).
//   rank 0  the root of a chain broadcast 0 -> 1 -> 2: sends its buffer and exits
//   rank 1  enters the broadcast once rank 0's process is gone and twice the peer timeout
//           has passed (so a clean exit taken for a death or a silent peer would show)
//   rank 2  waits in the broadcast all along, for data that rank 1 forwards
// Exit code 0 when ranks 1 and 2 got rank 0's data; the failure is printed otherwise.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comm/comm_check.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"

using namespace paratrain;
using namespace paratrain::comm;
using namespace paratrain::comm::testing;

namespace {

// Gone or a zombie (the test reaps its children every 10 ms).
bool process_gone(int64_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  if (!f) return true;
  std::string line;
  std::getline(f, line);
  auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

int run() {
  auto pg = create_process_group_from_env();
  const int n = pg->size(), r = pg->rank();
  if (n != 3) {
    std::fprintf(stderr, "shm_shutdown_helper needs 3 ranks, not %d\n", n);
    return 1;
  }
  int64_t mine = ::getpid();
  std::vector<int64_t> pids(n);
  pg->allgather(&mine, pids.data(), 1, DType::I64)->wait();
  const size_t count = 300000;  // 1.2 MB: 3 segments of 512 KiB, within the 4 MiB staging ring
  std::vector<char> buf(count * 4);
  for (size_t i = 0; i < count; ++i) put(buf, DType::F32, i, value(r, i));
  if (r == 1) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);  // a hang bound
    while (!process_gone(pids[0])) {
      if (std::chrono::steady_clock::now() > until) {
        std::fprintf(stderr, "rank 1: rank 0 (pid %lld) still runs after 30 s\n", static_cast<long long>(pids[0]));
        return 1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // Twice the peer timeout, and at least ten periods (20 ms) of the shm liveness monitor.
    const double hold = std::max(0.2, 2 * env::get_double("PARATRAIN_PEER_TIMEOUT_S"));
    std::this_thread::sleep_for(std::chrono::duration<double>(hold));
  }
  pg->broadcast(buf.data(), count, DType::F32, 0)->wait();
  if (r == 0) {
    std::printf("rank 0 sent its broadcast and leaves (%s)\n", pg->backend_name().c_str());
    return 0;
  }
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) wrong += get(buf, DType::F32, i) != value(0, i);
  if (wrong) {
    std::fprintf(stderr, "rank %d: %zu wrong elements of rank 0's broadcast\n", r, wrong);
    return 1;
  }
  std::printf("rank %d got rank 0's broadcast after rank 0 exited (%s)\n", r, pg->backend_name().c_str());
  return 0;
}

}  // namespace

int main() {
  try {
    return run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank program failed: %s\n", e.what());
    return 1;
  }
}
