// Tensor parallelism's pieces on GPUs: the vocabulary-parallel embedding kernels against their
// CPU twins; on one GPU the layers with a tensor-parallel group of one rank (the lookup, the
// position ids, the tied logits, a sequence-parallel LayerNorm built from a GPU layer) and
// TpGroup's copies; the collectives of comm_ops.h with two ranks in two threads (over nccl on
// two GPUs, or sharing one over shm, which stages the GPU buffers through host memory), against the same exact rules as tests/parallel/tp_comm_ops_test.cpp (the packs are
// strided copies on the device, and each collective only orders the compute stream).
#include <cmath>
#include <mutex>
#include <thread>

#include "gpu/gpu_test_util.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/autograd/ops.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"
#include "paratrain/kernels/registry.h"
#include "paratrain/parallel/tensor_parallel/comm_ops.h"
#include "paratrain/parallel/tensor_parallel/layers.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/random.h"
#include "parallel/tp_test_values.h"

using namespace paratrain;
using namespace paratrain::parallel;
using namespace paratrain::testing::tp_values;

namespace {

const DeviceSpec kGpu0{Device::CUDA, 0};

Tensor randn(const Shape& s, uint64_t seed) {
  Generator g(seed);
  Tensor t = Tensor::empty(s);
  fill_normal(t, g, 0.0f, 1.0f);
  return t;
}

// |a - b| <= tol * (1 + |b|) everywhere; the first failure named.
void expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(std::fabs(a[i] - b[i]) <= tol * (1.0 + std::fabs(b[i])))) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << ", the CPU's " << b[i] << " (tol " << tol << ")";
      return;
    }
}

}  // namespace

// Rows [start, start+R) of V = 23 (the last range padded): the forward is the CPU's bit for bit
// (a copy or a zero per element), the backward too (each row's positions in order, into a
// prefilled gradient); a bad id is the CPU's InputError at the next wait, its row NaN.
TEST(TensorParallelOnGpu, VocabEmbeddingKernelsFollowTheCpu) {
  PT_REQUIRE_GPU();
  const int64_t N = 301, V = 23, R = 8, C = 67;
  std::vector<int32_t> ids(N);
  for (int64_t i = 0; i < N; ++i) ids[i] = static_cast<int32_t>((i * 5 + i / 7) % V);
  const Tensor tok = Tensor::from_vector_i32(ids, {N});
  const Tensor dout = randn({N, C}, 3);
  auto& reg = kernels::registry();
  for (int64_t start : {int64_t(0), R, 2 * R}) {
    SCOPED_TRACE("start " + std::to_string(start));
    const Tensor w = randn({R, C}, 10 + static_cast<uint64_t>(start));
    Tensor out = Tensor::empty({N, C}), d = Tensor::full({R, C}, 0.25);
    reg.vocab_embedding_forward.at(Device::CPU, DType::F32)(out.data_ptr(), tok.data<int32_t>(), w.data_ptr(), N, V,
                                                            start, R, C);
    reg.vocab_embedding_backward.at(Device::CPU, DType::F32)(d.data_ptr(), dout.data_ptr(), tok.data<int32_t>(), N, V,
                                                             start, R, C);
    const Tensor gt = tok.to(kGpu0), gw = w.to(kGpu0), gdout = dout.to(kGpu0);
    Tensor gout = Tensor::full({N, C}, -9.0, DType::F32, kGpu0), gd = Tensor::full({R, C}, 0.25, DType::F32, kGpu0);
    reg.vocab_embedding_forward.at(Device::CUDA, DType::F32)(gout.data_ptr(), gt.data<int32_t>(), gw.data_ptr(), N, V,
                                                             start, R, C);
    reg.vocab_embedding_backward.at(Device::CUDA, DType::F32)(gd.data_ptr(), gdout.data_ptr(), gt.data<int32_t>(), N, V,
                                                              start, R, C);
    EXPECT_EQ(gout.to_vector(), out.to_vector());
    EXPECT_EQ(gd.to_vector(), d.to_vector()) << "vocab_embedding_backward: the CPU's order, its bits";
  }
  ids[17] = static_cast<int32_t>(V);
  const Tensor bad = Tensor::from_vector_i32(ids, {N}).to(kGpu0);
  const Tensor gw = randn({R, C}, 4).to(kGpu0);
  Tensor gout = Tensor::full({N, C}, 2.0, DType::F32, kGpu0);
  // A bad id is found on the device without a wait and raised at the next wait for the GPU's
  // results (tensor/cuda_device_errors.h); its output row is NaN, the others are written.
  reg.vocab_embedding_forward.at(Device::CUDA, DType::F32)(gout.data_ptr(), bad.data<int32_t>(), gw.data_ptr(), N, V, 0,
                                                           R, C);
  try {
    paratrain::cuda::synchronize();
    ADD_FAILURE() << "no InputError for token id " << V;
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("token id 23 at position 17"), std::string::npos) << e.what();
  }
  const std::vector<float> got = gout.to_vector();  // the record was cleared: no second error
  const std::vector<float> wv = gw.to_vector();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) {
      const float g = got[static_cast<size_t>(i * C + c)];
      if (i == 17) {
        EXPECT_TRUE(std::isnan(g)) << "the bad id's row, column " << c;
      } else {
        const float want = ids[i] < R ? wv[static_cast<size_t>(ids[i] * C + c)] : 0.0f;  // rows past the shard: 0
        EXPECT_EQ(g, want) << "row " << i << " column " << c;
      }
    }
}

