// A rank's Transport in one group: shm pairs to peers on the same host, tcp pairs to the
// others (backend "auto"), or all of one kind ("shm" / "tcp"). Hosts are told apart by
// hostname plus kernel boot id, exchanged through the store.
#pragma once

#include <memory>
#include <string>

#include "comm/transport/shm/shm_transport.h"
#include "comm/transport/tcp/tcp_transport.h"
#include "comm/transport/transport.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm {

struct TransportConfig {
  std::string backend = "auto";  // auto|shm|tcp
  shm::ShmConfig shm;
  tcp::TcpConfig tcp;
};

std::unique_ptr<Transport> create_transport(Store& store, int rank, int size, const TransportConfig& config,
                                            const Deadline& deadline);

}  // namespace paratrain::comm
