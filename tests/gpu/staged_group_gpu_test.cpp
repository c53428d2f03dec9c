// The host backends on GPU buffers (src/comm/device_staging.h) on a real GPU: two ranks in two
// threads share cuda:0 over shm, which NCCL would refuse. Every input is written by a kernel
// queued just before the call and not waited for (the staging must wait for it), and every
// result is read by later work on the compute stream. The staging's logic is also checked on
// every machine with a stand-in for GPU memory (tests/comm/device_staging_test.cpp).
#include <chrono>
#include <mutex>
#include <thread>

#include "gpu/gpu_test_util.h"
#include "paratrain/tensor/tensor.h"

using namespace paratrain;

namespace {

// "" when every element of `t` is `want`, else the first that is not.
std::string all_equal(const Tensor& t, float want, const std::string& what) {
  const std::vector<float> v = t.to_vector();
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] != want)
      return what + ": element " + std::to_string(i) + " is " + std::to_string(v[i]) + ", expected " + std::to_string(want);
  return "";
}

}  // namespace

TEST(StagedGroupOnGpu, TwoRanksShareOneGpuOverShm) {
  PT_REQUIRE_GPU();
  auto store = std::make_shared<comm::HashStore>();
  std::mutex mu;
  std::vector<std::string> errors;
  auto rank_main = [&](int r) {
    auto fail = [&](const std::string& e) {
      if (e.empty()) return;
      std::lock_guard<std::mutex> l(mu);
      errors.push_back("rank " + std::to_string(r) + ": " + e);
    };
    try {
      cuda::set_device(0);
      const DeviceSpec dev{Device::CUDA, 0};
      comm::ProcessGroupOptions o;
      o.backend = "shm";
      o.timeout_s = 60;
      auto pg = comm::create_process_group(store, r, 2, o);
      const float mine = r + 1.0f, other = 2.0f - r;
      for (int64_t n : {int64_t(1), int64_t(1000), int64_t(300000)}) {
        const std::string at = " (" + std::to_string(n) + " elements)";
        Tensor x = Tensor::full({n}, mine, DType::F32, dev);
        pg->allreduce(x.data_ptr(), n, DType::F32)->wait_on_device();
        fail(all_equal(x, 3.0f, "allreduce" + at));

        Tensor in = Tensor::full({2 * n}, mine, DType::F32, dev), out = Tensor::full({n}, -1.0, DType::F32, dev);
        pg->reduce_scatter(in.data_ptr(), out.data_ptr(), n, DType::F32)->wait();
        fail(all_equal(out, 3.0f, "reduce_scatter" + at));

        Tensor part = Tensor::full({n}, mine, DType::BF16, dev), whole = Tensor::full({2 * n}, -1.0, DType::BF16, dev);
        pg->allgather(part.data_ptr(), whole.data_ptr(), n, DType::BF16)->wait();
        fail(all_equal(whole.narrow(0, 0, n), 1.0f, "allgather, block 0" + at));
        fail(all_equal(whole.narrow(0, n, n), 2.0f, "allgather, block 1" + at));

        Tensor b = Tensor::full({n}, mine, DType::F32, dev);
        pg->broadcast(b.data_ptr(), n, DType::F32, 1)->wait();
        fail(all_equal(b, 2.0f, "broadcast from rank 1" + at));

        // Both ranks send first: a staged send must not wait for its receiver.
        Tensor s = Tensor::full({n}, 10 * mine, DType::F32, dev), got = Tensor::full({n}, -1.0, DType::F32, dev);
        auto sent = pg->send(s.data_ptr(), n, DType::F32, 1 - r, 5);
        auto received = pg->recv(got.data_ptr(), n, DType::F32, 1 - r, 5);
        received->wait_on_device();
        sent->wait();
        fail(all_equal(got, 10 * other, "send/recv" + at));
      }
      // A recv nobody waits for: the group's background thread copies it up (from a thread of
      // its own, on the compute stream) and the Work says it has completed.
      const int64_t n = 4096;
      Tensor got = Tensor::full({n}, -1.0, DType::F32, dev), s = Tensor::full({n}, 7 * mine, DType::F32, dev);
      auto received = pg->recv(got.data_ptr(), n, DType::F32, 1 - r, 6);
      pg->send(s.data_ptr(), n, DType::F32, 1 - r, 6)->wait();
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!received->is_completed() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!received->is_completed()) throw std::runtime_error("a recv nobody waits for did not complete in 30 s");
      fail(all_equal(got, 7 * other, "a recv nobody waits for"));
      pg->barrier()->wait();
    } catch (const std::exception& e) {
      fail(e.what());
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
}
