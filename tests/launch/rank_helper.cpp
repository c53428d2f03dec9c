// A rank for the launcher's tests. Options (any order), acted on in this order:
//   --pid-dir D           write getpid() to D/rank_<RANK>.pid
//   --env                 print the launcher's variables as KEY=VALUE lines on stdout
//   --store               meet the other ranks through the launcher's store (MASTER_ADDR,
//                         PARATRAIN_STORE_PORT, PARATRAIN_TOKEN), then print
//                         STORE_OK world=<n> arrived_at=<i> (i counts arrivals in this store)
//   --lines N             print N lines "line <i> of rank <RANK> ..." on stdout
//   --stderr TEXT         print TEXT on stderr
//   --ignore-term         ignore SIGTERM
//   --fail-rank R         the rank that fails (default: none)
//   --fail-delay S        seconds before it fails (default 0)
//   --code C              it exits with C ...
//   --kill                ... or kills itself with SIGKILL
//   --only-first-attempt  it fails only while TORCHELASTIC_RESTART_COUNT is 0
//   --sleep S             every rank that does not fail sleeps S seconds, then exits 0
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "paratrain/comm/store.h"

static std::string env_or(const char* k, const char* d = "") {
  const char* v = std::getenv(k);
  return v ? v : d;
}

int main(int argc, char** argv) {
  std::string pid_dir, stderr_text;
  bool print_env = false, use_store = false, ignore_term = false, kill_self = false, only_first = false;
  int lines = 0, fail_rank = -1, code = 1;
  double fail_delay = 0, sleep_s = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--pid-dir") pid_dir = next();
    else if (a == "--env") print_env = true;
    else if (a == "--store") use_store = true;
    else if (a == "--lines") lines = std::atoi(next().c_str());
    else if (a == "--stderr") stderr_text = next();
    else if (a == "--ignore-term") ignore_term = true;
    else if (a == "--fail-rank") fail_rank = std::atoi(next().c_str());
    else if (a == "--fail-delay") fail_delay = std::atof(next().c_str());
    else if (a == "--code") code = std::atoi(next().c_str());
    else if (a == "--kill") kill_self = true;
    else if (a == "--only-first-attempt") only_first = true;
    else if (a == "--sleep") sleep_s = std::atof(next().c_str());
    else {
      std::fprintf(stderr, "rank_helper: unknown option %s\n", a.c_str());
      return 64;
    }
  }
  int rank = std::atoi(env_or("RANK", "-1").c_str());
  if (ignore_term) ::signal(SIGTERM, SIG_IGN);
  if (!pid_dir.empty()) {
    std::string path = pid_dir + "/rank_" + std::to_string(rank) + ".pid";
    std::string tmp = path + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(::getpid()));
      std::fclose(f);
      std::rename(tmp.c_str(), path.c_str());
    }
  }
  if (print_env) {
    static const char* kVars[] = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR",
                                  "MASTER_PORT", "PARATRAIN_TOKEN", "TORCHELASTIC_RESTART_COUNT",
                                  "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "PARATRAIN_STORE_EXTERNAL",
                                  "PARATRAIN_STORE_PORT", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
                                  "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS", "PARATRAIN_THREADS", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                                  "PMI_RANK"};
    std::string out;
    for (const char* k : kVars) out += std::string(k) + "=" + env_or(k, "<unset>") + "\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  if (use_store) {
    try {
      auto base = std::make_shared<paratrain::comm::TcpStore>(env_or("MASTER_ADDR"), std::atoi(env_or("PARATRAIN_STORE_PORT").c_str()),
                                                              env_or("PARATRAIN_TOKEN"), std::chrono::milliseconds(20000),
                                                              std::chrono::milliseconds(20000));
      // No per-attempt prefix: the launcher's store is fresh for every attempt.
      paratrain::comm::PrefixStore store("helper", base);
      int world = std::atoi(env_or("WORLD_SIZE").c_str());
      store.set("rank/" + std::to_string(rank), std::to_string(::getpid()));
      int64_t n = store.add("arrived", 1);
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
      store.wait(keys, std::chrono::milliseconds(20000));
      std::printf("STORE_OK world=%d arrived_at=%lld\n", world, static_cast<long long>(n));
      std::fflush(stdout);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "store failed: %s\n", e.what());
      return 5;
    }
  }
  for (int i = 0; i < lines; ++i) std::printf("line %d of rank %d: the quick brown fox jumps over the lazy dog\n", i, rank);
  std::fflush(stdout);
  if (!stderr_text.empty()) {
    std::fprintf(stderr, "%s\n", stderr_text.c_str());
    std::fflush(stderr);
  }
  bool first = env_or("TORCHELASTIC_RESTART_COUNT", "0") == "0";
  if (rank == fail_rank && (!only_first || first)) {
    std::this_thread::sleep_for(std::chrono::duration<double>(fail_delay));
    std::fprintf(stderr, "rank %d failing on purpose\n", rank);
    std::fflush(stderr);
    if (kill_self) ::raise(SIGKILL);
    return code;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  return 0;
}
