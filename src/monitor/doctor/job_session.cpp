// JobSession: the job checks of `paratrain doctor` under a launcher (or mpirun).
//
// The store: PARATRAIN_STORE_PORT on MASTER_ADDR (the launcher hosts it), else MASTER_PORT
// (rank 0 hosts it unless PARATRAIN_STORE_EXTERNAL=1), else none (mpirun alone). Every rank
// announces itself and its host under doctor/hello/<rank>. Each backend available gets a
// group of its own over a fresh key prefix: an all-reduce of 1031 f32 whose sums are exact
// integers (checked element by element on every rank), then `allreduce_bytes` timed over
// `allreduce_iters` iterations; the time is the slowest rank's; algbw = bytes / time,
// busbw = algbw x 2(n-1)/n (nccl-tests). Clock skew: after a barrier every rank reads the
// system clock and the readings are all-gathered; the smallest spread of 5 rounds.
// Reports travel as JSON under doctor/report/<rank> (or over the mpi group without a store);
// rank 0's verdict under doctor/verdict; rank 0 keeps the store until every rank said bye.
#include "monitor/doctor/job_session.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "monitor/doctor/check_util.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"

namespace paratrain::monitor::doctor::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::chrono::milliseconds ms(double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); }

int64_t now_system_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Gathers one string per rank over a group (lengths, then the bytes packed in i32 words).
std::vector<std::string> gather_strings(comm::ProcessGroup& pg, const std::string& mine) {
  int64_t len = static_cast<int64_t>(mine.size());
  pg.allreduce(&len, 1, DType::I64, comm::ReduceOp::kMax)->wait();
  const size_t words = (static_cast<size_t>(len) + 4) / 4;
  std::vector<int32_t> in(words, 0), out(words * pg.size(), 0);
  std::memcpy(in.data(), mine.data(), mine.size());
  pg.allgather(in.data(), out.data(), words, DType::I32)->wait();
  std::vector<std::string> r(pg.size());
  for (int i = 0; i < pg.size(); ++i) {
    const char* p = reinterpret_cast<const char*>(out.data() + i * words);
    r[i] = std::string(p, strnlen(p, words * 4));
  }
  return r;
}

}  // namespace

JobSession::~JobSession() {
  // Rank 0 keeps the store (its own server, if any) until every rank is done with it.
  if (store_ && rank_ == 0 && server_) {
    std::vector<std::string> keys;
    for (int r = 1; r < size_; ++r) keys.push_back("bye/" + std::to_string(r));
    try {
      store_->wait(keys, ms(std::min(options_.timeout_s, 10.0)));
    } catch (const std::exception&) {
    }
  }
  groups_.clear();
}

