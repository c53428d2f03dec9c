#include "paratrain/launch/rendezvous.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "paratrain/base/error.h"

namespace paratrain::launch {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<std::string> split_tabs(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == '\t') {
      out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  out.push_back(cur);
  return out;
}

std::string clean(std::string s) {
  for (char& c : s)
    if (c == '\t' || c == '\n') c = ' ';
  return s;
}

int to_int(const std::string& s, int fallback) {
  try {
    return std::stoi(s);
  } catch (const std::exception&) {
    return fallback;
  }
}

std::string node_list(const std::vector<int>& nodes) {
  std::string s;
  for (size_t i = 0; i < nodes.size() && i < 16; ++i) s += (i ? ", " : "") + std::to_string(nodes[i]);
  if (nodes.size() > 16) s += ", ... (" + std::to_string(nodes.size()) + " in all)";
  return s;
}

}  // namespace

std::string encode_failure(const FailureInfo& f) {
  return std::to_string(f.rank) + "\t" + std::to_string(f.node) + "\t" + clean(f.host) + "\t" +
         std::to_string(f.exit_code) + "\t" + (f.interrupted ? "1" : "0") + "\t" + clean(f.what);
}

FailureInfo decode_failure(const std::string& s) {
  auto p = split_tabs(s);
  FailureInfo f;
  if (p.size() < 6) {
    f.what = s;
    return f;
  }
  f.rank = to_int(p[0], -1);
  f.node = to_int(p[1], -1);
  f.host = p[2];
  f.exit_code = to_int(p[3], 1);
  f.interrupted = p[4] == "1";
  f.what = p[5];
  return f;
}

NodeRendezvous::NodeRendezvous(std::shared_ptr<comm::Store> store, int nnodes, int node_rank, std::string where)
    : store_(std::move(store)), nnodes_(nnodes), node_rank_(node_rank), where_(std::move(where)) {}

std::string NodeRendezvous::key(int attempt, const std::string& k) const {
  return "launch/" + std::to_string(attempt) + "/" + k;
}

RoundInfo NodeRendezvous::join(int attempt, int nproc, const std::string& host, double timeout_s,
                               const std::function<bool()>& should_abort) {
  store_->set(key(attempt, "node/" + std::to_string(node_rank_)), std::to_string(nproc) + "\t" + clean(host));
  std::vector<std::string> keys;
  for (int r = 0; r < nnodes_; ++r) keys.push_back(key(attempt, "node/" + std::to_string(r)));
  auto deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    auto slice = std::clamp(left, std::chrono::milliseconds(1), std::chrono::milliseconds(100));
    try {
      store_->wait(keys, slice);
      break;
    } catch (const TimeoutError&) {
    }
    if (should_abort && should_abort()) PT_THROW(Error, "launch: rendezvous interrupted");
    if (Clock::now() >= deadline) {
      std::vector<int> missing;
      for (int r = 0; r < nnodes_; ++r)
        if (!store_->check({keys[static_cast<size_t>(r)]})) missing.push_back(r);
      if (missing.empty()) break;
      PT_THROW(TimeoutError, "launch: rendezvous failed: node", missing.size() == 1 ? " " : "s ", node_list(missing),
               " of ", nnodes_, " did not arrive within ", timeout_s, " s (round ", attempt, ", store at ", where_,
               ", this is node ", node_rank_, ")");
    }
  }
  RoundInfo info;
  info.attempt = attempt;
  for (int r = 0; r < nnodes_; ++r) {
    auto p = split_tabs(store_->get(keys[static_cast<size_t>(r)]));
    NodeInfo n;
    n.node_rank = r;
    n.nproc = to_int(p[0], 0);
    n.host = p.size() > 1 ? p[1] : "?";
    if (n.nproc <= 0) PT_THROW(CommError, "launch: node ", r, " published a bad rank count '", p[0], "'");
    if (r < node_rank_) info.rank_base += n.nproc;
    info.world_size += n.nproc;
    info.nodes.push_back(n);
  }
  return info;
}

void NodeRendezvous::publish_ranks_store_port(int attempt, int port) {
  store_->set(key(attempt, "ranks_store"), std::to_string(port));
}

int NodeRendezvous::ranks_store_port(int attempt) {
  std::string k = key(attempt, "ranks_store");
  if (!store_->check({k}))
    PT_THROW(CommError, "launch: node 0 published no port for the ranks' store in round ", attempt, " (store at ",
             where_, ")");
  std::string v = store_->get(k);
  int port = to_int(v, 0);
  if (port <= 0 || port > 65535)
    PT_THROW(CommError, "launch: node 0 published a bad port '", v, "' for the ranks' store in round ", attempt);
  return port;
}

FailureInfo NodeRendezvous::publish_failure(int attempt, const FailureInfo& f) {
  std::string mine = encode_failure(f);
  std::string now = store_->compare_set(key(attempt, "failed"), "", mine);
  return decode_failure(now);
}

std::optional<FailureInfo> NodeRendezvous::failure(int attempt) {
  std::string k = key(attempt, "failed");
  if (!store_->check({k})) return std::nullopt;
  return decode_failure(store_->get(k));
}

std::vector<int> NodeRendezvous::heartbeat(int attempt, double stale_after_s) {
  if (beats_attempt_ != attempt) {
    beats_.clear();
    beats_attempt_ = attempt;
  }
  store_->add(key(attempt, "hb/" + std::to_string(node_rank_)), 1);
  auto now = Clock::now();
  std::vector<int> stale;
  for (int r = 0; r < nnodes_; ++r) {
    if (r == node_rank_) continue;
    std::string k = key(attempt, "hb/" + std::to_string(r));
    std::string v = store_->check({k}) ? store_->get(k) : "";
    auto it = beats_.find(r);
    if (it == beats_.end() || it->second.value != v) {
      beats_[r] = Beat{v, now};
    } else if (std::chrono::duration<double>(now - it->second.changed).count() > stale_after_s) {
      stale.push_back(r);
    }
  }
  return stale;
}

void NodeRendezvous::publish_result(int attempt, bool ok) {
  store_->set(key(attempt, "result/" + std::to_string(node_rank_)), ok ? "ok" : "fail");
}

std::optional<std::vector<bool>> NodeRendezvous::results(int attempt) {
  std::vector<std::string> keys;
  for (int r = 0; r < nnodes_; ++r) keys.push_back(key(attempt, "result/" + std::to_string(r)));
  if (!store_->check(keys)) return std::nullopt;
  std::vector<bool> out;
  for (const auto& k : keys) out.push_back(store_->get(k) == "ok");
  return out;
}

void NodeRendezvous::ack(int attempt) { store_->set(key(attempt, "ack/" + std::to_string(node_rank_)), "1"); }

bool NodeRendezvous::wait_acks(int attempt, double timeout_s) {
  std::vector<std::string> keys;
  for (int r = 0; r < nnodes_; ++r)
    if (r != node_rank_) keys.push_back(key(attempt, "ack/" + std::to_string(r)));
  if (keys.empty()) return true;
  try {
    store_->wait(keys, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}

}  // namespace paratrain::launch
