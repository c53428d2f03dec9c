#include "paratrain/base/env.h"

#include <cstdlib>

#include "paratrain/base/error.h"

namespace paratrain::env {

const std::vector<VarInfo>& declared() {
  static const std::vector<VarInfo> vars = {
      {"PARATRAIN_TOKEN", "", "shared secret of a job's store (set by the launcher)"},
      {"PARATRAIN_DEBUG", "", "'detail' makes ranks compare a fingerprint of every collective"},
      {"PARATRAIN_THREADS", "", "compute threads per rank (default: the host's cores split among local ranks)"},
      {"PARATRAIN_COMM_TIMEOUT_S", "300", "deadline of one collective, seconds"},
      {"PARATRAIN_PEER_TIMEOUT_S", "10", "seconds after which a silent dead peer fails pending collectives"},
      {"PARATRAIN_BACKEND", "auto", "communication backend: auto|shm|tcp|mpi|nccl"},
      {"PARATRAIN_SHM_STAGING_BYTES", "4194304", "shared-memory staging area per peer pair, bytes"},
      {"PARATRAIN_TCP_STREAMS", "2", "TCP connections per peer pair"},
      {"PARATRAIN_SEGMENT_BYTES", "0", "ring segment size in bytes (0 = automatic)"},
      {"PARATRAIN_TCP_ADDR", "", "address this rank advertises for tcp connections (default: first non-loopback IPv4)"},
      {"PARATRAIN_STORE_EXTERNAL", "0", "1 = the store is hosted by the launcher; rank 0 does not start one"},
      {"PARATRAIN_STORE_PORT", "",
       "port of the job's paratrain store on MASTER_ADDR, hosted by `paratrain launch` (set by it); every rank "
       "joins it as a client and none hosts one, leaving MASTER_PORT to the program (e.g. PyTorch's rank 0 "
       "TCPStore). Unset: the store is on MASTER_PORT"},
      {"PARATRAIN_SPAWNED_BY", "",
       "set by paratrain::spawn() in the ranks it starts: the spawning process's pid (such a rank runs the "
       "spawned function and exits)"},
      {"PARATRAIN_FR_BUFFER", "2000",
       "flight recorder: how many recent collectives and send/recvs each rank keeps (0 = off)"},
      {"PARATRAIN_FR_DUMP_DIR", "",
       "flight recorder: directory for rank_<R>.fr.json dumps (on a deadline, a failure, SIGUSR1) and progress "
       "files (set by `paratrain launch`; unset = no dumps)"},
      {"PARATRAIN_SLOW_RANK_LAG", "0.25",
       "rank 0's progress line names the slowest rank when its compute + data-wait time exceeds the median "
       "rank's by more than this fraction"},
      {"PARATRAIN_CUDA_ATTENTION", "gemm",
       "the CUDA attention kernels: gemm (batched f32 cuBLASLt GEMMs over every head, chunks of query rows), "
       "gemm-bf16 (the same; bf16 attention with bf16 products on tensor cores), flash (bf16 and f16: fused kernels "
       "on tensor cores, no T x T matrix, P and dS rounded to the 16-bit type as FlashAttention does; f32: their "
       "f32-arithmetic twins on the CUDA cores, f32 FMAs throughout) or tiles (every dtype by the f32-arithmetic "
       "flash kernels: no T x T matrix, the CPU's f32 products; what they do not take as gemm)"},
      {"PARATRAIN_PROFILE", "0", "1 = time every op forward and backward and print a table after training"},
      {"PARATRAIN_LOG", "info",
       "diagnostic log level, for every subsystem and optionally per tag: LEVEL[,TAG=LEVEL...] with LEVEL "
       "debug|info|warn|error and TAG general|comm|launch|train|data|checkpoint|parallel|monitor (e.g. "
       "warn,comm=debug)"},
      {"PARATRAIN_SIMULATE_SLOWDOWN", "",
       "R:F makes rank R behave like a device F times slower (it idles (F-1) x its compute time before each "
       "backward pass); for trying --balance auto"},
      {"PARATRAIN_TEST_KILL_IN_SAVE", "",
       "test hook: R:N makes rank R SIGKILL itself while saving the checkpoint step_N, after its files and before "
       "the manifest (an incomplete checkpoint); only in a group's first attempt (TORCHELASTIC_RESTART_COUNT unset "
       "or 0)"},
      {"PARATRAIN_TEST_STOP_AT_STEP", "",
       "test hook: R:N makes rank R stop itself with SIGSTOP at the start of step N (0-based), a hung rank for the "
       "launcher's --hang-timeout report; only in a group's first attempt (TORCHELASTIC_RESTART_COUNT unset or 0)"},
      {"PARATRAIN_TEST_SKIP_ALLREDUCE", "",
       "test hook: R:N makes rank R skip its first gradient bucket's all-reduce at step N (0-based; DDP without "
       "ZeRO or --compress), a collective the other ranks wait for in vain"},
      {"PARATRAIN_TEST_INJECT_INF", "",
       "test hook: R:N makes rank R put an inf into its reduced gradient at step N (0-based), so the loss scaler "
       "must skip that step on every rank"},
      {"PARATRAIN_TEST_BREAK_REDUCTION", "",
       "test hook: NAME:STEP makes data-parallel rank 1 perturb its reduced gradient of parameter NAME at step "
       "STEP (1-based), as a broken all-reduce would; `paratrain verify` must name that step and tensor"},
  };
  return vars;
}

static const VarInfo& find(const std::string& name) {
  for (const auto& v : declared())
    if (v.name == name) return v;
  PT_CHECK(false, "environment variable ", name, " is not declared in src/base/env.cpp");
}

std::optional<std::string> raw(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

std::optional<int64_t> raw_int(const std::string& name) {
  auto v = raw(name);
  if (!v) return std::nullopt;
  try {
    size_t pos = 0;
    int64_t x = std::stoll(*v, &pos);
    if (pos != v->size()) throw std::invalid_argument("trailing");
    return x;
  } catch (const std::exception&) {
    PT_THROW(InputError, "environment variable ", name, "='", *v, "' is not an integer");
  }
}

std::string get_string(const std::string& name) {
  const VarInfo& info = find(name);
  auto v = raw(name);
  return v ? *v : info.default_value;
}

int64_t get_int(const std::string& name) {
  const VarInfo& info = find(name);
  if (auto v = raw_int(name)) return *v;
  return info.default_value.empty() ? 0 : std::stoll(info.default_value);
}

double get_double(const std::string& name) {
  const VarInfo& info = find(name);
  std::string s = raw(name).value_or(info.default_value);
  if (s.empty()) return 0.0;
  try {
    size_t pos = 0;
    double x = std::stod(s, &pos);
    if (pos != s.size()) throw std::invalid_argument("trailing");
    return x;
  } catch (const std::exception&) {
    PT_THROW(InputError, "environment variable ", name, "='", s, "' is not a number");
  }
}

bool get_bool(const std::string& name) {
  std::string s = get_string(name);
  if (s.empty() || s == "0" || s == "false" || s == "off" || s == "no") return false;
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  PT_THROW(InputError, "environment variable ", name, "='", s, "' is not a boolean (0/1)");
}

}  // namespace paratrain::env