std::unique_ptr<JobSession> JobSession::open(const Options& options, std::vector<Check>& out) {
  const comm::JobEnv e = comm::read_job_env();
  if (e.world_size <= 1) return nullptr;
  std::unique_ptr<JobSession> s(new JobSession());
  s->options_ = options;
  s->rank_ = e.rank;
  s->size_ = e.world_size;
  s->under_mpi_ = e.under_mpi;
  const int64_t launcher_port = env::get_int("PARATRAIN_STORE_PORT");
  const int port = launcher_port > 0 ? static_cast<int>(launcher_port) : e.master_port;
  const std::string where = e.master_addr + ":" + std::to_string(port) +
                            (launcher_port > 0 ? " (PARATRAIN_STORE_PORT, the launcher's)" : " (MASTER_PORT)");
  if (port <= 0) {
    out.push_back(make("job.store", Status::kSkip,
                       "no store: neither PARATRAIN_STORE_PORT nor MASTER_PORT is set (mpirun alone); only the mpi backend is checked"));
  } else {
    try {
      auto t0 = Clock::now();
      if (e.rank == 0 && launcher_port <= 0 && !env::get_bool("PARATRAIN_STORE_EXTERNAL"))
        s->server_ = std::make_shared<comm::TcpStoreServer>("", port, e.token);
      auto base = std::make_shared<comm::TcpStore>(e.master_addr, port, e.token, ms(options.timeout_s), ms(options.timeout_s));
      auto store = std::make_shared<comm::PrefixStore>("doctor", base);
      store->set("hello/" + std::to_string(e.rank), hostname());
      std::vector<std::string> keys;
      for (int r = 0; r < e.world_size; ++r) keys.push_back("hello/" + std::to_string(r));
      store->wait(keys, ms(options.timeout_s));
      const double join_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      // Round trip of one request.
      const std::string own = "hello/" + std::to_string(e.rank);
      constexpr int kTrips = 20;
      auto t1 = Clock::now();
      for (int i = 0; i < kTrips; ++i) store->get(own);
      const double rtt_us = std::chrono::duration<double, std::micro>(Clock::now() - t1).count() / kTrips;
      std::map<std::string, std::vector<int>> by_host;
      for (int r = 0; r < e.world_size; ++r) by_host[store->get("hello/" + std::to_string(r))].push_back(r);
      for (const auto& [h, ranks] : by_host) s->hosts_.insert(h);
      s->store_ = store;
      char buf[256];
      std::snprintf(buf, sizeof(buf), "%s reachable, token accepted, %d ranks joined in %.0f ms, round trip %.0f us",
                    where.c_str(), e.world_size, join_ms, rtt_us);
      Check c = make("job.store", Status::kPass, buf, "",
                     {{"address", e.master_addr}, {"port", port}, {"launcher_store", launcher_port > 0},
                      {"ranks", e.world_size}, {"join_ms", join_ms}, {"rtt_us", rtt_us}});
      c.rank = e.rank;
      out.push_back(c);
      std::string hv;
      nlohmann::json hd = nlohmann::json::object();
      for (const auto& [h, ranks] : by_host) {
        hv += (hv.empty() ? "" : "; ") + h + ": ranks";
        for (int r : ranks) {
          hv += ' ';
          hv += std::to_string(r);
        }
        hd[h] = ranks;
      }
      Check rc = make("job.ranks", Status::kPass,
                      std::to_string(e.world_size) + " ranks on " + std::to_string(by_host.size()) + " host" +
                          (by_host.size() == 1 ? "" : "s") + " (" + hv + ")",
                      "", {{"world_size", e.world_size}, {"hosts", hd}});
      rc.rank = e.rank;
      out.push_back(rc);
    } catch (const std::exception& ex) {
      Check c = make("job.store", Status::kFail, where + ": " + ex.what(),
                     "check MASTER_ADDR and the store port (firewall), and that every rank has the same PARATRAIN_TOKEN",
                     {{"address", e.master_addr}, {"port", port}});
      c.rank = e.rank;
      out.push_back(c);
      s->store_.reset();
    }
  }
  if (e.under_mpi) {
    try {
      comm::ProcessGroupOptions o;
      o.backend = "mpi";
      o.timeout_s = options.timeout_s;
      s->mpi_ = comm::create_process_group(nullptr, e.rank, e.world_size, o);
    } catch (const std::exception& ex) {
      Check c = make("job.allreduce.mpi", Status::kSkip, std::string("no mpi group: ") + ex.what());
      c.rank = e.rank;
      out.push_back(c);
    }
  }
  return s;
}

void JobSession::run_checks(std::vector<Check>& out) {
  if (store_) {
    if (hosts_.size() == 1)
      allreduce_check("shm", out);
    else {
      Check c = make("job.allreduce.shm", Status::kSkip,
                     "ranks on " + std::to_string(hosts_.size()) + " hosts: shm joins the ranks of one host only");
      c.rank = rank_;
      out.push_back(c);
    }
    allreduce_check("tcp", out);
  }
  if (mpi_) allreduce_check("mpi", out);
  clock_check(out);
}

