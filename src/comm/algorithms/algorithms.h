// The collective algorithms, each written once against the Pair interface
// (transport/transport.h) and used by every transport. docs/algorithms.md has a row per
// algorithm with its steps and bytes on the wire; each .cpp opens with the story.
//
// Conventions: ranks are group ranks 0..size-1; `count` is in elements; buffers follow the
// ProcessGroup contract (process_group.h). Every wait uses ctx.deadline. Segments are at
// most ctx.segment_bytes (<= the transport's slot size), and every rank cuts a buffer the
// same way, so both ends of a pair agree on each message's size (checked on receipt).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/deadline.h"
#include "comm/transport/transport.h"
#include "paratrain/comm/types.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm::algorithms {

struct Context {
  Transport* transport = nullptr;
  int rank = 0;
  int size = 1;
  Deadline deadline;
  size_t segment_bytes = 0;  // multiple of 64, <= transport slot size
  std::vector<char>* scratch = nullptr;  // reusable scratch memory of the group

  Pair& pair(int peer) const { return transport->pair(peer); }
  int mod(int x) const { return ((x % size) + size) % size; }
};

// Balanced split of `count` elements into `parts` blocks: block i starts at offset(i).
struct Blocks {
  size_t count, parts;
  size_t offset(size_t i) const { return i * (count / parts) + std::min(i, count % parts); }
  size_t length(size_t i) const { return count / parts + (i < count % parts ? 1 : 0); }
};

// Primitive helpers shared by the algorithm files.
void send_bytes(const Context& ctx, int peer, const void* data, size_t bytes);
// Receives one message that must be exactly `bytes` long and copies it out.
void recv_bytes(const Context& ctx, int peer, void* data, size_t bytes);
// Returns a receive slot holding exactly `bytes` (CommError naming the peer otherwise).
const void* recv_expect(const Context& ctx, int peer, size_t bytes);

void allreduce_ring(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void allreduce_rank_ordered(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void allreduce_recursive_doubling(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op);
void reduce_scatter_ring(const Context& ctx, const void* in, void* out, size_t count, DType dtype, ReduceOp op);
void reduce_scatter_rank_ordered(const Context& ctx, const void* in, void* out, size_t count, DType dtype,
                                 ReduceOp op);
void allgather_ring(const Context& ctx, const void* in, void* out, size_t count, DType dtype);
void broadcast_chain(const Context& ctx, void* buf, size_t count, DType dtype, int root);
void reduce_chain(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op, int root);
void all_to_all_direct(const Context& ctx, const void* in, void* out, size_t count, DType dtype);
void barrier_dissemination(const Context& ctx);

}  // namespace paratrain::comm::algorithms
