// A test-only process group for ranks that are threads of one process, with nccl's send/recv
// rules as strictly as they can be stated (nccl_process_group.h), so that code written for
// them can be checked on a machine without GPUs:
//  - a peer's messages match in posting order (P2pMatching::InPostingOrder); tags are not
//    used for matching, but a match whose tags differ fails both sides (CommError): the
//    poster got the order wrong, which nccl would deliver silently;
//  - sends and recvs collect in an open batch that starts only when the program waits for one
//    of them; each rank's batches run one after another (its comm stream), a batch completes
//    only when all its operations have, and a send completes only when its recv is running;
//  - a wait that is not over within `deadline` fails with a TimeoutError describing what
//    every rank's running batch still waits for (a deadlock nccl would hang in).
// Only send and recv are there; the other calls throw. A matched message is copied with
// memcpy, or with the world's Copy (device buffers: tests/gpu/pipeline_gpu_test.cpp), on the
// thread that made the match.
//
// Thread-safety: one thread per rank; the world's state is under one mutex. Lifetime: the
// world outlives its groups and their Works.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"

namespace paratrain::testing {

class PostingOrderWorld {
 public:
  // dst, src, bytes: what a matched message does with the two buffers (null: memcpy).
  using Copy = std::function<void(void*, const void*, size_t)>;
  explicit PostingOrderWorld(int size, std::chrono::milliseconds deadline = std::chrono::seconds(20),
                             Copy copy = nullptr)
      : ranks_(static_cast<size_t>(size)), deadline_(deadline), copy_(std::move(copy)) {}
  std::shared_ptr<comm::ProcessGroup> group(int rank);
  // How many batches rank `r` enqueued (each a wait on a not yet started send/recv).
  int batches(int r) {
    std::lock_guard<std::mutex> l(mu_);
    return ranks_[static_cast<size_t>(r)].batches;
  }

 private:
  friend class PostingOrderGroup;
  struct Op {
    bool send;
    int peer, tag;
    void* buf;
    size_t bytes;
    size_t index;  // the how-many-th message between the pair in this direction
    std::shared_ptr<comm::Work> work;
    bool done = false;
  };
  using Batch = std::vector<std::shared_ptr<Op>>;
  struct Rank {
    Batch open;
    std::deque<Batch> stream;
    std::map<int, size_t> sends, recvs;  // per peer: messages posted so far
    int batches = 0;
  };

  comm::WorkPtr post(int rank, bool send, void* buf, size_t bytes, int peer, int tag) {
    std::lock_guard<std::mutex> l(mu_);
    Rank& r = ranks_[static_cast<size_t>(rank)];
    auto op = std::make_shared<Op>();
    op->send = send, op->peer = peer, op->tag = tag, op->buf = buf, op->bytes = bytes;
    op->index = send ? r.sends[peer]++ : r.recvs[peer]++;
    std::ostringstream d;
    d << "rank " << rank << ": " << (send ? "send #" : "recv #") << op->index << (send ? " to " : " from ") << peer
      << ", tag " << tag;
    op->work = std::make_shared<comm::Work>(d.str());
    op->work->set_helper([this, rank, op](comm::Work*) { wait_for(rank, op); });
    r.open.push_back(op);
    return op->work;
  }

  void wait_for(int rank, const std::shared_ptr<Op>& op) {
    std::unique_lock<std::mutex> l(mu_);
    Rank& r = ranks_[static_cast<size_t>(rank)];
    if (!r.open.empty()) {
      r.stream.push_back(std::move(r.open));
      r.open.clear();
      ++r.batches;
    }
    progress();
    // Its Work completes with its whole batch.
    if (cv_.wait_for(l, deadline_, [&] { return op->work->is_completed(); })) return;
    std::ostringstream why;
    why << op->work->description() << " did not complete within " << deadline_.count()
        << " ms: the ranks' running batches wait for";
    for (size_t k = 0; k < ranks_.size(); ++k) {
      why << " | rank " << k << ":";
      if (ranks_[k].stream.empty()) why << " nothing running";
      for (const auto& o : ranks_[k].stream.empty() ? Batch{} : ranks_[k].stream.front())
        if (!o->done) why << (o->send ? " send#" : " recv#") << o->index << (o->send ? ">" : "<") << o->peer;
      why << " (" << ranks_[k].open.size() << " not started)";
    }
    op->work->finish(std::make_exception_ptr(TimeoutError(why.str())));
  }

