// P2pEngine: the non-blocking send/recv of the shm and tcp groups.
//
// It owns a Transport of its own (pairs no collective uses), so a message in flight never
// sits between two collectives on a channel, and it progresses every pending send and recv
// of the group from one thread with the pairs' non-blocking calls (try_send_begin /
// try_recv_begin): no operation waits for another one to finish.
//
// Protocol on each directed pair: every slot carries a 32-byte frame header.
//  - A message of up to kEagerBytes (64 KiB, less where slots are smaller) travels at once
//    (EAGER: header + data) and its send completes when it is in the slot. The receiver
//    copies it into the matching recv, or keeps a copy until that recv is posted.
//  - A larger message is a rendezvous: the sender announces it (RTS); the receiver answers
//    CTS once the matching recv is posted (NACK where the recv's dtype/count differ); then
//    the sender streams DATA frames (slot size less the header) and its send completes when
//    the last one is in a slot; the recv completes when the last one is copied out.
// So a receive channel is always drained (data only moves once its destination is known),
// and a large send never waits for anything but its own recv: any set of posted sends and
// recvs completes once every send's matching recv is posted, whatever the order.
//
// Matching: announcements travel in posting order, and the k-th send from a to b with tag
// t matches the k-th recv on b from a with tag t (FIFO per source, destination and tag);
// different tags match independently.
//
// Deadlines: each operation must complete within timeout_s of being posted; otherwise it
// fails with a TimeoutError naming the rank, the operation (its Work's description: op,
// sequence number, dtype, count, bytes, peer, tag) and what it waited for. Any failure (a
// deadline, a dead or departed peer, a mismatch) fails every pending operation and is
// reported through on_failure (the group is unusable afterwards).
//
// The progress thread starts with the first operation and sleeps whenever none is
// pending; while some are, it spins, then yields, then polls every 0.1-1 ms.
// Thread-safety: post_* may be called from any thread; posting order defines matching
// order. The destructor waits until every posted operation finished (each has a deadline).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "comm/transport/transport.h"
#include "paratrain/comm/work.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm {

class P2pEngine {
 public:
  // `transport` is used by this engine only and outlives it.
  P2pEngine(Transport* transport, double timeout_s, std::function<void(const std::string&)> on_failure);
  ~P2pEngine();
  P2pEngine(const P2pEngine&) = delete;
  P2pEngine& operator=(const P2pEngine&) = delete;

  // Start an operation; `work` is finished (or failed) when it completes. The buffer stays
  // valid and untouched until then.
  void post_send(const WorkPtr& work, const void* buf, size_t count, DType dtype, int peer, int tag);
  void post_recv(const WorkPtr& work, void* buf, size_t count, DType dtype, int peer, int tag);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace paratrain::comm
