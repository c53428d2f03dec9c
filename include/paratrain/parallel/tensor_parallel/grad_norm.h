// The global gradient norm of a run laid out on a device mesh (REFERENCE.md: parameters
// replicated across tp count once, sharded ones are summed over the tp group).
//
// Each rank adds the squares of its gradients in f64: those of tensor-parallel-sharded
// parameters always, those of replicated ones only on tp rank 0; when the gradients are
// replicas over dp (plain data parallelism) only dp rank 0 contributes, when they are ZeRO
// pieces (disjoint over dp) every dp rank does. The contributions are gathered over the
// world and added in rank order, so every rank gets the same, deterministic norm.
// Collective over mesh.world(). Thread-safety: one thread per rank.
#pragma once

#include <functional>
#include <string>

#include "paratrain/optim/optimizer.h"
#include "paratrain/parallel/mesh.h"

namespace paratrain::parallel {

double mesh_grad_norm(const optim::NamedParams& params, const std::function<bool(const std::string&)>& tp_sharded,
                      const DeviceMesh& mesh, bool pieces_over_dp);

}  // namespace paratrain::parallel
