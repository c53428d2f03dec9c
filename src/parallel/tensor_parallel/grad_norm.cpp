#include "paratrain/parallel/tensor_parallel/grad_norm.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "paratrain/kernels/registry.h"

namespace paratrain::parallel {

double mesh_grad_norm(const optim::NamedParams& params, const std::function<bool(const std::string&)>& tp_sharded,
                      const DeviceMesh& mesh, bool pieces_over_dp) {
  const bool dp_counts = pieces_over_dp || mesh.coord().dp == 0;
  double sq = 0.0;
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0 || !dp_counts) continue;
    if (!tp_sharded(name) && mesh.coord().tp != 0) continue;
    const Tensor c = g.contiguous();
    sq += kernels::kernel(&kernels::Registry::sum_squares, c)(c.data<float>(), c.numel());
  }
  const auto& world = mesh.world();
  if (world && world->size() > 1) {
    std::vector<int64_t> all(static_cast<size_t>(world->size()));
    int64_t mine;
    std::memcpy(&mine, &sq, sizeof mine);
    world->allgather(&mine, all.data(), 1, DType::I64)->wait();
    sq = 0.0;
    for (int64_t w : all) {
      double v;
      std::memcpy(&v, &w, sizeof v);
      sq += v;
    }
  }
  return std::sqrt(sq);
}

}  // namespace paratrain::parallel
