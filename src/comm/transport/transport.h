// The point-to-point layer every algorithm is written against (Gloo's Pair/Context, NCCL's
// send/recv primitives).
//
// A Pair is an ordered, reliable channel to one peer made of a ring of fixed-size slots:
// the sender asks for a slot (send_begin), writes up to slot_bytes() into it and publishes
// it (send_end); the receiver gets the oldest published slot (recv_begin), reads it, and
// frees it (recv_end). Algorithms reduce straight from a receive slot into a send slot, so
// shared memory needs no extra copy. Every blocking call takes a deadline and throws
// PeerTimeout (naming the peer) when it passes, or PeerFailure when the peer died or its
// connection broke. At most one send and one receive are open per pair at a time.
//
// The try_ calls are the non-blocking forms used by the point-to-point engine (p2p.h),
// which progresses many pairs from one thread: they return nullptr where the blocking call
// would wait, and throw PeerFailure where it would (a dead peer, a broken connection). A
// peer that closed its group cleanly is no failure for them: peer_left() says so, and a
// try_recv_begin that still returns nullptr after peer_left() returned true will never
// get more data (everything the peer sent is visible once its close is).
//
// A Transport is a rank's set of pairs in one group; it owns liveness monitoring.
// Thread-safety: one thread uses a transport at a time (the group's executing thread).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/deadline.h"
#include "paratrain/base/error.h"

namespace paratrain::comm {

// A peer died, left, or its connection broke.
class PeerFailure : public CommError {
 public:
  PeerFailure(int peer, const std::string& what) : CommError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// A wait on a peer passed its deadline.
class PeerTimeout : public TimeoutError {
 public:
  PeerTimeout(int peer, const std::string& what) : TimeoutError(what), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

class Pair {
 public:
  virtual ~Pair() = default;
  virtual int peer() const = 0;
  virtual size_t slot_bytes() const = 0;
  virtual void* send_begin(const Deadline& deadline) = 0;
  virtual void send_end(size_t bytes) = 0;
  virtual const void* recv_begin(size_t* bytes, const Deadline& deadline) = 0;
  virtual void recv_end() = 0;
  virtual void* try_send_begin() = 0;
  virtual const void* try_recv_begin(size_t* bytes) = 0;
  virtual bool peer_left() = 0;
  // Has the transport call `fn` (from its own threads, possibly under its locks: fn must
  // only signal) whenever data arrived, a send slot freed or the pair broke, so a caller of
  // the try_ calls may sleep until then. False where it cannot (shm: the peer writes the
  // ring itself): the caller must poll.
  virtual bool set_wakeup(std::function<void()> fn) {
    (void)fn;
    return false;
  }
};

class Transport {
 public:
  virtual ~Transport() = default;
  int rank() const { return rank_; }
  int size() const { return size_; }
  Pair& pair(int peer) { return *pairs_[peer]; }
  // Smallest slot size over all pairs (algorithms segment by it).
  size_t slot_bytes() const { return slot_bytes_; }
  // "shm", "tcp", or "shm+tcp".
  virtual std::string name() const = 0;

 protected:
  int rank_ = 0;
  int size_ = 1;
  size_t slot_bytes_ = 0;
  std::vector<Pair*> pairs_;  // owned by the subclass; nullptr at rank_
};

}  // namespace paratrain::comm
