#include "paratrain/parallel/tensor_parallel/grad_norm.h"

#include <cmath>

#include "paratrain/kernels/tensor_reduce.h"
#include "parallel/rank_sum.h"

namespace paratrain::parallel {

double mesh_grad_norm(const optim::NamedParams& params, const std::function<bool(const std::string&)>& tp_sharded,
                      const DeviceMesh& mesh, bool pieces_over_dp) {
  const bool dp_counts = pieces_over_dp || mesh.coord().dp == 0;
  std::vector<Tensor> grads;
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0 || !dp_counts) continue;
    if (!tp_sharded(name) && mesh.coord().tp != 0) continue;
    grads.push_back(g.contiguous());
  }
  double sq = kernels::sum_of_squares(grads);  // one read-back, not one per tensor
  sq = detail::sum_in_rank_order(mesh.world().get(), sq);
  return std::sqrt(sq);
}

}  // namespace paratrain::parallel