void JobSession::allreduce_check(const std::string& backend, std::vector<Check>& out) {
  const std::string name = "job.allreduce." + backend;
  Check c;
  c.rank = rank_;
  try {
    std::shared_ptr<comm::ProcessGroup> pg;
    if (backend == "mpi") {
      pg = mpi_;
    } else {
      comm::ProcessGroupOptions o;
      o.backend = backend;
      o.timeout_s = options_.timeout_s;
      pg = comm::create_process_group(std::make_shared<comm::PrefixStore>("pg/" + backend, store_), rank_, size_, o);
      groups_.push_back(pg);
    }
    const int n = pg->size();
    // Exact integer sums: rank r contributes (r+1) * (i % 7 + 1).
    constexpr size_t kCount = 1031;
    std::vector<float> buf(kCount);
    for (size_t i = 0; i < kCount; ++i) buf[i] = float((rank_ + 1) * int(i % 7 + 1));
    pg->allreduce(buf.data(), kCount, DType::F32)->wait();
    int64_t wrong = 0;
    for (size_t i = 0; i < kCount; ++i)
      if (buf[i] != float(n * (n + 1) / 2 * int(i % 7 + 1))) ++wrong;
    int64_t wrong_all = wrong;
    pg->allreduce(&wrong_all, 1, DType::I64)->wait();

    // Timed: allreduce_bytes of f32, the slowest rank's average.
    const size_t count = std::max<size_t>(1, options_.allreduce_bytes / sizeof(float));
    std::vector<float> big(count, 1.f);
    for (int i = 0; i < 2; ++i) pg->allreduce(big.data(), count, DType::F32)->wait();
    pg->barrier()->wait();
    const int iters = std::max(1, options_.allreduce_iters);
    auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) pg->allreduce(big.data(), count, DType::F32)->wait();
    int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count() / iters;
    pg->allreduce(&ns, 1, DType::I64, comm::ReduceOp::kMax)->wait();
    const double bytes = double(count * sizeof(float));
    const double algbw = bytes / double(ns);  // bytes per ns = GB/s
    const double busbw = algbw * 2.0 * (n - 1) / n;
    char v[256];
    std::snprintf(v, sizeof(v), "%d ranks: %zu-element check %s; %s in %.0f us: algbw %.2f GB/s, busbw %.2f GB/s", n,
                  kCount, wrong_all == 0 ? "exact" : "WRONG", human_bytes(bytes).c_str(), ns / 1e3, algbw, busbw);
    nlohmann::json d = {{"backend", pg->backend_name()}, {"ranks", n}, {"check_count", kCount}, {"wrong", wrong_all},
                        {"bytes", bytes}, {"time_us", ns / 1e3}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw}};
    if (wrong_all != 0)
      c = make(name, Status::kFail, v,
               "the " + backend + " backend returned wrong sums: use another --backend and report it (with this output)", d);
    else
      c = make(name, Status::kPass, v, "", d);
    if (wrong_all == 0 && !clock_group_) clock_group_ = pg;
  } catch (const std::exception& ex) {
    c = make(name, Status::kFail, ex.what(),
             backend == "shm"   ? "check /dev/shm (comm.shm) or use --backend tcp"
             : backend == "tcp" ? "check that the ranks' hosts reach each other's ports (firewall; PARATRAIN_TCP_ADDR)"
                                : "check the MPI installation (mpirun --version) or use --backend tcp",
             {{"backend", backend}});
  }
  c.rank = rank_;
  out.push_back(c);
}

