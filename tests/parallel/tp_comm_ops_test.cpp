// The tensor-parallel collectives of comm_ops.h on tp = 1, 2 and 3 ranks as threads (shm
// groups), f32 and bf16: each forward and backward against the element-by-element rule it
// implements, exactly (the values are small integers, so every sum is exact in both dtypes),
// for (B, T, C) and (B, T, H, D) activations; TpGroup's tensor collectives and their checks.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "paratrain/autograd/engine.h"
#include "paratrain/base/error.h"
#include "paratrain/parallel/tensor_parallel/comm_ops.h"
#include "parallel/ddp_test_util.h"
#include "parallel/tp_test_values.h"

using namespace paratrain;
using namespace paratrain::parallel;

namespace {

using paratrain::testing::run_ranks;
using namespace paratrain::testing::tp_values;

Tensor leaf(Tensor t) {
  t.set_requires_grad(true);
  return t;
}

struct Case {
  int n;
  DType dt;
  Shape local;  // this rank's (B, T/n, ...) for the sequence ops
};

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int n : {1, 2, 3})
    for (DType dt : {DType::F32, DType::BF16}) {
      out.push_back({n, dt, {2, 3, 4}});
      out.push_back({n, dt, {3, 2, 2, 3}});
    }
  return out;
}

std::string name(const Case& c) {
  return "tp " + std::to_string(c.n) + " " + dtype_name(c.dt) + " " + shape_str(c.local);
}

}  // namespace

