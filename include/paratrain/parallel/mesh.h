// DeviceMesh: the job's ranks as a dp x tp x pp grid, and one process group per dimension.
//
// Rank order (DESIGN.md, "Device mesh"): tp_idx = rank % tp, dp_idx = (rank / tp) % dp,
// pp_idx = rank / (tp * dp). Tensor-parallel ranks are neighbours (one host), pipeline
// stages vary slowest, as Megatron-LM and torchtitan order them.
//
// Groups: tp() holds the ranks that differ only in tp_idx (tensor-parallel collectives),
// dp() those that differ only in dp_idx (gradient reduction, ZeRO), pp() those that differ
// only in pp_idx (activations between stages), model_parallel() those of one data-parallel
// replica (tp x pp: the loss scaler's and the gradient norm's model-parallel part). A group
// of one rank is null (nothing to communicate); world() is the whole job (null for one
// process). Every group is created once, from the world group, in the same order on every
// rank (construction is collective over world).
//
// Thread-safety: immutable after construction; the groups have their own rules
// (comm/process_group.h). Lifetime: holds the groups; they live as long as the mesh or
// whoever copied a shared_ptr.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::parallel {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
  int world() const { return dp * tp * pp; }
  std::string str() const;  // "dp 2 x tp 2 x pp 1"
};

// The shape of a job of `world` ranks from the requested sizes (0 = derive it: the one left
// out is world / the others'; dp when several are left out, the others 1). InputError naming
// the numbers when a size is negative, does not divide the world, or dp x tp x pp != world.
MeshShape resolve_mesh_shape(int64_t dp, int64_t tp, int64_t pp, int world);

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
};
MeshCoord mesh_coord(int rank, const MeshShape& shape);
int mesh_rank(const MeshCoord& c, const MeshShape& shape);

class DeviceMesh {
 public:
  // One process: every group null.
  DeviceMesh() = default;
  // Collective over `world` (null for one process); InputError unless shape.world() equals
  // the world group's size.
  DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  int rank() const { return rank_; }

  const std::shared_ptr<comm::ProcessGroup>& world() const { return world_; }
  const std::shared_ptr<comm::ProcessGroup>& dp() const { return dp_; }
  const std::shared_ptr<comm::ProcessGroup>& tp() const { return tp_; }
  const std::shared_ptr<comm::ProcessGroup>& pp() const { return pp_; }
  const std::shared_ptr<comm::ProcessGroup>& model_parallel() const { return mp_; }

  // World ranks of this rank's group along a dimension, ascending (e.g. {2, 3} for tp).
  std::vector<int> tp_ranks() const;
  std::vector<int> dp_ranks() const;
  std::vector<int> pp_ranks() const;

 private:
  MeshShape shape_;
  MeshCoord coord_;
  int rank_ = 0;
  std::shared_ptr<comm::ProcessGroup> world_, dp_, tp_, pp_, mp_;
};

}  // namespace paratrain::parallel
