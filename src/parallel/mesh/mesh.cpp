#include "paratrain/parallel/mesh.h"

#include <algorithm>
#include <functional>

#include "paratrain/base/error.h"

namespace paratrain::parallel {

std::string MeshShape::str() const {
  return "dp " + std::to_string(dp) + " x tp " + std::to_string(tp) + " x pp " + std::to_string(pp);
}

MeshShape resolve_mesh_shape(int64_t dp, int64_t tp, int64_t pp, int world) {
  if (dp < 0 || tp < 0 || pp < 0)
    PT_THROW(InputError, "--dp ", dp, " --tp ", tp, " --pp ", pp, ": sizes must be positive (0 or left out = derived)");
  const auto size = [](int64_t v) { return v ? std::to_string(v) : std::string("?"); };
  // A size above the world cannot divide it (checked first: the product could overflow).
  const bool too_big = dp > world || tp > world || pp > world;
  const int64_t given = too_big ? 0 : (dp ? dp : 1) * (tp ? tp : 1) * (pp ? pp : 1);
  if (too_big || world % given != 0)
    PT_THROW(InputError, "layout --dp ", size(dp), " --tp ", size(tp), " --pp ", size(pp), " does not divide the ",
             world, " ranks of this job (dp x tp x pp must equal the world size; ? = derived)");
  const int64_t rest = world / given;
  // The one size left out takes the rest; dp first when several are.
  if (!dp) dp = rest;
  else if (!tp) tp = rest;
  else if (!pp) pp = rest;
  if (!tp) tp = 1;
  if (!pp) pp = 1;
  if (dp * tp * pp != world)
    PT_THROW(InputError, "layout dp ", dp, " x tp ", tp, " x pp ", pp, " = ", dp * tp * pp, " ranks, but this job has ",
             world, " (dp x tp x pp must equal the world size)");
  return {static_cast<int>(dp), static_cast<int>(tp), static_cast<int>(pp)};
}

MeshCoord mesh_coord(int rank, const MeshShape& s) {
  return {(rank / s.tp) % s.dp, rank % s.tp, rank / (s.tp * s.dp)};
}

int mesh_rank(const MeshCoord& c, const MeshShape& s) { return c.tp + s.tp * (c.dp + s.dp * c.pp); }

namespace {
// The world ranks whose coordinates equal `c` except along the varying ones.
std::vector<int> ranks_where(const MeshShape& s, const std::function<bool(const MeshCoord&)>& same) {
  std::vector<int> out;
  for (int r = 0; r < s.world(); ++r)
    if (same(mesh_coord(r, s))) out.push_back(r);
  return out;
}
}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<comm::ProcessGroup> world, const MeshShape& shape)
    : shape_(shape), world_(std::move(world)) {
  const int size = world_ ? world_->size() : 1;
  if (shape.world() != size)
    PT_THROW(InputError, "device mesh ", shape.str(), " needs ", shape.world(), " ranks, the job has ", size);
  rank_ = world_ ? world_->rank() : 0;
  coord_ = mesh_coord(rank_, shape_);
  if (!world_ || size == 1) return;
  // Every rank creates every group of a dimension in the same order (new_group's rule) and
  // keeps the one it belongs to; groups of one rank are not created.
  auto build = [&](int n, const std::function<MeshCoord(const MeshCoord&, int)>& member,
                   const std::function<bool(const MeshCoord&)>& is_first) {
    std::shared_ptr<comm::ProcessGroup> mine;
    if (n == 1) return mine;
    for (int r = 0; r < size; ++r) {
      const MeshCoord c = mesh_coord(r, shape_);
      if (!is_first(c)) continue;
      std::vector<int> ranks;
      for (int i = 0; i < n; ++i) ranks.push_back(mesh_rank(member(c, i), shape_));
      std::sort(ranks.begin(), ranks.end());
      auto g = world_->new_group(ranks);
      if (g) mine = g;
    }
    return mine;
  };
  tp_ = build(shape_.tp, [](MeshCoord c, int i) { return c.tp = i, c; }, [](const MeshCoord& c) { return c.tp == 0; });
  dp_ = build(shape_.dp, [](MeshCoord c, int i) { return c.dp = i, c; }, [](const MeshCoord& c) { return c.dp == 0; });
  pp_ = build(shape_.pp, [](MeshCoord c, int i) { return c.pp = i, c; }, [](const MeshCoord& c) { return c.pp == 0; });
  const int tp = shape_.tp;
  mp_ = build(shape_.tp * shape_.pp,
              [tp](MeshCoord c, int i) { return c.tp = i % tp, c.pp = i / tp, c; },
              [](const MeshCoord& c) { return c.tp == 0 && c.pp == 0; });
}

std::vector<int> DeviceMesh::tp_ranks() const {
  const MeshCoord me = coord_;
  return ranks_where(shape_, [me](const MeshCoord& c) { return c.dp == me.dp && c.pp == me.pp; });
}
std::vector<int> DeviceMesh::dp_ranks() const {
  const MeshCoord me = coord_;
  return ranks_where(shape_, [me](const MeshCoord& c) { return c.tp == me.tp && c.pp == me.pp; });
}
std::vector<int> DeviceMesh::pp_ranks() const {
  const MeshCoord me = coord_;
  return ranks_where(shape_, [me](const MeshCoord& c) { return c.tp == me.tp && c.dp == me.dp; });
}

}  // namespace paratrain::parallel