// gather_sequence: rank r's (B, T/n, ...) is block r of the (B, T, ...) every rank gets; its
// gradient is rank r's block of the sum of every rank's gradient. reduce_scatter_sequence: the
// conjugate.
TEST(TpCommOps, SequenceGatherAndReduceScatterFollowTheBlockRule) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const int64_t Tl = c.local[1];
    Shape full = c.local;
    full[1] = Tl * c.n;
    auto errors = run_ranks(c.n, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
      auto tp = std::make_shared<TpGroup>(pg);
      const int r = tp->rank();
      const std::string who = " on rank " + std::to_string(r);
      // gather_sequence
      Tensor x = leaf(make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 0); }));
      Tensor y = gather_sequence(x, tp);
      expect_values(y, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(static_cast<int>(t / Tl), b, t % Tl, k, 0); },
                    "gather_sequence" + who);
      if (c.n == 1) {
        EXPECT_TRUE(y.shares_storage(x));  // the identity
      } else {
        autograd::backward(y, make(full, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 1); }));
        expect_values(x.grad(), c.dt,
                      [&](int64_t b, int64_t t, int64_t k) {
                        float s = 0;
                        for (int q = 0; q < c.n; ++q) s += val(q, b, r * Tl + t, k, 1);
                        return s;
                      },
                      "gather_sequence's gradient" + who);
        EXPECT_EQ(tp->stats().calls, 2);  // one all-gather, one reduce-scatter
      }
      // reduce_scatter_sequence
      Tensor z = leaf(make(full, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 2); }));
      Tensor w = reduce_scatter_sequence(z, tp);
      expect_values(w, c.dt,
                    [&](int64_t b, int64_t t, int64_t k) {
                      float s = 0;
                      for (int q = 0; q < c.n; ++q) s += val(q, b, r * Tl + t, k, 2);
                      return s;
                    },
                    "reduce_scatter_sequence" + who);
      if (c.n > 1) {
        autograd::backward(w, make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 3); }));
        expect_values(z.grad(), c.dt,
                      [&](int64_t b, int64_t t, int64_t k) { return val(static_cast<int>(t / Tl), b, t % Tl, k, 3); },
                      "reduce_scatter_sequence's gradient" + who);
      }
    });
    for (int r = 0; r < c.n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

// gather_last_dim: (..., V/n) -> (..., V) with rank q's columns at [q V/n, (q+1) V/n); the
// gradient keeps this rank's columns. copy_to_tp / reduce_from_tp: identity and sum, each the
// other's backward.
TEST(TpCommOps, LastDimGatherAndTheConjugateAllReduces) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(name(c));
    const int64_t B = c.local[0], T = c.local[1];
    int64_t Vl = 1;
    for (size_t i = 2; i < c.local.size(); ++i) Vl *= c.local[i];
    auto errors = run_ranks(c.n, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
      auto tp = std::make_shared<TpGroup>(pg);
      const int r = tp->rank();
      const std::string who = " on rank " + std::to_string(r);
      const Shape local{B, T, Vl}, full{B, T, Vl * c.n};
      Tensor x = leaf(make(local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 4); }));
      Tensor y = gather_last_dim(x, tp);
      EXPECT_EQ(y.shape(), full);
      expect_values(y, c.dt, [&](int64_t b, int64_t t, int64_t j) { return val(static_cast<int>(j / Vl), b, t, j % Vl, 4); },
                    "gather_last_dim" + who);
      if (c.n > 1) {
        autograd::backward(y, make(full, c.dt, [&](int64_t b, int64_t t, int64_t j) { return val(r, b, t, j, 5); }));
        expect_values(x.grad(), c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, r * Vl + k, 5); },
                      "gather_last_dim's gradient" + who);
      }
      // copy_to_tp: identity forward, the sum of every rank's gradient backward.
      Tensor a = leaf(make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 6); }));
      Tensor fa = copy_to_tp(a, tp);
      expect_values(fa, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 6); }, "copy_to_tp" + who);
      // reduce_from_tp: the sum forward, identity backward.
      Tensor e = leaf(make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 7); }));
      Tensor ge = reduce_from_tp(e, tp);
      auto sum7 = [&](int64_t b, int64_t t, int64_t k) {
        float s = 0;
        for (int q = 0; q < c.n; ++q) s += val(q, b, t, k, 7);
        return s;
      };
      expect_values(ge, c.dt, sum7, "reduce_from_tp" + who);
      if (c.n > 1) {
        autograd::backward(fa, make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 8); }));
        expect_values(a.grad(), c.dt,
                      [&](int64_t b, int64_t t, int64_t k) {
                        float s = 0;
                        for (int q = 0; q < c.n; ++q) s += val(q, b, t, k, 8);
                        return s;
                      },
                      "copy_to_tp's gradient" + who);
        autograd::backward(ge, make(c.local, c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 9); }));
        expect_values(e.grad(), c.dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 9); },
                      "reduce_from_tp's gradient" + who);
      }
    });
    for (int r = 0; r < c.n; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

// The tensor collectives: a group of one rank copies; buffers that do not fit are InputErrors
// naming the call, before anything is sent.
TEST(TpCommOps, TpGroupTensorCollectivesCopyOnOneRankAndCheckTheirBuffers) {
  TpGroup one(nullptr);
  const Tensor in = Tensor::from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor out = Tensor::zeros({6});
  one.allgather(in, out);
  EXPECT_EQ(out.to_vector(), in.to_vector());
  Tensor back = Tensor::zeros({3, 2});
  one.reduce_scatter(out, back);
  EXPECT_EQ(back.to_vector(), in.to_vector());
  Tensor buf = in.clone();
  one.allreduce(buf);
  EXPECT_EQ(buf.to_vector(), in.to_vector());
  EXPECT_EQ(one.stats().calls, 0);  // nothing was sent

  auto message = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "";
  };
  Tensor small = Tensor::zeros({5});
  EXPECT_NE(message([&] { one.allgather(in, small); }).find("TpGroup::allgather"), std::string::npos);
  Tensor bf = Tensor::zeros({6}, DType::BF16);
  EXPECT_NE(message([&] { one.allgather(in, bf); }).find("f32 but output bf16"), std::string::npos);
  Tensor strided = Tensor::zeros({3, 2}).transpose(0, 1);
  EXPECT_NE(message([&] { one.reduce_scatter(out, strided); }).find("contiguous"), std::string::npos);
  Tensor t = in.transpose(0, 1);
  EXPECT_NE(message([&] { one.allreduce(t); }).find("contiguous"), std::string::npos);

  // Two ranks: an all-gather and a reduce-scatter of tensors, counted in the stats.
  auto errors = run_ranks(2, false, [&](std::shared_ptr<comm::ProcessGroup> pg) {
    TpGroup tp(pg);
    const float r = static_cast<float>(tp.rank());
    const Tensor mine = Tensor::from_vector({r, r + 10}, {2});
    Tensor all = Tensor::zeros({2, 2});
    tp.allgather(mine, all);
    EXPECT_EQ(all.to_vector(), (std::vector<float>{0, 10, 1, 11}));
    Tensor part = Tensor::zeros({2});  // block r of the gathered (equal on both ranks), twice
    tp.reduce_scatter(all, part);
    EXPECT_EQ(part.to_vector(), tp.rank() == 0 ? (std::vector<float>{0, 20}) : (std::vector<float>{2, 22}));
    EXPECT_EQ(tp.stats().calls, 2);
    EXPECT_EQ(tp.stats().bytes, 2 * (2 * 4 * 2));  // each: its full buffer per rank
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}
