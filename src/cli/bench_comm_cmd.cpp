// `paratrain bench comm`: one line per size with time, algbw, busbw (nccl-tests'
// definitions, doc/PERFORMANCE.md) and the number of wrong elements. Each size first runs
// once on known inputs and checks the result, then warmup + timed iterations; the time is
// the slowest rank's average. With --device cuda the buffers are on the rank's GPU
// (cuda:LOCAL_RANK) and the backend is nccl: the inputs go up and the results come back
// only around the check, and each timed call waits until its completion event passed.
#include "cli/bench_comm_cmd.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <vector>

#include "paratrain/base/error.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/tensor/device.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::cli {
namespace {

using comm::ProcessGroup;

size_t parse_size(const std::string& s) {
  if (s.empty()) PT_THROW(InputError, "empty size");
  size_t pos = 0;
  double v = std::stod(s, &pos);
  std::string unit = s.substr(pos);
  double mult = 1;
  if (unit == "K" || unit == "k" || unit == "KiB") mult = 1024;
  else if (unit == "M" || unit == "m" || unit == "MiB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "g" || unit == "GiB") mult = 1024.0 * 1024 * 1024;
  else if (!unit.empty() && unit != "B") PT_THROW(InputError, "bad size '", s, "' (use e.g. 4K, 256M, 1G)");
  return static_cast<size_t>(v * mult);
}

double value(int rank, size_t i) { return static_cast<double>(static_cast<int>((rank * 7 + i * 3) % 11) - 5); }

void fill(std::vector<char>& buf, DType dt, size_t n, int rank, size_t base = 0) {
  for (size_t i = 0; i < n; ++i) {
    double v = value(rank, base + i);
    char* p = buf.data() + i * dtype_size(dt);
    switch (dt) {
      case DType::F32: { float f = float(v); std::memcpy(p, &f, 4); break; }
      case DType::BF16: { uint16_t h = f32_to_bf16(float(v)); std::memcpy(p, &h, 2); break; }
      case DType::F16: { uint16_t h = f32_to_f16(float(v)); std::memcpy(p, &h, 2); break; }
      case DType::I32: { int32_t x = int32_t(v); std::memcpy(p, &x, 4); break; }
      case DType::I64: { int64_t x = int64_t(v); std::memcpy(p, &x, 8); break; }
      default: break;
    }
  }
}

double get(const char* p, DType dt) {
  switch (dt) {
    case DType::F32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    case DType::I32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::I64: { int64_t x; std::memcpy(&x, p, 8); return double(x); }
    default: return 0;
  }
}

struct Row {
  size_t bytes, count;
  double time_us, algbw, busbw;
  int64_t wrong;
};

}  // namespace

int run_bench_comm(int argc, char** argv) {
  CLI::App app{"paratrain bench comm: collective bandwidth and latency (nccl-tests style)"};
  std::string op = "allreduce", min_s = "4K", max_s = "256M", dtype_s = "f32", backend = "", json, device_s = "cpu";
  int iters = 20, warmup = 5;
  bool deterministic = false;
  app.add_option("--op", op, "allreduce|reduce_scatter|allgather|broadcast|all_to_all")
      ->check(CLI::IsMember({"allreduce", "reduce_scatter", "allgather", "broadcast", "all_to_all"}));
  app.add_option("--min-bytes", min_s, "smallest size (4K, 1M, ...)");
  app.add_option("--max-bytes", max_s, "largest size");
  app.add_option("--dtype", dtype_s, "f32|bf16|f16|i32|i64");
  app.add_option("--backend", backend, "auto|shm|tcp|mpi|nccl (default PARATRAIN_BACKEND or auto; nccl on cuda)");
  app.add_option("--device", device_s, "cpu|cuda: where the buffers are (cuda: the GPU of LOCAL_RANK)");
  app.add_option("--iters", iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed iterations per size")->check(CLI::NonNegativeNumber);
  app.add_flag("--deterministic", deterministic, "rank-ordered (bit-reproducible) reductions");
  app.add_option("--json", json, "also write one JSON object per size to FILE (rank 0)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    DType dt = parse_dtype(dtype_s);
    size_t lo = parse_size(min_s), hi = parse_size(max_s);
    if (lo == 0 || hi < lo) PT_THROW(InputError, "--min-bytes must be > 0 and <= --max-bytes");
    DeviceSpec device = parse_device(device_s);
    if (device.kind == Device::CUDA) {
      if (cuda::device_count() == 0) PT_THROW(InputError, "--device ", device_s, ": no CUDA GPU: ", cuda::unavailable_reason());
      if (device.index < 0) device.index = comm::read_job_env().local_rank;
      if (device.index >= cuda::device_count())
        PT_THROW(InputError, "--device ", device_s, ": cuda:", device.index, " does not exist (", cuda::device_count(),
                 " GPUs)");
      cuda::set_device(device.index);
      if (backend.empty() || backend == "auto") backend = "nccl";  // shm/tcp/mpi stage the GPU buffers
    }
    comm::ProcessGroupOptions opts;
    opts.backend = backend;
    opts.deterministic = deterministic;
    auto pg = comm::create_process_group_from_env(opts);
    const int n = pg->size(), r = pg->rank();
    const size_t es = dtype_size(dt);
    double factor = op == "allreduce" ? 2.0 * (n - 1) / n : (op == "broadcast") ? 1.0 : double(n - 1) / n;
    std::ofstream js;
    if (r == 0 && !json.empty()) {
      js.open(json);
      if (!js) PT_THROW(IoError, "cannot write ", json);
    }
    if (r == 0) {
      std::printf("# paratrain bench comm: op %s, dtype %s, %d ranks, backend %s%s, buffers on %s\n", op.c_str(),
                  dtype_name(dt), n, pg->backend_name().c_str(), deterministic ? ", deterministic" : "",
                  device.str().c_str());
      std::printf("#%12s %12s %6s %12s %10s %10s %8s\n", "size(B)", "count", "type", "time(us)", "algbw(GB/s)",
                  "busbw(GB/s)", "#wrong");
    }
    int64_t total_wrong = 0;
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
      // count: elements of the per-rank buffer (allreduce, broadcast) or of one rank's block.
      bool blocked = op == "reduce_scatter" || op == "allgather" || op == "all_to_all";
      size_t count = blocked ? bytes / es / n : bytes / es;
      if (count == 0) continue;
      size_t total = blocked ? count * n : count;
      std::vector<char> a(total * es + 64), b(total * es + 64);
      // The buffers the collective works on: `a` and `b` themselves, or their copies on the GPU.
      const bool on_gpu = device.kind == Device::CUDA;
      const auto bytes_shape = Shape{static_cast<int64_t>(a.size())};
      Tensor da, db;
      if (on_gpu) da = Tensor::zeros(bytes_shape, DType::U8, device), db = Tensor::zeros(bytes_shape, DType::U8, device);
      char* pa = on_gpu ? static_cast<char*>(da.data_ptr()) : a.data();
      char* pb = on_gpu ? static_cast<char*>(db.data_ptr()) : b.data();
      auto host_view = [&](std::vector<char>& v) { return Tensor::from_blob(v.data(), bytes_shape, DType::U8); };
      auto run_once = [&]() {
        if (op == "allreduce") pg->allreduce(pa, count, dt)->wait();
        else if (op == "reduce_scatter") pg->reduce_scatter(pa, pb, count, dt)->wait();
        else if (op == "allgather") pg->allgather(pa, pb, count, dt)->wait();
        else if (op == "broadcast") pg->broadcast(pa, count, dt, 0)->wait();
        else pg->all_to_all(pa, pb, count, dt)->wait();
      };
      // Check.
      fill(a, dt, blocked && op != "allgather" ? total : count, r);
      if (on_gpu) da.copy_(host_view(a));
      run_once();
      if (on_gpu) host_view(a).copy_(da), host_view(b).copy_(db);
      int64_t wrong = 0;
      auto sum_at = [&](size_t i) {
        double s = 0;
        for (int q = 0; q < n; ++q) s += value(q, i);
        return s;
      };
      if (op == "allreduce") {
        for (size_t i = 0; i < count; ++i) wrong += get(a.data() + i * es, dt) != sum_at(i);
      } else if (op == "reduce_scatter") {
        for (size_t i = 0; i < count; ++i) wrong += get(b.data() + i * es, dt) != sum_at(size_t(r) * count + i);
      } else if (op == "allgather") {
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i) wrong += get(b.data() + (q * count + i) * es, dt) != value(q, i);
      } else if (op == "broadcast") {
        for (size_t i = 0; i < count; ++i) wrong += get(a.data() + i * es, dt) != value(0, i);
      } else {
        for (int q = 0; q < n; ++q)
          for (size_t i = 0; i < count; ++i)
            wrong += get(b.data() + (q * count + i) * es, dt) != value(q, size_t(r) * count + i);
      }
      pg->allreduce(&wrong, 1, DType::I64)->wait();
      total_wrong += wrong;
      // Time. (Inputs are refilled so allreduce sums stay finite.)
      if (op == "allreduce") on_gpu ? da.zero_() : (void)std::memset(a.data(), 0, a.size());
      for (int i = 0; i < warmup; ++i) run_once();
      pg->barrier()->wait();
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) run_once();
      int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
      pg->allreduce(&ns, 1, DType::I64, comm::ReduceOp::kMax)->wait();
      Row row{bytes, count, ns / 1e3 / iters, 0, 0, wrong};
      row.algbw = double(bytes) / (row.time_us * 1e-6) / 1e9;
      row.busbw = row.algbw * factor;
      if (r == 0) {
        std::printf(" %12zu %12zu %6s %12.2f %10.3f %10.3f %8lld\n", row.bytes, row.count, dtype_name(dt), row.time_us,
                    row.algbw, row.busbw, static_cast<long long>(row.wrong));
        std::fflush(stdout);
        if (js)
          js << "{\"op\":\"" << op << "\",\"dtype\":\"" << dtype_name(dt) << "\",\"bytes\":" << row.bytes
             << ",\"count\":" << row.count << ",\"ranks\":" << n << ",\"backend\":\"" << pg->backend_name()
             << "\",\"time_us\":" << row.time_us << ",\"algbw_gbps\":" << row.algbw
             << ",\"busbw_gbps\":" << row.busbw << ",\"wrong\":" << row.wrong << "}\n";
      }
      if (bytes > hi / 2) break;
    }
    pg->barrier()->wait();
    if (r == 0 && total_wrong) std::fprintf(stderr, "bench comm: %lld wrong elements\n", static_cast<long long>(total_wrong));
    return total_wrong ? 1 : 0;
  } catch (const InputError& e) {
    std::fprintf(stderr, "paratrain bench comm: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "paratrain bench comm: %s\n", e.what());
    return 1;
  }
}

}  // namespace paratrain::cli
