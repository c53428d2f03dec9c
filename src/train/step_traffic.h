// StepTraffic: what each mesh group's collectives and send/recv moved during one optimizer
// step, from the flight recorder's per-group totals (comm::GroupTraffic): the metrics'
// busbw_gbps (nccl-tests' bus bandwidth: bus bytes over the time the calls were in flight,
// summed) and comm_bytes_per_group, keyed "dp", "tp", "pp" (only groups that moved bytes).
//
// begin() at the step's start, end() after its last collective; both cheap (one lock of the
// recorder per group). Rank-local: each rank sees its own groups. With the recorder off
// (PARATRAIN_FR_BUFFER=0) nothing is counted and end() returns empty objects.
// Thread-safety: the training thread. Lifetime: holds the mesh's groups only by pointer; the
// mesh must outlive it.
#pragma once

#include <array>
#include <nlohmann/json.hpp>

#include "paratrain/comm/flight_recorder.h"
#include "paratrain/parallel/mesh.h"

namespace paratrain::train {

class StepTraffic {
 public:
  explicit StepTraffic(const parallel::DeviceMesh& mesh);
  void begin();
  // {"busbw_gbps": {"dp": ...}, "bytes": {"dp": ...}}
  nlohmann::json end() const;

 private:
  struct Dim {
    const char* name;
    int group = -1;  // FlightRecorder group id; -1: no group along this dimension
    comm::GroupTraffic before;
  };
  std::array<Dim, 3> dims_;
};

}  // namespace paratrain::train