// A tensor-parallel group of one rank on cuda:0: the layers built from GPU layers live on the
// GPU and compute what the whole layers compute on the CPU.
TEST(TensorParallelOnGpu, LayersWithOneRankRunOnTheGpu) {
  PT_REQUIRE_GPU();
  auto one = std::make_shared<TpGroup>(nullptr);
  // TpGroup's tensor collectives copy on the device.
  const Tensor a = randn({3, 5}, 1).to(kGpu0);
  Tensor all = Tensor::zeros({15}, DType::F32, kGpu0), back = Tensor::zeros({3, 5}, DType::F32, kGpu0);
  one->allgather(a, all);
  one->reduce_scatter(all, back);
  EXPECT_EQ(back.to_vector(), a.to_vector());

  Generator gen(7);
  const int64_t V = 29, C = 16, T = 6, B = 3;
  nn::Embedding wte(V, C, gen, 0.02f), wpe(T, C, gen, 0.02f);
  nn::Embedding wte_gpu(V, C, gen), wpe_gpu(T, C, gen);
  {
    autograd::NoGradGuard ng;
    wte_gpu.weight.copy_(wte.weight);
    wpe_gpu.weight.copy_(wpe.weight);
  }
  wte_gpu.to(kGpu0);
  wpe_gpu.to(kGpu0);
  VocabParallelEmbedding vp(wte_gpu, one, false);
  ASSERT_TRUE(vp.weight.is_cuda());
  std::vector<int32_t> ids(B * T);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 11) % V);
  const Tensor tok = Tensor::from_vector_i32(ids, {B, T});
  const Tensor want = wte.forward_with_positions(tok, wpe);
  for (int call = 0; call < 2; ++call) {  // the second call takes the cached position ids
    const Tensor got = vp.forward_with_positions(tok.to(kGpu0), wpe_gpu);
    ASSERT_TRUE(got.is_cuda());
    EXPECT_EQ(got.to_vector(), want.to_vector()) << "call " << call;
  }
  // Backward: the lookup's scatter into the table.
  const Tensor seed = randn({B, T, C}, 9);
  autograd::backward(ops::sum(ops::mul(wte.forward(tok), seed)));
  autograd::backward(ops::sum(ops::mul(vp.forward(tok.to(kGpu0)), seed.to(kGpu0))));
  expect_close(vp.weight.grad().to_vector(), wte.weight.grad().to_vector(), 1e-6, "the table's gradient");
  // The tied logits: the matmul, padding dropped (none with one rank).
  const Tensor h = randn({B, T, C}, 12);
  expect_close(vp.tied_logits(h.to(kGpu0)).to_vector(), wte.tied_logits(h).to_vector(), 1e-5, "tied_logits");
  // A sequence-parallel LayerNorm made from a GPU LayerNorm has its parameters there.
  nn::LayerNorm ln(C);
  ln.to(kGpu0);
  SequenceParallelLayerNorm spln(ln, one);
  EXPECT_TRUE(spln.weight.is_cuda());
  EXPECT_TRUE(spln.bias.is_cuda());
  EXPECT_EQ(spln.weight.to_vector(), std::vector<float>(C, 1.0f));
}

