// The device mesh (include/paratrain/parallel/mesh.h): the layout a job's --dp/--tp/--pp
// resolve to, the rank order of DESIGN.md ("Device mesh": tp_idx = rank % tp,
// dp_idx = (rank / tp) % dp, pp_idx = rank / (tp * dp)), and the groups a DeviceMesh builds
// over real process groups (ranks as threads, shm backend): every group holds exactly the
// ranks the formulas say, an all-reduce over it sums exactly those ranks, and a dimension of
// one rank has no group.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/parallel/mesh.h"
#include "parallel/ddp_test_util.h"

using namespace paratrain;
using paratrain::parallel::DeviceMesh;
using paratrain::parallel::mesh_coord;
using paratrain::parallel::mesh_rank;
using paratrain::parallel::MeshCoord;
using paratrain::parallel::MeshShape;
using paratrain::parallel::resolve_mesh_shape;
using ::testing::HasSubstr;

namespace {

MeshShape shape(int dp, int tp, int pp) {
  MeshShape s;
  s.dp = dp, s.tp = tp, s.pp = pp;
  return s;
}

void expect_shape(const MeshShape& got, int dp, int tp, int pp, const std::string& what) {
  EXPECT_EQ(got.dp, dp) << what;
  EXPECT_EQ(got.tp, tp) << what;
  EXPECT_EQ(got.pp, pp) << what;
  std::printf("  %-28s -> %s\n", what.c_str(), got.str().c_str());
}

// The InputError message of resolve_mesh_shape, "" when it did not throw one.
std::string resolve_error(int64_t dp, int64_t tp, int64_t pp, int world) {
  try {
    resolve_mesh_shape(dp, tp, pp, world);
  } catch (const InputError& e) {
    std::printf("  dp %lld tp %lld pp %lld on %d: %s\n", static_cast<long long>(dp), static_cast<long long>(tp),
                static_cast<long long>(pp), world, e.what());
    return e.what();
  }
  return "";
}

// The DESIGN.md coordinates, written out independently of mesh_coord.
MeshCoord design_coord(int rank, const MeshShape& s) {
  MeshCoord c;
  c.tp = rank % s.tp;
  c.dp = (rank / s.tp) % s.dp;
  c.pp = rank / (s.tp * s.dp);
  return c;
}

}  // namespace

TEST(MeshShapeResolve, DerivesTheSizesLeftOut) {
  expect_shape(resolve_mesh_shape(0, 0, 0, 1), 1, 1, 1, "nothing on 1");
  expect_shape(resolve_mesh_shape(0, 0, 0, 4), 4, 1, 1, "nothing on 4 (dp = world)");
  expect_shape(resolve_mesh_shape(0, 0, 0, 8), 8, 1, 1, "nothing on 8 (dp = world)");
  expect_shape(resolve_mesh_shape(0, 2, 0, 4), 2, 2, 1, "--tp 2 on 4");
  expect_shape(resolve_mesh_shape(0, 2, 0, 8), 4, 2, 1, "--tp 2 on 8");
  expect_shape(resolve_mesh_shape(0, 4, 0, 4), 1, 4, 1, "--tp 4 on 4");
  expect_shape(resolve_mesh_shape(2, 0, 0, 4), 2, 2, 1, "--dp 2 on 4");
  expect_shape(resolve_mesh_shape(4, 0, 0, 4), 4, 1, 1, "--dp 4 on 4");
  expect_shape(resolve_mesh_shape(0, 0, 2, 8), 4, 1, 2, "--pp 2 on 8");
  expect_shape(resolve_mesh_shape(2, 2, 0, 4), 2, 2, 1, "--dp 2 --tp 2 on 4");
  expect_shape(resolve_mesh_shape(2, 2, 0, 8), 2, 2, 2, "--dp 2 --tp 2 on 8");
  expect_shape(resolve_mesh_shape(0, 2, 2, 8), 2, 2, 2, "--tp 2 --pp 2 on 8");
  expect_shape(resolve_mesh_shape(2, 0, 2, 8), 2, 2, 2, "--dp 2 --pp 2 on 8");
  expect_shape(resolve_mesh_shape(2, 2, 1, 4), 2, 2, 1, "--dp 2 --tp 2 --pp 1 on 4");
  expect_shape(resolve_mesh_shape(2, 2, 2, 8), 2, 2, 2, "--dp 2 --tp 2 --pp 2 on 8");
  expect_shape(resolve_mesh_shape(3, 1, 2, 6), 3, 1, 2, "--dp 3 --tp 1 --pp 2 on 6");
  expect_shape(resolve_mesh_shape(1, 1, 1, 1), 1, 1, 1, "--dp 1 --tp 1 --pp 1 on 1");
}

