// Rank-ordered (deterministic) all-reduce and reduce-scatter.
//
// Goal: on every rank, every element equals the in-order sum x0 + x1 + ... + x(n-1) that
// one process would compute (bf16/f16 accumulated in f32 and rounded once at the end), for
// any n, while each rank still sends and receives only about 2(n-1)/n of the buffer.
//
// Reduce-scatter, direct: chunk c (of n balanced chunks) is owned by rank c. For each
// segment, every rank first sends its contribution to the segment of every other rank's
// chunk (n-1 messages, one per peer), then the owner accumulates the n contributions of
// its own chunk strictly in rank order 0..n-1 into an f32/i64 accumulator (its own comes
// from its buffer, the others from their receive slots) and rounds once. Each rank sends
// and receives (n-1)/n of the buffer, the same as a ring; the accumulation order no longer
// depends on where a chunk started, which is what makes the result order-fixed.
// All-gather, ring: the finished chunks travel around the ring as in allreduce_ring
// ((n-1)/n more). Both phases run per segment, so the pipeline stays full.
//
// Deadlock freedom: in each segment round a rank's sends go to n-1 distinct pairs, each
// with a ring of several slots, and a receive waits only for a message some peer sends in
// the same round before its own receives; the lowest-round rank can always progress.
#include <cstring>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/reduce_kernels.h"

namespace paratrain::comm::algorithms {

namespace {

// Runs rank-ordered reduce-scatter of segment [s0, s0+len) of every chunk, writing the
// finished segment of chunk r to `result`. `contribution(c)` is this rank's data of that
// segment of chunk c.
template <typename Contribution>
void reduce_segment(const Context& ctx, Contribution contribution, const size_t* lens, void* result, DType dtype,
                    ReduceOp op, char* acc) {
  const int n = ctx.size, r = ctx.rank;
  const size_t es = dtype_size(dtype);
  for (int p = 1; p < n; ++p) {
    int dst = ctx.mod(r + p);
    send_bytes(ctx, dst, contribution(dst), lens[dst] * es);
  }
  size_t len = lens[r];
  for (int i = 0; i < n; ++i) {
    const void* x = i == r ? contribution(r) : recv_expect(ctx, i, len * es);
    if (i == 0) kernels::acc_load(acc, x, len, dtype);
    else kernels::acc_add(acc, x, len, dtype, op);
    if (i != r) ctx.pair(i).recv_end();
  }
  kernels::acc_store(result, acc, len, dtype, op, n);
}

}  // namespace

void allreduce_rank_ordered(const Context& ctx, void* buf, size_t count, DType dtype, ReduceOp op) {
  const int n = ctx.size, r = ctx.rank;
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  char* data = static_cast<char*>(buf);
  Blocks chunks{count, static_cast<size_t>(n)};
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (chunks.length(0) + seg_elems - 1) / seg_elems;
  ctx.scratch->resize(std::max(ctx.scratch->size(), seg_elems * kernels::acc_size(dtype)));
  char* acc = ctx.scratch->data();
  std::vector<size_t> lens(n), offs(n);
  const int prev = ctx.mod(r - 1), next = ctx.mod(r + 1);
  for (size_t o = 0; o < rounds; ++o) {
    for (int c = 0; c < n; ++c) {
      size_t cl = chunks.length(c);
      size_t s = std::min(o * seg_elems, cl), e = std::min(s + seg_elems, cl);
      offs[c] = chunks.offset(c) + s;
      lens[c] = e - s;
    }
    reduce_segment(
        ctx, [&](int c) { return data + offs[c] * es; }, lens.data(), data + offs[r] * es, dtype, op, acc);
    // Ring all-gather of this segment: send ours, then receive chunk r-j for j=1..n-1.
    send_bytes(ctx, next, data + offs[r] * es, lens[r] * es);
    for (int j = 1; j <= n - 1; ++j) {
      int c = ctx.mod(r - j);
      const void* rx = recv_expect(ctx, prev, lens[c] * es);
      std::memcpy(data + offs[c] * es, rx, lens[c] * es);
      if (j < n - 1) send_bytes(ctx, next, rx, lens[c] * es);
      ctx.pair(prev).recv_end();
    }
  }
}

void reduce_scatter_rank_ordered(const Context& ctx, const void* input, void* output, size_t count, DType dtype,
                                 ReduceOp op) {
  const int n = ctx.size;
  const size_t es = dtype_size(dtype);
  if (count == 0) return;
  const char* src = static_cast<const char*>(input);
  char* dst = static_cast<char*>(output);
  if (n == 1) {
    std::memcpy(dst, src, count * es);
    return;
  }
  const size_t seg_elems = std::max<size_t>(1, ctx.segment_bytes / es);
  const size_t rounds = (count + seg_elems - 1) / seg_elems;
  ctx.scratch->resize(std::max(ctx.scratch->size(), seg_elems * kernels::acc_size(dtype)));
  char* acc = ctx.scratch->data();
  std::vector<size_t> lens(n);
  for (size_t o = 0; o < rounds; ++o) {
    const size_t s0 = o * seg_elems, len = std::min(seg_elems, count - s0);
    std::fill(lens.begin(), lens.end(), len);
    reduce_segment(
        ctx, [&](int c) { return src + (size_t(c) * count + s0) * es; }, lens.data(), dst + s0 * es, dtype, op, acc);
  }
}

}  // namespace paratrain::comm::algorithms