void JobSession::clock_check(std::vector<Check>& out) {
  Check c;
  if (!clock_group_) {
    c = make("job.clock_skew", Status::kSkip, "no working group to compare the ranks' clocks over");
  } else {
    try {
      auto& pg = *clock_group_;
      int64_t best = INT64_MAX;
      std::vector<int64_t> offsets(size_, 0);
      for (int round = 0; round < 5; ++round) {
        pg.barrier()->wait();
        int64_t t = now_system_ns();
        std::vector<int64_t> all(size_);
        pg.allgather(&t, all.data(), 1, DType::I64)->wait();
        auto [lo, hi] = std::minmax_element(all.begin(), all.end());
        if (*hi - *lo < best) {
          best = *hi - *lo;
          for (int r = 0; r < size_; ++r) offsets[r] = all[r] - all[0];
        }
      }
      const double skew_us = best / 1e3;
      char v[160];
      std::snprintf(v, sizeof(v), "system clocks of %d ranks within %.0f us (best of 5 rounds after a barrier, over %s)",
                    size_, skew_us, pg.backend_name().c_str());
      nlohmann::json d = {{"skew_us", skew_us}, {"offsets_us", nlohmann::json::array()}, {"backend", pg.backend_name()}};
      for (int64_t o : offsets) d["offsets_us"].push_back(o / 1e3);
      if (skew_us > 10000)
        c = make("job.clock_skew", Status::kWarn, v,
                 "synchronise the hosts' clocks (chrony or systemd-timesyncd): merged traces of the ranks will not line up", d);
      else
        c = make("job.clock_skew", Status::kPass, v, "", d);
    } catch (const std::exception& ex) {
      c = make("job.clock_skew", Status::kFail, ex.what(), "see job.allreduce.*: the group failed");
    }
  }
  c.rank = rank_;
  out.push_back(c);
}

std::vector<Check> JobSession::gather(const std::vector<Check>& mine) {
  nlohmann::json arr = nlohmann::json::array();
  for (const auto& c : mine) arr.push_back(check_to_json(c));
  std::vector<Check> r;
  auto missing = [&](int from, const std::string& why) {
    Check c = make("job.report", Status::kFail, "rank " + std::to_string(from) + " sent no report: " + why,
                   "look at that rank's own output (paratrain launch prefixes it with [" + std::to_string(from) + "])");
    c.rank = from;
    r.push_back(c);
  };
  if (store_) {
    store_->set("report/" + std::to_string(rank_), arr.dump());
    if (rank_ != 0) return {};
    for (int from = 1; from < size_; ++from) {
      try {
        store_->wait({"report/" + std::to_string(from)}, ms(options_.timeout_s));
        for (const auto& j : nlohmann::json::parse(store_->get("report/" + std::to_string(from)))) r.push_back(check_from_json(j));
      } catch (const std::exception& ex) {
        missing(from, ex.what());
      }
    }
  } else if (mpi_) {
    try {
      auto all = gather_strings(*mpi_, arr.dump());
      if (rank_ != 0) return {};
      for (int from = 1; from < size_; ++from)
        for (const auto& j : nlohmann::json::parse(all[from])) r.push_back(check_from_json(j));
    } catch (const std::exception& ex) {
      if (rank_ != 0) return {};
      for (int from = 1; from < size_; ++from) missing(from, ex.what());
    }
  } else if (rank_ == 0) {
    for (int from = 1; from < size_; ++from) missing(from, "no store and no mpi group to gather over");
  }
  return r;
}

bool JobSession::agree(bool failed_on_rank0) {
  try {
    if (store_) {
      if (rank_ == 0) {
        store_->set("verdict", failed_on_rank0 ? "1" : "0");
        return failed_on_rank0;
      }
      store_->wait({"verdict"}, ms(options_.timeout_s));
      bool v = store_->get("verdict") == "1";
      store_->set("bye/" + std::to_string(rank_), "1");
      return v;
    }
    if (mpi_) {
      int32_t v = failed_on_rank0 ? 1 : 0;
      mpi_->broadcast(&v, 1, DType::I32, 0)->wait();
      return v != 0;
    }
  } catch (const std::exception&) {
    return true;  // no verdict reached us: something failed
  }
  return failed_on_rank0;
}

}  // namespace paratrain::monitor::doctor::detail