TEST(MeshShapeResolve, ProductNotTheWorldIsAnInputErrorNamingTheNumbers) {
  // All three given, product below the world.
  std::string e = resolve_error(1, 2, 1, 4);
  EXPECT_THAT(e, HasSubstr("dp 1 x tp 2 x pp 1"));
  EXPECT_THAT(e, HasSubstr("= 2 ranks"));
  EXPECT_THAT(e, HasSubstr("4"));
  // All three given, product above the world.
  e = resolve_error(2, 2, 2, 4);
  EXPECT_THAT(e, HasSubstr("--dp 2 --tp 2 --pp 2"));
  EXPECT_THAT(e, HasSubstr("4 ranks"));
  // Two given: the product of the two exceeds the world.
  e = resolve_error(4, 2, 0, 4);
  EXPECT_THAT(e, HasSubstr("--dp 4 --tp 2"));
  EXPECT_THAT(e, HasSubstr("4 ranks"));
}

TEST(MeshShapeResolve, SizeNotDividingTheWorldIsAnInputErrorNamingTheNumbers) {
  std::string e = resolve_error(0, 3, 0, 4);
  EXPECT_THAT(e, HasSubstr("tp 3"));
  EXPECT_THAT(e, HasSubstr("4 ranks"));
  e = resolve_error(3, 0, 0, 8);
  EXPECT_THAT(e, HasSubstr("dp 3"));
  EXPECT_THAT(e, HasSubstr("8 ranks"));
  e = resolve_error(0, 0, 3, 4);
  EXPECT_THAT(e, HasSubstr("pp 3"));
  EXPECT_THAT(e, HasSubstr("4 ranks"));
  e = resolve_error(0, 2, 3, 8);  // 2 x 3 = 6 does not divide 8
  EXPECT_THAT(e, HasSubstr("tp 2"));
  EXPECT_THAT(e, HasSubstr("pp 3"));
  EXPECT_THAT(e, HasSubstr("8 ranks"));
}

TEST(MeshShapeResolve, HugeSizesAreAnInputErrorNotAnOverflow) {
  // 2^32 x 2^32 would wrap to 0 in int64 before the division: rejected first.
  const std::string e = resolve_error(int64_t(1) << 32, int64_t(1) << 32, 0, 4);
  EXPECT_THAT(e, HasSubstr("--dp 4294967296"));
  EXPECT_THAT(e, HasSubstr("does not divide the 4 ranks"));
}

TEST(MeshShapeResolve, NegativeSizeIsAnInputErrorNamingTheNumbers) {
  std::string e = resolve_error(-1, 0, 0, 4);
  EXPECT_THAT(e, HasSubstr("--dp -1"));
  e = resolve_error(0, -2, 0, 4);
  EXPECT_THAT(e, HasSubstr("--tp -2"));
  e = resolve_error(2, 2, -1, 4);
  EXPECT_THAT(e, HasSubstr("--pp -1"));
  EXPECT_THAT(e, HasSubstr("--dp 2"));
  EXPECT_THAT(e, HasSubstr("--tp 2"));
}

