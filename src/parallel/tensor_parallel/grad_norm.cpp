#include "paratrain/parallel/tensor_parallel/grad_norm.h"

#include <cmath>

#include "paratrain/kernels/registry.h"
#include "parallel/rank_sum.h"

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
  sq = detail::sum_in_rank_order(mesh.world().get(), sq);
  return std::sqrt(sq);
}

}  // namespace paratrain::parallel
