// Dissemination barrier and point-to-point messages.
//
// Barrier: in round k = 0..ceil(log2 n)-1 rank r sends an empty message to r+2^k and waits
// for one from r-2^k. After the last round every rank has (transitively) heard from every
// other, in ceil(log2 n) latency steps and no payload.
//
// send/recv: a 16-byte header (tag, byte count) and then the payload cut into segments. The
// receiver checks the header so a mismatched pair fails with a clear error, not garbage.
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

namespace {
struct P2pHeader {
  int64_t tag;
  uint64_t bytes;
};
}  // namespace

void send_p2p(const Context& ctx, const void* buf, size_t bytes, int dst, int tag) {
  P2pHeader h{tag, bytes};
  send_bytes(ctx, dst, &h, sizeof(h));
  const char* p = static_cast<const char*>(buf);
  for (size_t off = 0; off < bytes; off += ctx.segment_bytes)
    send_bytes(ctx, dst, p + off, std::min(ctx.segment_bytes, bytes - off));
}

void recv_p2p(const Context& ctx, void* buf, size_t bytes, int src, int tag) {
  P2pHeader h;
  recv_bytes(ctx, src, &h, sizeof(h));
  if (h.tag != tag || h.bytes != bytes)
    PT_THROW(CommError, "recv on rank ", ctx.rank, " from rank ", src, " expected tag ", tag, " and ", bytes,
             " bytes, but rank ", src, " sent tag ", h.tag, " with ", h.bytes, " bytes");
  char* p = static_cast<char*>(buf);
  for (size_t off = 0; off < bytes; off += ctx.segment_bytes)
    recv_bytes(ctx, src, p + off, std::min(ctx.segment_bytes, bytes - off));
}

}  // namespace paratrain::comm::algorithms
