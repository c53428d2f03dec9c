// Message helpers shared by the algorithms: whole messages on top of Pair slots.
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {

void send_bytes(const Context& ctx, int peer, const void* data, size_t bytes) {
  Pair& p = ctx.pair(peer);
  void* slot = p.send_begin(ctx.deadline);
  if (bytes) std::memcpy(slot, data, bytes);
  p.send_end(bytes);
}

const void* recv_expect(const Context& ctx, int peer, size_t bytes) {
  size_t got = 0;
  const void* slot = ctx.pair(peer).recv_begin(&got, ctx.deadline);
  if (got != bytes)
    PT_THROW(CommError, "rank ", ctx.rank, " expected a ", bytes, "-byte message from rank ", peer, " but got ", got,
             " bytes: the ranks are not running the same collective (set PARATRAIN_DEBUG=detail to find out which)");
  return slot;
}

void recv_bytes(const Context& ctx, int peer, void* data, size_t bytes) {
  const void* slot = recv_expect(ctx, peer, bytes);
  if (bytes) std::memcpy(data, slot, bytes);
  ctx.pair(peer).recv_end();
}

}  // namespace paratrain::comm::algorithms
