// tcp: pairs between any two hosts over TCP, with several connections (streams) per pair.
//
// Segment i of a pair travels on stream i mod S (PARATRAIN_TCP_STREAMS), so S segments are
// on the wire at once; the receiver puts each segment into its slot by sequence number, so
// the pair stays an ordered channel. Each stream has a sender and a receiver thread; the
// algorithm thread only fills and drains slots. The rank with the higher number connects
// to the lower one, which listens on an ephemeral port published in the store together
// with a random cookie that the connecting side must echo (the store itself is token-
// authenticated). Binding to all interfaces and connecting to the published address works
// between network namespaces as long as the address is routable.
//
// Liveness: a peer that dies closes its sockets (the kernel does it on SIGKILL), so the
// receiver sees EOF and the waits on that pair fail with PeerFailure naming the rank. A peer
// that is alive but stopped (SIGSTOP), or whose host froze, closes nothing: so each stream's
// sender sends a heartbeat (a 4-byte marker in place of a segment's length) whenever it sent
// nothing for peer_timeout_s / 5 (at most 1 s), and a receiver that heard nothing at all on
// its stream for peer_timeout_s (PARATRAIN_PEER_TIMEOUT_S) fails the pair, naming the rank
// ("stopped responding"), like shm's heartbeat. A receiver that waits for its own rank to
// free a slot does not count that time as silence. A peer
// that closes its group cleanly first sends a goodbye on each stream after its last segment:
// the waits that need more of its data then fail ("left the group") once they have consumed
// everything it sent, and the close is never blamed for another pair's failure.
#pragma once

#include <memory>
#include <vector>

#include "comm/transport/transport.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm::tcp {

struct TcpConfig {
  int streams = 2;
  size_t slot_bytes = 512u << 10;
  size_t slots = 8;
  double peer_timeout_s = 10;  // silence after which a peer counts as dead (<= 0: never)
};

class TcpDomain {
 public:
  TcpDomain(Store& store, int rank, int size, const std::vector<int>& peers, const TcpConfig& config,
            const Deadline& deadline);
  ~TcpDomain();
  TcpDomain(const TcpDomain&) = delete;
  TcpDomain& operator=(const TcpDomain&) = delete;
  Pair* pair(int peer);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace paratrain::comm::tcp