TEST(MeshCoords, FollowDesignOrderAndMeshRankInvertsThem) {
  for (const MeshShape s : {shape(2, 2, 1), shape(1, 4, 1), shape(2, 2, 2), shape(3, 1, 2)}) {
    std::set<std::tuple<int, int, int>> seen;
    std::string line;
    for (int r = 0; r < s.world(); ++r) {
      const MeshCoord c = mesh_coord(r, s), want = design_coord(r, s);
      EXPECT_EQ(c.tp, want.tp) << s.str() << " rank " << r;
      EXPECT_EQ(c.dp, want.dp) << s.str() << " rank " << r;
      EXPECT_EQ(c.pp, want.pp) << s.str() << " rank " << r;
      EXPECT_TRUE(c.tp >= 0 && c.tp < s.tp && c.dp >= 0 && c.dp < s.dp && c.pp >= 0 && c.pp < s.pp)
          << s.str() << " rank " << r;
      EXPECT_EQ(mesh_rank(c, s), r) << s.str() << " rank " << r;
      seen.insert({c.dp, c.tp, c.pp});
      line += " " + std::to_string(r) + ":(" + std::to_string(c.dp) + "," + std::to_string(c.tp) + "," +
              std::to_string(c.pp) + ")";
    }
    EXPECT_EQ(static_cast<int>(seen.size()), s.world()) << s.str() << ": every rank has its own coordinates";
    // And every coordinate maps back to a rank whose coordinates it is.
    for (int pp = 0; pp < s.pp; ++pp)
      for (int dp = 0; dp < s.dp; ++dp)
        for (int tp = 0; tp < s.tp; ++tp) {
          MeshCoord c;
          c.dp = dp, c.tp = tp, c.pp = pp;
          const int r = mesh_rank(c, s);
          ASSERT_TRUE(r >= 0 && r < s.world()) << s.str();
          const MeshCoord back = mesh_coord(r, s);
          EXPECT_TRUE(back.dp == dp && back.tp == tp && back.pp == pp) << s.str() << " rank " << r;
        }
    std::printf("  %s (rank:(dp,tp,pp)):%s\n", s.str().c_str(), line.c_str());
  }
  // Spot values, written out by hand: tensor-parallel ranks are neighbours, pipeline stages
  // vary slowest.
  const MeshShape s = shape(2, 2, 2);
  const MeshCoord c5 = mesh_coord(5, s);  // 5 = tp 1 + 2 * (dp 0 + 2 * pp 1)
  EXPECT_TRUE(c5.tp == 1 && c5.dp == 0 && c5.pp == 1);
  const MeshCoord c6 = mesh_coord(6, s);  // 6 = tp 0 + 2 * (dp 1 + 2 * pp 1)
  EXPECT_TRUE(c6.tp == 0 && c6.dp == 1 && c6.pp == 1);
  const MeshCoord c4 = mesh_coord(4, shape(3, 1, 2));  // 4 = dp 1 + 3 * pp 1
  EXPECT_TRUE(c4.tp == 0 && c4.dp == 1 && c4.pp == 1);
}

TEST(DeviceMeshLocal, OneProcessHasNoGroups) {
  DeviceMesh one;
  EXPECT_EQ(one.rank(), 0);
  EXPECT_EQ(one.shape().world(), 1);
  EXPECT_EQ(one.world(), nullptr);
  EXPECT_EQ(one.tp(), nullptr);
  EXPECT_EQ(one.dp(), nullptr);
  EXPECT_EQ(one.pp(), nullptr);
  EXPECT_EQ(one.model_parallel(), nullptr);
  DeviceMesh null_world(nullptr, shape(1, 1, 1));
  EXPECT_EQ(null_world.tp(), nullptr);
  EXPECT_EQ(null_world.tp_ranks(), std::vector<int>{0});
  EXPECT_EQ(null_world.dp_ranks(), std::vector<int>{0});
  EXPECT_EQ(null_world.pp_ranks(), std::vector<int>{0});
  try {
    DeviceMesh bad(nullptr, shape(1, 2, 1));
    ADD_FAILURE() << "a tp 2 mesh on one process was accepted";
  } catch (const InputError& e) {
    std::printf("  dp 1 x tp 2 on one process: %s\n", e.what());
    EXPECT_THAT(std::string(e.what()), HasSubstr("dp 1 x tp 2 x pp 1"));
  }
}