// Two ranks, on cuda:0 and cuda:1 over nccl where there are two GPUs, else both on cuda:0 over
// shm: gather_sequence, reduce_scatter_sequence, gather_last_dim, copy_to_tp and
// reduce_from_tp on device tensors, forward and backward, exact.
TEST(TensorParallelOnGpu, CommOpsOnTwoRanks) {
  PT_REQUIRE_GPU();
  const bool two_gpus = cuda::device_count() >= 2;
  auto store = std::make_shared<comm::HashStore>();
  std::mutex mu;
  std::vector<std::string> errors;
  auto rank_main = [&](int rank) {
    try {
      const int gpu = two_gpus ? rank : 0;
      cuda::set_device(gpu);
      const DeviceSpec dev{Device::CUDA, gpu};
      comm::ProcessGroupOptions o;
      o.backend = two_gpus ? "nccl" : "shm";
      o.timeout_s = 60;
      auto tp = std::make_shared<TpGroup>(comm::create_process_group(store, rank, 2, o));
      const int r = tp->rank(), n = 2;
      auto on_gpu = [&](Tensor t) {
        Tensor g = t.to(dev);
        g.set_requires_grad(true);
        return g;
      };
      for (DType dt : {DType::F32, DType::BF16}) {
        const std::string who = std::string(" ") + dtype_name(dt) + " on rank " + std::to_string(r);
        const Shape local{3, 2, 5}, full{3, 4, 5};
        const int64_t Tl = 2, Vl = 5;
        auto sum_over = [&](int salt, int64_t b, int64_t t, int64_t k) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += val(q, b, t, k, salt);
          return s;
        };
        // gather_sequence and its backward
        Tensor x = on_gpu(make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 0); }));
        Tensor y = gather_sequence(x, tp);
        if (!y.is_cuda()) throw std::runtime_error("gather_sequence left the GPU");
        expect_values(y, dt, [&](int64_t b, int64_t t, int64_t k) { return val(static_cast<int>(t / Tl), b, t % Tl, k, 0); },
                      "gather_sequence" + who);
        autograd::backward(y, make(full, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 1); }).to(dev));
        expect_values(x.grad(), dt, [&](int64_t b, int64_t t, int64_t k) { return sum_over(1, b, r * Tl + t, k); },
                      "gather_sequence's gradient" + who);
        // reduce_scatter_sequence and its backward
        Tensor z = on_gpu(make(full, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 2); }));
        Tensor w = reduce_scatter_sequence(z, tp);
        expect_values(w, dt, [&](int64_t b, int64_t t, int64_t k) { return sum_over(2, b, r * Tl + t, k); },
                      "reduce_scatter_sequence" + who);
        autograd::backward(w, make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 3); }).to(dev));
        expect_values(z.grad(), dt,
                      [&](int64_t b, int64_t t, int64_t k) { return val(static_cast<int>(t / Tl), b, t % Tl, k, 3); },
                      "reduce_scatter_sequence's gradient" + who);
        // gather_last_dim and its backward
        Tensor v = on_gpu(make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 4); }));
        Tensor u = gather_last_dim(v, tp);
        expect_values(u, dt, [&](int64_t b, int64_t t, int64_t j) { return val(static_cast<int>(j / Vl), b, t, j % Vl, 4); },
                      "gather_last_dim" + who);
        autograd::backward(u, make({3, 2, 10}, dt, [&](int64_t b, int64_t t, int64_t j) { return val(r, b, t, j, 5); }).to(dev));
        expect_values(v.grad(), dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, r * Vl + k, 5); },
                      "gather_last_dim's gradient" + who);
        // copy_to_tp and reduce_from_tp
        Tensor p = on_gpu(make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 6); }));
        Tensor fp = copy_to_tp(p, tp);
        Tensor q = on_gpu(make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 7); }));
        Tensor gq = reduce_from_tp(q, tp);
        expect_values(gq, dt, [&](int64_t b, int64_t t, int64_t k) { return sum_over(7, b, t, k); }, "reduce_from_tp" + who);
        autograd::backward(fp, make(local, dt, [&](int64_t b, int64_t t, int64_t k) { return val(r, b, t, k, 8); }).to(dev));
        expect_values(p.grad(), dt, [&](int64_t b, int64_t t, int64_t k) { return sum_over(8, b, t, k); },
                      "copy_to_tp's gradient" + who);
      }
      if (tp->stats().calls != 2 * 7) throw std::runtime_error("expected 14 collectives, counted " +
                                                               std::to_string(tp->stats().calls));
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> l(mu);
      errors.push_back("rank " + std::to_string(rank) + ": " + e.what());
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  cuda::set_device(0);
}