  // Matches every send of a running batch with its recv in the peer's running batch, and
  // completes the batches all of whose operations are done (the next one starts).
  void progress() {
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t a = 0; a < ranks_.size(); ++a) {
        if (ranks_[a].stream.empty()) continue;
        for (auto& s : ranks_[a].stream.front()) {
          if (!s->send || s->done) continue;
          Rank& b = ranks_[static_cast<size_t>(s->peer)];
          if (b.stream.empty()) continue;
          for (auto& r : b.stream.front()) {
            if (r->send || r->done || r->peer != static_cast<int>(a) || r->index != s->index) continue;
            if (r->tag != s->tag || r->bytes != s->bytes) {
              std::ostringstream e;
              e << "message #" << s->index << " from rank " << a << " to rank " << s->peer << ": sent with tag "
                << s->tag << " (" << s->bytes << " bytes), received as tag " << r->tag << " (" << r->bytes
                << " bytes): the two sides post in different orders";
              s->work->finish(std::make_exception_ptr(CommError(e.str())));
              r->work->finish(std::make_exception_ptr(CommError(e.str())));
            } else {
              if (copy_)
                copy_(r->buf, s->buf, s->bytes);
              else
                std::memcpy(r->buf, s->buf, s->bytes);
            }
            s->done = r->done = true;
            changed = true;
            break;
          }
        }
      }
      for (Rank& r : ranks_) {
        if (r.stream.empty()) continue;
        bool all = true;
        for (const auto& o : r.stream.front()) all = all && o->done;
        if (!all) continue;
        for (const auto& o : r.stream.front())
          if (!o->work->is_completed()) o->work->finish();
        r.stream.pop_front();
        changed = true;
      }
    }
    cv_.notify_all();
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Rank> ranks_;
  std::chrono::milliseconds deadline_;
  Copy copy_;
};

class PostingOrderGroup final : public comm::ProcessGroup {
 public:
  PostingOrderGroup(PostingOrderWorld& world, int rank, int size) : world_(world) {
    rank_ = rank;
    size_ = size;
  }
  std::string backend_name() const override { return "posting-order (test)"; }
  comm::P2pMatching p2p_matching() const override { return comm::P2pMatching::InPostingOrder; }
  comm::WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag) override {
    return world_.post(rank_, true, const_cast<void*>(buf), count * dtype_size(dtype), dst, tag);
  }
  comm::WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag) override {
    return world_.post(rank_, false, buf, count * dtype_size(dtype), src, tag);
  }
  comm::WorkPtr allreduce(void*, size_t, DType, comm::ReduceOp) override { return none("allreduce"); }
  comm::WorkPtr reduce_scatter(const void*, void*, size_t, DType, comm::ReduceOp) override {
    return none("reduce_scatter");
  }
  comm::WorkPtr allgather(const void*, void*, size_t, DType) override { return none("allgather"); }
  comm::WorkPtr broadcast(void*, size_t, DType, int) override { return none("broadcast"); }
  comm::WorkPtr reduce(void*, size_t, DType, comm::ReduceOp, int) override { return none("reduce"); }
  comm::WorkPtr all_to_all(const void*, void*, size_t, DType) override { return none("all_to_all"); }
  comm::WorkPtr barrier() override { return none("barrier"); }
  std::shared_ptr<comm::ProcessGroup> new_group(const std::vector<int>&) override {
    PT_THROW(Error, "PostingOrderGroup: new_group is not emulated");
  }

 private:
  [[noreturn]] static comm::WorkPtr none(const char* what) {
    PT_THROW(Error, "PostingOrderGroup: ", what, " is not emulated");
  }
  PostingOrderWorld& world_;
};

inline std::shared_ptr<comm::ProcessGroup> PostingOrderWorld::group(int rank) {
  return std::make_shared<PostingOrderGroup>(*this, rank, static_cast<int>(ranks_.size()));
}

}  // namespace paratrain::testing
