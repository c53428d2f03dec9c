// How the launchers of a multi-node job meet and agree, through the job's Store
// (docs/launch.md, "Rendezvous").
//
// Node 0's launcher hosts this store on MASTER_PORT+1 (the paratrain ranks' own store is
// another one, on a port the kernel picks, made fresh for every attempt; MASTER_PORT itself
// is left to the program); every launcher, node 0's included, is a client. All keys live
// under "launch/<attempt>/", so every restart is a fresh round:
//   ranks_store   port of that round's ranks' store on node 0 (written before node/0)
//   node/<r>      "<nproc>\t<host>"   node r joined round <attempt>
//   failed        first failure of the round (compare_set: the first writer wins)
//   hb/<r>        counter bumped by node r's launcher about once a second
//   result/<r>    "ok" or "fail" once node r's ranks have all exited
//   ack/<r>       node r has read every result (node 0 keeps the store up until then)
// join() waits until every node has joined, at most `timeout_s`; the TimeoutError names
// the nodes that did not arrive. A non-master that cannot reach node 0 fails the same way.
//
// Thread-safety: one NodeRendezvous per launcher thread; the Store itself is thread-safe.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/comm/store.h"

namespace paratrain::launch {

struct NodeInfo {
  int node_rank = 0;
  int nproc = 0;      // ranks on that node
  std::string host;   // its host name
};

struct RoundInfo {
  int attempt = 0;
  std::vector<NodeInfo> nodes;  // indexed by node rank
  int rank_base = 0;            // global rank of this node's local rank 0
  int world_size = 0;           // ranks over all nodes
};

// The first failure of a round, as published for every node.
struct FailureInfo {
  int rank = -1;          // global rank that failed (-1: no rank, e.g. a lost node)
  int node = -1;          // node it ran on
  std::string host;
  int exit_code = 1;      // the code launchers exit with (signal -> 128 + signal)
  bool interrupted = false;  // the launcher was interrupted (SIGINT/SIGTERM): no restart
  std::string what;       // "exit code 3", "signal 9 (SIGKILL)", "node 1 stopped responding"
};
std::string encode_failure(const FailureInfo& f);
FailureInfo decode_failure(const std::string& s);

class NodeRendezvous {
 public:
  // `where` names node 0's store in messages ("10.0.0.1:29500").
  NodeRendezvous(std::shared_ptr<comm::Store> store, int nnodes, int node_rank, std::string where);

  // Joins round `attempt` with this node's rank count and host name, and waits for the
  // others. `should_abort` is polled about every 100 ms; when it returns true, join()
  // throws Error("rendezvous interrupted"). TimeoutError names missing nodes.
  RoundInfo join(int attempt, int nproc, const std::string& host, double timeout_s,
                 const std::function<bool()>& should_abort);

  // Node 0, before join(): the port of this round's ranks' store. After join() every node
  // reads it with ranks_store_port() (CommError if node 0 did not publish one).
  void publish_ranks_store_port(int attempt, int port);
  int ranks_store_port(int attempt);

  // Publishes f as the round's first failure unless one is there; returns the one that won.
  FailureInfo publish_failure(int attempt, const FailureInfo& f);
  // The round's first failure, if any node published one.
  std::optional<FailureInfo> failure(int attempt);

  // Bumps this node's heartbeat, and returns the nodes whose heartbeat has not moved for
  // `stale_after_s` seconds (measured on this node's clock since it first looked).
  std::vector<int> heartbeat(int attempt, double stale_after_s);

  void publish_result(int attempt, bool ok);
  // Every node's result once all are in (index = node rank), nullopt before.
  std::optional<std::vector<bool>> results(int attempt);

  // Non-master: tells node 0 this node is done with the store for `attempt`.
  void ack(int attempt);
  // Master: waits (at most timeout_s) until every other node acked. False on timeout.
  bool wait_acks(int attempt, double timeout_s);

 private:
  std::string key(int attempt, const std::string& k) const;
  std::shared_ptr<comm::Store> store_;
  int nnodes_;
  int node_rank_;
  std::string where_;
  struct Beat {
    std::string value;
    std::chrono::steady_clock::time_point changed;
  };
  std::map<int, Beat> beats_;
  int beats_attempt_ = -1;
};

}  // namespace paratrain::launch
