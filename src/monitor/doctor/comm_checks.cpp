// comm_checks(): what the communication backends need from this host: MPI, /dev/shm, ports,
// the host's name and the address tcp advertises.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "monitor/doctor/check_util.h"
#include "paratrain/base/env.h"

namespace paratrain::monitor::doctor {
namespace {

using detail::make;

std::string find_on_path(const std::string& prog) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find(':', start);
    std::string dir = p.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::string full = (dir.empty() ? "." : dir) + "/" + prog;
    if (::access(full.c_str(), X_OK) == 0) return full;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return "";
}

void mpi(std::vector<Check>& out) {
#if PARATRAIN_HAVE_MPI
  const bool built = true;
#else
  const bool built = false;
#endif
  const std::string mpirun = find_on_path("mpirun");
  std::string version;
  if (!mpirun.empty())
    if (auto o = detail::command_output(mpirun + " --version", 5)) version = o->substr(0, o->find('\n'));
  const bool under = env::raw("OMPI_COMM_WORLD_RANK") || env::raw("PMI_RANK");
  nlohmann::json d = {{"built", built}, {"mpirun", mpirun}, {"version", version}, {"under_mpirun", under}};
  std::string where = mpirun.empty() ? "no mpirun on PATH" : mpirun + (version.empty() ? "" : " (" + version + ")");
  if (!built)
    out.push_back(make("comm.mpi", Status::kSkip, "this build has no MPI backend; " + where, "", d));
  else if (mpirun.empty())
    out.push_back(make("comm.mpi", Status::kWarn, "MPI backend built in; " + where,
                       "install Open MPI's launcher (apt install openmpi-bin) to start ranks with mpirun, or use `paratrain launch`", d));
  else
    out.push_back(make("comm.mpi", Status::kPass, "MPI backend built in; " + where + (under ? "; running under mpirun" : ""), "", d));
}

bool pid_alive(int pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

void shm(std::vector<Check>& out, const Options& options) {
  struct statvfs st {};
  if (::statvfs("/dev/shm", &st) != 0) {
    out.push_back(make("comm.shm", Status::kFail, std::string("/dev/shm: ") + std::strerror(errno),
                       "the shm backend needs a tmpfs on /dev/shm (mount -t tmpfs tmpfs /dev/shm); else use --backend tcp"));
    return;
  }
  const double total = double(st.f_blocks) * st.f_frsize, avail = double(st.f_bavail) * st.f_frsize;
  // What a job needs: every rank maps a segment of (ranks on the host) x staging bytes per
  // group that uses shm; a job has a world group and a few sub-groups (dp, tp, pp): 3.
  int n = options.local_ranks;
  std::string n_from = "";
  if (n <= 0)
    if (auto l = env::raw("LOCAL_WORLD_SIZE")) n = std::max(1, std::atoi(l->c_str()));
  if (n <= 0) {
    n = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
    n_from = " (ranks assumed: one per core, at most 8)";
  }
  const double staging = double(env::get_int("PARATRAIN_SHM_STAGING_BYTES"));
  const double need = 3.0 * n * n * (staging + (1u << 20));
  // Can a segment actually be created and sized?
  std::string name = "/paratrain-doctor-" + std::to_string(::getpid());
  bool writable = false;
  int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd >= 0) {
    writable = ::ftruncate(fd, 1 << 20) == 0;
    ::close(fd);
    ::shm_unlink(name.c_str());
  }
  int stale = 0;
  if (DIR* dir = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(dir)) {
      std::string nm = e->d_name;
      if (nm.rfind("paratrain-", 0) != 0) continue;
      int pid = std::atoi(nm.c_str() + 10);
      if (pid > 0 && !pid_alive(pid)) ++stale;
    }
    ::closedir(dir);
  }
  nlohmann::json d = {{"total_bytes", total}, {"free_bytes", avail}, {"needed_bytes", need}, {"local_ranks", n},
                      {"staging_bytes", staging}, {"writable", writable}, {"stale_segments", stale}};
  std::string v = detail::human_bytes(avail) + " free of " + detail::human_bytes(total) + "; a job of " +
                  std::to_string(n) + " ranks on this host needs about " + detail::human_bytes(need) + n_from;
  if (stale > 0) v += "; " + std::to_string(stale) + " stale segments of dead ranks (the next job removes them)";
  if (!writable)
    out.push_back(make("comm.shm", Status::kFail, v + "; creating a segment failed: " + std::strerror(errno),
                       "check /dev/shm's permissions (mode 1777) or use --backend tcp", d));
  else if (avail < need)
    out.push_back(make("comm.shm", Status::kFail, v,
                       "enlarge /dev/shm (docker run --shm-size=2g; mount -o remount,size=2G /dev/shm) or lower "
                       "PARATRAIN_SHM_STAGING_BYTES",
                       d));
  else if (total < double(1u << 30))
    out.push_back(make("comm.shm", Status::kWarn, v,
                       "/dev/shm is small (Docker's default is 64 MiB): docker run --shm-size=2g, or lower PARATRAIN_SHM_STAGING_BYTES", d));
  else
    out.push_back(make("comm.shm", Status::kPass, v, "", d));
}

// 0 when port (0 = any) can be bound on all interfaces; else errno. *bound gets the port.
int try_bind(int port, int* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return errno;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(port));
  int err = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(fd, 1) != 0) err = errno;
  if (!err && bound) {
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    *bound = ntohs(a.sin_port);
  }
  ::close(fd);
  return err;
}

