#include "step_traffic.h"

namespace paratrain::train {

namespace {
int group_of(const std::shared_ptr<comm::ProcessGroup>& g) { return g ? g->record_group() : -1; }
}  // namespace

StepTraffic::StepTraffic(const parallel::DeviceMesh& mesh)
    : dims_{Dim{"dp", group_of(mesh.dp()), {}}, Dim{"tp", group_of(mesh.tp()), {}}, Dim{"pp", group_of(mesh.pp()), {}}} {}

void StepTraffic::begin() {
  comm::FlightRecorder& fr = comm::FlightRecorder::instance();
  for (Dim& d : dims_)
    if (d.group >= 0) d.before = fr.traffic(d.group);
}

nlohmann::json StepTraffic::end() const {
  comm::FlightRecorder& fr = comm::FlightRecorder::instance();
  nlohmann::json bw = nlohmann::json::object(), bytes = nlohmann::json::object();
  for (const Dim& d : dims_) {
    if (d.group < 0) continue;
    const comm::GroupTraffic now = fr.traffic(d.group);
    if (now.bytes == d.before.bytes) continue;
    bw[d.name] = now.busbw_gbps_since(d.before);
    bytes[d.name] = now.bytes - d.before.bytes;
  }
  return {{"busbw_gbps", bw}, {"bytes", bytes}};
}

}  // namespace paratrain::train
