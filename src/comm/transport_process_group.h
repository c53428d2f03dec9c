// The ProcessGroup of the shm and tcp backends: algorithms/ over a Transport, run by an
// Engine. Internal; create groups through create_process_group*().
#pragma once

#include <memory>
#include <vector>

#include "comm/algorithms/algorithms.h"
#include "comm/engine.h"
#include "comm/p2p.h"
#include "comm/transport/mesh_transport.h"
#include "paratrain/comm/flight_recorder.h"
#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

// Options with every 0/unset field replaced by its environment value or default.
ProcessGroupOptions resolve_options(const ProcessGroupOptions& options);

class TransportProcessGroup : public ProcessGroup {
 public:
  // Collective over the `size` ranks sharing `store`'s key space.
  // `global_ranks`: the group's ranks in the job (empty = 0..size-1) and `name` ("" = the
  // flight recorder's choice), both for the flight recorder only.
  TransportProcessGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options,
                        std::vector<int> global_ranks = {}, std::string name = "");
  ~TransportProcessGroup() override;
  std::string backend_name() const override { return transport_->name(); }

  WorkPtr allreduce(void* buf, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr reduce_scatter(const void* in, void* out, size_t count, DType dtype, ReduceOp op) override;
  WorkPtr allgather(const void* in, void* out, size_t count, DType dtype) override;
  WorkPtr broadcast(void* buf, size_t count, DType dtype, int root) override;
  WorkPtr reduce(void* buf, size_t count, DType dtype, ReduceOp op, int root) override;
  WorkPtr all_to_all(const void* in, void* out, size_t count, DType dtype) override;
  WorkPtr send(const void* buf, size_t count, DType dtype, int dst, int tag) override;
  WorkPtr recv(void* buf, size_t count, DType dtype, int src, int tag) override;
  WorkPtr barrier() override;
  std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) override;

  // Keeps an object (e.g. the store server) alive as long as the group.
  void hold(std::shared_ptr<void> keep) { held_.push_back(std::move(keep)); }

 private:
  struct Call {
    OpType op;
    DType dtype;
    size_t count;
    int root;  // or peer; -1 if none
    ReduceOp reduce_op;
    int tag = 0;  // send/recv
  };
  WorkPtr submit(const Call& call, std::function<void(algorithms::Context&)> fn);
  // send/recv: started in call order on the engine, then progressed by p2p_.
  WorkPtr submit_p2p(const Call& call, const void* buf);
  static void check_dtype(const Call& call);
  void check_fingerprint(algorithms::Context& ctx, const Call& call, uint64_t seq);
  static std::string describe(const Call& call, uint64_t seq);

  std::shared_ptr<Store> store_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<Transport> p2p_transport_;  // send/recv only (their own pairs)
  std::unique_ptr<P2pEngine> p2p_;
  std::vector<char> scratch_;
  uint64_t seq_ = 0;
  int next_group_id_ = 0;
  std::vector<std::shared_ptr<void>> held_;
  FlightRecorder* recorder_;
  std::vector<int> global_ranks_;
  std::string name_;
  std::unique_ptr<Engine> engine_;  // last: destroyed first, so queued work drains with everything alive
};

}  // namespace paratrain::comm