namespace {

// The world ranks sharing this rank's coordinates except along the ones `vary` says may
// differ, ascending (from the DESIGN.md formulas, not from DeviceMesh).
std::vector<int> expected_members(int rank, const MeshShape& s, bool vary_dp, bool vary_tp, bool vary_pp) {
  const MeshCoord me = design_coord(rank, s);
  std::vector<int> out;
  for (int r = 0; r < s.world(); ++r) {
    const MeshCoord c = design_coord(r, s);
    if ((vary_dp || c.dp == me.dp) && (vary_tp || c.tp == me.tp) && (vary_pp || c.pp == me.pp)) out.push_back(r);
  }
  return out;
}

// Sum over `group` of every member's world rank, as i32 and as f32; checks the group is null
// exactly when `members` is one rank, and its size and this rank's place in it.
void check_group(const std::shared_ptr<comm::ProcessGroup>& group, const std::vector<int>& members, int world_rank,
                 const std::string& what) {
  if (members.size() == 1) {
    EXPECT_EQ(group, nullptr) << what << " of rank " << world_rank << ": a dimension of one rank has no group";
    return;
  }
  ASSERT_NE(group, nullptr) << what << " of rank " << world_rank;
  EXPECT_EQ(group->size(), static_cast<int>(members.size())) << what << " of rank " << world_rank;
  const int place = static_cast<int>(std::find(members.begin(), members.end(), world_rank) - members.begin());
  EXPECT_EQ(group->rank(), place) << what << " of rank " << world_rank;
  const int want = std::accumulate(members.begin(), members.end(), 0);
  int32_t i = world_rank;
  group->allreduce(&i, 1, DType::I32)->wait();
  EXPECT_EQ(i, want) << what << " of rank " << world_rank << ": all-reduce of the world ranks";
  float f = static_cast<float>(world_rank);
  group->allreduce(&f, 1, DType::F32)->wait();
  EXPECT_EQ(f, static_cast<float>(want)) << what << " of rank " << world_rank << ": f32 all-reduce";
}

void check_mesh_over_threads(const MeshShape& s) {
  const int n = s.world();
  std::vector<std::string> lines(n);
  auto errors = paratrain::testing::run_ranks(n, true, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    const int r = pg->rank();
    DeviceMesh mesh(pg, s);
    EXPECT_EQ(mesh.rank(), r);
    const MeshCoord want = design_coord(r, s);
    EXPECT_TRUE(mesh.coord().dp == want.dp && mesh.coord().tp == want.tp && mesh.coord().pp == want.pp)
        << s.str() << " rank " << r;
    EXPECT_EQ(mesh.world(), pg);

    const auto tp = expected_members(r, s, false, true, false);
    const auto dp = expected_members(r, s, true, false, false);
    const auto pp = expected_members(r, s, false, false, true);
    const auto mp = expected_members(r, s, false, true, true);  // one data-parallel replica
    EXPECT_EQ(mesh.tp_ranks(), tp) << s.str() << " rank " << r;
    EXPECT_EQ(mesh.dp_ranks(), dp) << s.str() << " rank " << r;
    EXPECT_EQ(mesh.pp_ranks(), pp) << s.str() << " rank " << r;
    EXPECT_EQ(static_cast<int>(tp.size()), s.tp);
    EXPECT_EQ(static_cast<int>(dp.size()), s.dp);
    EXPECT_EQ(static_cast<int>(pp.size()), s.pp);
    EXPECT_EQ(static_cast<int>(mp.size()), s.tp * s.pp);

    // In the same order on every rank (each call is collective over its own group; the
    // groups of one dimension are disjoint, so this order cannot deadlock).
    check_group(mesh.tp(), tp, r, s.str() + " tp()");
    check_group(mesh.dp(), dp, r, s.str() + " dp()");
    check_group(mesh.pp(), pp, r, s.str() + " pp()");
    check_group(mesh.model_parallel(), mp, r, s.str() + " model_parallel()");
    if (mesh.tp()) EXPECT_EQ(mesh.tp()->rank(), want.tp);
    if (mesh.dp()) EXPECT_EQ(mesh.dp()->rank(), want.dp);
    if (mesh.pp()) EXPECT_EQ(mesh.pp()->rank(), want.pp);
    if (mesh.model_parallel()) EXPECT_EQ(mesh.model_parallel()->rank(), want.tp + s.tp * want.pp);
    int32_t all = r;
    pg->allreduce(&all, 1, DType::I32)->wait();
    EXPECT_EQ(all, n * (n - 1) / 2);

    // The all-reduced sum over each group ("null" where the dimension has one rank).
    auto sum = [](const std::vector<int>& v) {
      return v.size() == 1 ? std::string("null") : std::to_string(std::accumulate(v.begin(), v.end(), 0));
    };
    char buf[200];
    std::snprintf(buf, sizeof buf, "rank %d (dp %d, tp %d, pp %d): sums tp %s dp %s pp %s model_parallel %s", r,
                  want.dp, want.tp, want.pp, sum(tp).c_str(), sum(dp).c_str(), sum(pp).c_str(), sum(mp).c_str());
    lines[r] = buf;
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(errors[r], "") << s.str() << " rank " << r;
  std::printf("  %s:\n", s.str().c_str());
  for (const auto& l : lines) std::printf("    %s\n", l.c_str());
}

}  // namespace

TEST(DeviceMeshGroups, World4AsDp2Tp2) { check_mesh_over_threads(shape(2, 2, 1)); }

TEST(DeviceMeshGroups, World8AsDp2Tp2Pp2) { check_mesh_over_threads(shape(2, 2, 2)); }

// No tensor parallelism: tp() is null and the model-parallel group is the pipeline group.
TEST(DeviceMeshGroups, World6AsDp3Pp2) { check_mesh_over_threads(shape(3, 1, 2)); }

TEST(DeviceMeshGroups, ShapeNotMatchingTheWorldIsAnInputError) {
  std::vector<std::string> messages(4);
  auto errors = paratrain::testing::run_ranks(4, true, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    for (const MeshShape s : {shape(2, 1, 1), shape(2, 2, 2), shape(1, 3, 1)}) {
      try {
        DeviceMesh mesh(pg, s);
        ADD_FAILURE() << s.str() << " accepted on 4 ranks";
      } catch (const InputError& e) {
        EXPECT_THAT(std::string(e.what()), HasSubstr(s.str())) << "rank " << pg->rank();
        EXPECT_THAT(std::string(e.what()), HasSubstr(std::to_string(s.world()))) << "rank " << pg->rank();
        EXPECT_THAT(std::string(e.what()), HasSubstr("4")) << "rank " << pg->rank();
        if (pg->rank() == 0) messages[0] += std::string("\n    ") + e.what();
      }
    }
    // The group still works after the refused meshes (nothing was half-built).
    DeviceMesh ok(pg, shape(1, 4, 1));
    int32_t v = pg->rank();
    ok.tp()->allreduce(&v, 1, DType::I32)->wait();
    EXPECT_EQ(v, 6);
    EXPECT_EQ(ok.dp(), nullptr);
    EXPECT_EQ(ok.pp(), nullptr);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  std::printf("  on 4 ranks:%s\n", messages[0].c_str());
}
