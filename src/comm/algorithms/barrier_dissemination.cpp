// Dissemination barrier.
//
// Barrier: in round k = 0..ceil(log2 n)-1 rank r sends an empty message to r+2^k and waits
// for one from r-2^k. After the last round every rank has (transitively) heard from every
// other, in ceil(log2 n) latency steps and no payload.
//
// (send/recv are not algorithms over the group's pairs: comm/p2p.h runs them on pairs of
// their own.)
#include <cstring>

#include "comm/algorithms/algorithms.h"

namespace paratrain::comm::algorithms {

void barrier_dissemination(const Context& ctx) {
  const int n = ctx.size, r = ctx.rank;
  for (int k = 1; k < n; k <<= 1) {
    send_bytes(ctx, ctx.mod(r + k), nullptr, 0);
    recv_bytes(ctx, ctx.mod(r - k), nullptr, 0);
  }
}

}  // namespace paratrain::comm::algorithms
