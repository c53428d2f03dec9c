// Copy-bandwidth probe for bench/comm_allreduce.sh: T threads (default 2, one per rank of
// the 2-rank all-reduce) each memcpy a private 64 MiB buffer; prints the aggregate bytes
// moved (read + written) per second in GB/s.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  size_t bytes = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (64u << 20);
  int iters = 10;
  std::vector<double> secs(threads);
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      std::vector<char> a(bytes, 1), b(bytes, 0);
      std::memcpy(b.data(), a.data(), bytes);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        std::memcpy(b.data(), a.data(), bytes);
        a[i] = b[bytes - 1 - i];
      }
      secs[t] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  for (auto& t : ts) t.join();
  double worst = 0;
  for (double s : secs) worst = std::max(worst, s);
  std::printf("%.3f\n", 2.0 * bytes * iters * threads / worst / 1e9);
  return 0;
}
