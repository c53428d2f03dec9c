// The doctor's view of a job (WORLD_SIZE > 1): its store and process groups, the job checks,
// and the gathering of every rank's checks to rank 0. Private to src/monitor/doctor.
//
// Lifetime: one JobSession per process, opened and closed at the same point on every rank
// (it is collective). Every wait is bounded by Options::timeout_s. Not thread-safe.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/monitor/doctor.h"

namespace paratrain::monitor::doctor::detail {

class JobSession {
 public:
  // Joins the job found in the environment; nullptr when WORLD_SIZE is 1. Appends the
  // job.store and job.ranks checks to `out` (a store that cannot be reached is a failure:
  // the session then has no store, and only an mpi group, if any, to gather over).
  static std::unique_ptr<JobSession> open(const Options& options, std::vector<Check>& out);
  ~JobSession();

  int rank() const { return rank_; }
  int size() const { return size_; }
  // job.allreduce.<backend> on every backend available, then job.clock_skew.
  void run_checks(std::vector<Check>& out);
  // Collective: every rank passes its checks; rank 0 gets every other rank's (with rank set),
  // and a failed check for each rank that did not report in time. Others get nothing.
  std::vector<Check> gather(const std::vector<Check>& mine);
  // Collective: rank 0's verdict (true = a check failed) is what every rank returns.
  bool agree(bool failed_on_rank0);

 private:
  JobSession() = default;
  void allreduce_check(const std::string& backend, std::vector<Check>& out);
  void clock_check(std::vector<Check>& out);

  Options options_;
  int rank_ = 0, size_ = 1;
  std::set<std::string> hosts_;
  bool under_mpi_ = false;
  std::shared_ptr<comm::TcpStoreServer> server_;
  std::shared_ptr<comm::Store> store_;                 // "doctor/" prefixed; null if unreachable
  std::shared_ptr<comm::ProcessGroup> mpi_;            // under mpirun
  std::shared_ptr<comm::ProcessGroup> clock_group_;    // the first group whose all-reduce passed
  std::vector<std::shared_ptr<comm::ProcessGroup>> groups_;
};

}  // namespace paratrain::monitor::doctor::detail
