// shm: pairs between processes on one host through POSIX shared memory.
//
// Each rank creates one segment holding the receive channels of all its local peers
// (channel s->me at index s). A channel is a ring of `slots` slots of `slot_bytes` each
// (the staging area of that direction, PARATRAIN_SHM_STAGING_BYTES, default 4 MiB) with a
// head counter (slots published, written by the sender) and a tail counter (slots freed,
// written by the receiver). Steady state is pure loads and stores on those counters: a
// waiter spins, then yields, then sleeps on a futex, and the other side issues a futex wake
// only when the waiter announced it sleeps. So there is no system call per slot while both
// sides keep up.
//
// Lifetime of the segments: created, published in the store, mapped by every peer, then
// unlinked by their creator as soon as all peers have mapped them, so nothing is left in
// /dev/shm even after a SIGKILL. Segments of crashed processes that died before that point
// (their name carries the creator's pid) are removed by the next group created on the host.
//
// Liveness: a monitor thread bumps this rank's heartbeat every 20 ms and checks each peer's
// pid (gone or zombie = dead) and heartbeat (silent for peer_timeout_s = dead), and wakes
// every waiter so it fails with PeerFailure naming the rank.
//
// Leaving: a rank whose group is destroyed sets `closed` in its segment after everything it
// sent, and wakes its peers' waiters. A peer that closed is not dead when its process exits
// or its heartbeat stops; it fails only the waits on its own pair that can no longer
// complete (a receive once its channel is drained, a send that needs a slot it would free).
// Waits on other pairs go on: a rank may leave as soon as its part of a collective is done.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/transport/transport.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm::shm {

struct ShmConfig {
  size_t staging_bytes = 4u << 20;  // per direction of each pair
  size_t slot_bytes = 512u << 10;
  double peer_timeout_s = 10;
};

class ShmDomain {
 public:
  // Collective over `peers` (global ranks of this transport, excluding `rank`): creates and
  // maps the segments through `store`.
  ShmDomain(Store& store, int rank, int size, const std::vector<int>& peers, const ShmConfig& config,
            const Deadline& deadline);
  ~ShmDomain();
  ShmDomain(const ShmDomain&) = delete;
  ShmDomain& operator=(const ShmDomain&) = delete;
  Pair* pair(int peer);
  size_t slot_bytes() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Removes /dev/shm/paratrain-<pid>-* segments whose creator process no longer exists.
void remove_stale_segments();

}  // namespace paratrain::comm::shm
