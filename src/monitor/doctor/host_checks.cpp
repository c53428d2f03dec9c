// host_checks(): the CPU, memory and clock of this host.
#include <sched.h>
#include <sys/timex.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "monitor/doctor/check_util.h"
#include "paratrain/base/env.h"
#include "paratrain/kernels/cpu.h"

namespace paratrain::monitor::doctor {
namespace {

using detail::make;

int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return static_cast<int>(std::thread::hardware_concurrency());
  return CPU_COUNT(&set);
}

// Ranks on this host as the launcher (or mpirun) says; 1 outside a job.
int local_ranks_from_env() {
  for (const char* n : {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (auto v = env::raw(n)) try {
        return std::max(1, std::stoi(*v));
      } catch (const std::exception&) {
      }
  return 1;
}

bool spans_hosts() {
  auto world = env::raw("WORLD_SIZE");
  auto local = env::raw("LOCAL_WORLD_SIZE");
  return world && local && *world != *local;
}

void cpu(std::vector<Check>& out) {
  std::string model = detail::proc_field("/proc/cpuinfo", "model name").value_or("unknown");
  out.push_back(make("cpu.model", Status::kPass, model, "", {{"model", model}}));

  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  const int usable = affinity_cores();
  nlohmann::json d = {{"cores", hw}, {"usable", usable}};
  std::string v = std::to_string(hw) + " logical cores";
  if (usable != hw) v += ", " + std::to_string(usable) + " usable by this process (affinity)";
  out.push_back(make("cpu.cores", Status::kPass, v, "", d));

  // The flags the kernels choose their code by (__builtin_cpu_supports, as they do).
  __builtin_cpu_init();
  struct Flag {
    const char* key;  // /proc/cpuinfo's spelling
    bool on;
  };
  const Flag flags[] = {{"sse4_2", bool(__builtin_cpu_supports("sse4.2"))},
                        {"avx", bool(__builtin_cpu_supports("avx"))},
                        {"avx2", bool(__builtin_cpu_supports("avx2"))},
                        {"fma", bool(__builtin_cpu_supports("fma"))},
                        {"f16c", bool(__builtin_cpu_supports("f16c"))},
                        {"avx512f", bool(__builtin_cpu_supports("avx512f"))},
                        {"avx512bw", bool(__builtin_cpu_supports("avx512bw"))},
                        {"avx512_bf16", bool(__builtin_cpu_supports("avx512bf16"))},
                        {"amx_bf16", bool(__builtin_cpu_supports("amx-bf16"))}};
  nlohmann::json fd = nlohmann::json::object();
  std::string have, lack;
  for (const auto& f : flags) {
    fd[f.key] = f.on;
    std::string& list = f.on ? have : lack;
    if (!list.empty()) list += ' ';
    list += f.key;
  }
  const bool fast = fd["avx2"].get<bool>() && fd["fma"].get<bool>();
  out.push_back(make("cpu.vector", fast ? Status::kPass : Status::kWarn,
                     (have.empty() ? "none" : have) + (lack.empty() ? "" : " (no " + lack + ")"),
                     fast ? "" : "the f32 kernels fall back to narrower code: run on a CPU with AVX2 and FMA (x86-64-v3) for speed",
                     fd));

  // Threads: what a training rank computes with (the trainer's rule: PARATRAIN_THREADS, else
  // the cores split among the host's ranks), and whether the host's ranks oversubscribe it.
  const int local = local_ranks_from_env();
  int64_t set = 0;
  try {
    set = env::get_int("PARATRAIN_THREADS");
  } catch (const std::exception&) {  // malformed: env.PARATRAIN_THREADS reports it
  }
  const int threads = set > 0 ? static_cast<int>(set) : std::max(1, std::max(1, hw) / local);
  nlohmann::json td = {{"threads", threads}, {"from", set > 0 ? "PARATRAIN_THREADS" : "cores / local ranks"},
                       {"local_ranks", local}, {"usable_cores", usable}, {"kernel_threads", kernels::cpu::num_threads()}};
  std::string tv = std::to_string(threads) + (threads == 1 ? " thread" : " threads") + " per rank (" + (set > 0 ? "PARATRAIN_THREADS" : "cores / local ranks") +
                   ") x " + std::to_string(local) + " rank" + (local > 1 ? "s" : "") + " on this host, " +
                   std::to_string(usable) + " usable cores";
  if (threads * local > usable)
    out.push_back(make("cpu.threads", Status::kWarn, tv + ": oversubscribed",
                       "set PARATRAIN_THREADS=" + std::to_string(std::max(1, usable / local)) +
                           " (usable cores / local ranks) so ranks do not fight for cores",
                       td));
  else
    out.push_back(make("cpu.threads", Status::kPass, tv, "", td));

  auto gov = detail::read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
  if (!gov)
    out.push_back(make("cpu.governor", Status::kSkip, "no cpufreq governor exposed (virtual machine or container)"));
  else if (*gov == "powersave")
    out.push_back(make("cpu.governor", Status::kWarn, *gov,
                       "the cores may run below their clock: `cpupower frequency-set -g performance` (as root)",
                       {{"governor", *gov}}));
  else
    out.push_back(make("cpu.governor", Status::kPass, *gov, "", {{"governor", *gov}}));
}

double meminfo_bytes(const std::string& key) {
  auto v = detail::proc_field("/proc/meminfo", key);
  if (!v) return -1;
  return std::stod(*v) * 1024.0;  // "12345 kB"
}

void memory(std::vector<Check>& out) {
  const double total = meminfo_bytes("MemTotal"), avail = meminfo_bytes("MemAvailable");
  if (total <= 0 || avail < 0) {
    out.push_back(make("memory.available", Status::kSkip, "/proc/meminfo not readable"));
    return;
  }
  nlohmann::json d = {{"total_bytes", total}, {"available_bytes", avail}};
  std::string v = detail::human_bytes(avail) + " available of " + detail::human_bytes(total);
  const double kLow = 2.0 * (1u << 30);
  if (avail < kLow || avail < 0.1 * total)
    out.push_back(make("memory.available", Status::kWarn, v,
                       "little free memory: stop other jobs, or lower --micro-batch, use --recompute or --zero 1|2", d));
  else
    out.push_back(make("memory.available", Status::kPass, v, "", d));

  // cgroup limit (v2, else v1): a container may allow far less than the host has.
  std::optional<std::string> lim = detail::read_text("/sys/fs/cgroup/memory.max");
  if (!lim) lim = detail::read_text("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  if (!lim || *lim == "max" || std::stod(*lim) >= total) {
    out.push_back(make("memory.limit", Status::kPass, lim ? "no cgroup limit below the host's memory" : "no cgroup limit found",
                       "", {{"limit_bytes", nullptr}}));
  } else {
    const double l = std::stod(*lim);
    nlohmann::json ld = {{"limit_bytes", l}};
    std::string lv = "cgroup limit " + detail::human_bytes(l) + " (host " + detail::human_bytes(total) + ")";
    if (l < kLow)
      out.push_back(make("memory.limit", Status::kWarn, lv,
                         "the container may be killed for memory: raise its limit (docker run --memory=...)", ld));
    else
      out.push_back(make("memory.limit", Status::kPass, lv, "", ld));
  }
}

void clock(std::vector<Check>& out) {
  auto src = detail::read_text("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  if (!src) {
    out.push_back(make("clock.source", Status::kSkip, "no /sys/devices/system/clocksource (not Linux?)"));
  } else {
    const bool slow = *src == "hpet" || *src == "acpi_pm" || *src == "jiffies" || *src == "pit";
    auto avail = detail::read_text("/sys/devices/system/clocksource/clocksource0/available_clocksource").value_or("");
    out.push_back(make("clock.source", slow ? Status::kWarn : Status::kPass, *src,
                       slow ? "reading the clock traps into the kernel (slow timestamps in traces and metrics); "
                              "available: " + avail + "; choose tsc: echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource"
                            : "",
                       {{"source", *src}, {"available", avail}}));
  }

  // steady_clock: monotonic over many reads, its resolution and the cost of one read.
  using clk = std::chrono::steady_clock;
  constexpr int kReads = 200000;
  auto first = clk::now(), prev = first;
  int64_t min_step = INT64_MAX;
  bool backwards = false;
  for (int i = 0; i < kReads; ++i) {
    auto t = clk::now();
    if (t < prev) backwards = true;
    int64_t step = std::chrono::duration_cast<std::chrono::nanoseconds>(t - prev).count();
    if (step > 0 && step < min_step) min_step = step;
    prev = t;
  }
  const double ns_per_read = std::chrono::duration<double, std::nano>(prev - first).count() / kReads;
  nlohmann::json sd = {{"is_steady", clk::is_steady}, {"monotonic", !backwards},
                       {"resolution_ns", min_step == INT64_MAX ? -1 : min_step}, {"ns_per_read", ns_per_read}};
  char buf[128];
  std::snprintf(buf, sizeof(buf), "monotonic, resolution %lld ns, %.0f ns per read", (long long)min_step, ns_per_read);
  if (backwards || !clk::is_steady)
    out.push_back(make("clock.steady", Status::kFail, "steady_clock went backwards",
                       "deadlines and timings are unreliable: fix the kernel clock source (see clock.source)", sd));
  else if (ns_per_read > 1000)
    out.push_back(make("clock.steady", Status::kWarn, buf,
                       "timestamps are slow to read: choose the tsc clock source (see clock.source)", sd));
  else
    out.push_back(make("clock.steady", Status::kPass, buf, "", sd));

  // NTP state of the system clock (read-only adjtimex): what merged traces across hosts need.
  struct timex tx {};
  tx.modes = 0;
  int state = ::adjtimex(&tx);
  if (state < 0) {
    out.push_back(make("clock.sync", Status::kSkip, "adjtimex() not permitted here"));
  } else {
    const bool synced = state != TIME_ERROR;
    nlohmann::json cd = {{"synchronised", synced}, {"est_error_us", tx.esterror}};
    if (synced)
      out.push_back(make("clock.sync", Status::kPass, "synchronised (estimated error " + std::to_string(tx.esterror) + " us)", "", cd));
    else if (spans_hosts())
      out.push_back(make("clock.sync", Status::kWarn, "system clock not synchronised by NTP",
                         "run chronyd or systemd-timesyncd on every host, or traces of different hosts will not line up", cd));
    else
      out.push_back(make("clock.sync", Status::kPass, "system clock not synchronised by NTP (matters only across hosts)", "", cd));
  }
}

}  // namespace

std::vector<Check> host_checks() {
  std::vector<Check> out;
  detail::guarded(out, "cpu", cpu);
  detail::guarded(out, "memory", memory);
  detail::guarded(out, "clock", clock);
  return out;
}

}  // namespace paratrain::monitor::doctor
