#include "comm/transport/mesh_transport.h"

#include <fstream>

#include "comm/net/socket.h"

namespace paratrain::comm {
namespace {

std::string host_id() {
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  return net::host_name() + "/" + boot;
}

class MeshTransport : public Transport {
 public:
  MeshTransport(Store& store, int rank, int size, const TransportConfig& config, const Deadline& deadline) {
    rank_ = rank;
    size_ = size;
    pairs_.assign(size, nullptr);
    std::string me = host_id();
    store.set("host/" + std::to_string(rank), me);
    std::vector<int> local, remote;
    for (int p = 0; p < size; ++p) {
      if (p == rank) continue;
      std::string other = store.get("host/" + std::to_string(p));
      bool same = other == me;
      if (config.backend == "shm" && !same)
        PT_THROW(CommError, "backend shm: rank ", p, " runs on another host (", other.substr(0, other.find('/')),
                 "); use --backend tcp or auto");
      if (config.backend == "tcp" || !same) remote.push_back(p);
      else local.push_back(p);
    }
    size_t slot = std::min(config.shm.slot_bytes, config.tcp.slot_bytes);
    slot = (std::max<size_t>(slot, 4096) + 63) / 64 * 64;
    shm::ShmConfig sc = config.shm;
    sc.slot_bytes = slot;
    tcp::TcpConfig tc = config.tcp;
    tc.slot_bytes = slot;
    shm_ = std::make_unique<shm::ShmDomain>(store, rank, size, local, sc, deadline);
    tcp_ = std::make_unique<tcp::TcpDomain>(store, rank, size, remote, tc, deadline);
    for (int p : local) pairs_[p] = shm_->pair(p);
    for (int p : remote) pairs_[p] = tcp_->pair(p);
    slot_bytes_ = slot;
    name_ = local.empty() ? (remote.empty() ? config.backend == "tcp" ? "tcp" : "shm" : "tcp")
                          : (remote.empty() ? "shm" : "shm+tcp");
  }
  ~MeshTransport() override {
    tcp_.reset();
    shm_.reset();
  }
  std::string name() const override { return name_; }

 private:
  std::unique_ptr<shm::ShmDomain> shm_;
  std::unique_ptr<tcp::TcpDomain> tcp_;
  std::string name_;
};

}  // namespace

std::unique_ptr<Transport> create_transport(Store& store, int rank, int size, const TransportConfig& config,
                                            const Deadline& deadline) {
  return std::make_unique<MeshTransport>(store, rank, size, config, deadline);
}

}  // namespace paratrain::comm