void ports(std::vector<Check>& out) {
  int eph = 0;
  int err = try_bind(0, &eph);
  std::string range = detail::read_text("/proc/sys/net/ipv4/ip_local_port_range").value_or("");
  std::replace(range.begin(), range.end(), '\t', '-');
  nlohmann::json d = {{"ephemeral_bind", err == 0}, {"ephemeral_range", range}};
  if (err) {
    out.push_back(make("comm.ports", Status::kFail, std::string("cannot listen on a free port: ") + std::strerror(err),
                       "the tcp backend and the store listen on ports the kernel picks: allow listening sockets "
                       "(container network, seccomp)",
                       d));
    return;
  }
  // The rendezvous port: MASTER_PORT on rank 0 (the launcher leaves it free for the program),
  // else the multi-node default 29500.
  const bool rank0 = env::raw("RANK").value_or("0") == "0";
  const auto mp = env::raw("MASTER_PORT");
  const int port = mp ? std::atoi(mp->c_str()) : 29500;
  std::string v = "listening on a free port works (got " + std::to_string(eph) + ", range " + range + ")";
  d["rendezvous_port"] = port;
  if (!rank0) {
    d["rendezvous_free"] = nullptr;
    out.push_back(make("comm.ports", Status::kPass, v, "", d));
    return;
  }
  int perr = try_bind(port, nullptr);
  d["rendezvous_free"] = perr == 0;
  if (perr)
    out.push_back(make("comm.ports", Status::kWarn,
                       v + "; port " + std::to_string(port) + (mp ? " (MASTER_PORT)" : " (the multi-node default)") +
                           " is taken: " + std::strerror(perr),
                       "another job may hold it: choose another with `paratrain launch --master-port P` (or MASTER_PORT)", d));
  else
    out.push_back(make("comm.ports", Status::kPass,
                       v + "; port " + std::to_string(port) + (mp ? " (MASTER_PORT)" : " (the multi-node default)") + " is free",
                       "", d));
}

struct Iface {
  std::string name, addr;
};
std::vector<Iface> ipv4_interfaces() {
  std::vector<Iface> r;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) != 0) return r;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof(buf));
    r.push_back({i->ifa_name, buf});
  }
  ::freeifaddrs(ifs);
  return r;
}

void host(std::vector<Check>& out) {
  const std::string name = detail::hostname();
  std::vector<std::string> resolved;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(name.c_str(), nullptr, &hints, &res);
  if (gai == 0) {
    for (addrinfo* a = res; a; a = a->ai_next) {
      char buf[INET_ADDRSTRLEN];
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      if (std::find(resolved.begin(), resolved.end(), buf) == resolved.end()) resolved.push_back(buf);
    }
    ::freeaddrinfo(res);
  }
  std::string advertised, via;
  const auto ifs = ipv4_interfaces();
  if (auto a = env::raw("PARATRAIN_TCP_ADDR")) {
    advertised = *a;
    via = "PARATRAIN_TCP_ADDR";
  } else {
    for (const auto& i : ifs)
      if (i.addr.rfind("127.", 0) != 0) {
        advertised = i.addr;
        via = i.name;
        break;
      }
  }
  const bool own = std::any_of(ifs.begin(), ifs.end(), [&](const Iface& i) { return i.addr == advertised; });
  std::string joined;
  for (const auto& r : resolved) joined += (joined.empty() ? "" : ", ") + r;
  nlohmann::json d = {{"hostname", name}, {"resolves_to", resolved}, {"tcp_address", advertised}, {"tcp_address_from", via}};
  std::string v = name + (gai == 0 ? " resolves to " + joined : std::string(" does not resolve (") + ::gai_strerror(gai) + ")") +
                  "; tcp advertises " + (advertised.empty() ? "no address (no non-loopback IPv4)" : advertised + " (" + via + ")");
  const bool multi = env::raw("WORLD_SIZE") && env::raw("LOCAL_WORLD_SIZE") && *env::raw("WORLD_SIZE") != *env::raw("LOCAL_WORLD_SIZE");
  if (gai != 0)
    out.push_back(make("comm.host", Status::kWarn, v, "add the host name to /etc/hosts (or DNS): launchers and MPI look hosts up by name", d));
  else if (!advertised.empty() && via == "PARATRAIN_TCP_ADDR" && !own)
    out.push_back(make("comm.host", Status::kWarn, v + "; not an address of this host",
                       "set PARATRAIN_TCP_ADDR to one of this host's addresses (ip -4 addr)", d));
  else if (advertised.empty() && multi)
    out.push_back(make("comm.host", Status::kFail, v,
                       "ranks on other hosts cannot reach this one: give it a network address or set PARATRAIN_TCP_ADDR", d));
  else
    out.push_back(make("comm.host", Status::kPass, v, "", d));
}

void backends(std::vector<Check>& out) {
  std::vector<std::string> b = {"shm", "tcp"};
#if PARATRAIN_HAVE_MPI
  b.push_back("mpi");
#endif
#if PARATRAIN_HAVE_CUDA
  b.push_back("nccl");
#endif
  std::string v;
  for (const auto& x : b) v += (v.empty() ? "" : ", ") + x;
#if !PARATRAIN_HAVE_CUDA
  v += " (nccl: not in this build)";
#endif
  out.push_back(make("comm.backends", Status::kPass, v, "", {{"backends", b}}));
}

}  // namespace

std::vector<Check> comm_checks(const Options& options) {
  std::vector<Check> out;
  detail::guarded(out, "comm.backends", backends);
  detail::guarded(out, "comm.mpi", mpi);
  detail::guarded(out, "comm.shm", [&](std::vector<Check>& o) { shm(o, options); });
  detail::guarded(out, "comm.ports", ports);
  detail::guarded(out, "comm.host", host);
  return out;
}

}  // namespace paratrain::monitor::doctor
