// Shared by the comm tests and their rank programs: runs every collective on a group with
// inputs every rank can predict, and counts wrong elements. Inputs are small integers, so
// sums are exact in every dtype and any algorithm must reproduce them bit for bit.
#pragma once

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/comm/store.h"

namespace paratrain::comm::testing {

inline double value(int rank, size_t i, int salt = 0) {
  return static_cast<double>(static_cast<int>((rank * 7 + i * 3 + salt * 5) % 11) - 5);
}

inline void put(std::vector<char>& buf, DType dt, size_t i, double v) {
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

inline double get(const std::vector<char>& buf, DType dt, size_t i) {
  const char* p = buf.data() + i * dtype_size(dt);
  switch (dt) {
    case DType::F32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); }
    case DType::I32: { int32_t x; std::memcpy(&x, p, 4); return x; }
    case DType::I64: { int64_t x; std::memcpy(&x, p, 8); return double(x); }
    default: return 0;
  }
}

inline double combine_all(ReduceOp op, int n, size_t i, DType dt, int salt = 0) {
  double acc = value(0, i, salt);
  for (int r = 1; r < n; ++r) {
    double v = value(r, i, salt);
    if (op == ReduceOp::kMax) acc = std::max(acc, v);
    else if (op == ReduceOp::kMin) acc = std::min(acc, v);
    else acc += v;
  }
  if (op == ReduceOp::kAvg) {
    if (dt == DType::I32 || dt == DType::I64) acc = std::trunc(acc / n);
    else if (dt == DType::F32) acc = double(float(acc) / float(n));
    else if (dt == DType::BF16) acc = bf16_to_f32(f32_to_bf16(float(acc) / float(n)));
    else acc = f16_to_f32(f32_to_f16(float(acc) / float(n)));
  }
  return acc;
}

struct Report {
  size_t wrong = 0;
  std::string first;
  void mismatch(const std::string& what, size_t i, double got, double want) {
    if (wrong++ == 0) {
      std::ostringstream os;
      os << what << ": element " << i << " is " << got << ", expected " << want;
      first = os.str();
    }
  }
};

// Runs allreduce (4 ops), reduce_scatter, allgather, broadcast, reduce, all_to_all,
// send/recv ring, barrier; returns the wrong elements in `rep`.
inline void run_all_ops(ProcessGroup& pg, DType dt, size_t count, Report& rep) {
  const int n = pg.size(), r = pg.rank();
  const size_t es = dtype_size(dt);
  std::string tag = std::string(dtype_name(dt)) + " count " + std::to_string(count) + " ";
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<char> buf(count * es + 1);
    for (size_t i = 0; i < count; ++i) put(buf, dt, i, value(r, i));
    pg.allreduce(buf.data(), count, dt, op)->wait();
    for (size_t i = 0; i < count; ++i) {
      double want = combine_all(op, n, i, dt);
      if (get(buf, dt, i) != want) rep.mismatch(tag + "allreduce " + reduce_op_name(op), i, get(buf, dt, i), want);
    }
  }
  {  // reduce_scatter: block b of rank r's input uses index b*count + i
    std::vector<char> in(n * count * es + 1), out(count * es + 1);
    for (size_t i = 0; i < n * count; ++i) put(in, dt, i, value(r, i));
    pg.reduce_scatter(in.data(), out.data(), count, dt, ReduceOp::kSum)->wait();
    for (size_t i = 0; i < count; ++i) {
      double want = combine_all(ReduceOp::kSum, n, size_t(r) * count + i, dt);
      if (get(out, dt, i) != want) rep.mismatch(tag + "reduce_scatter", i, get(out, dt, i), want);
    }
  }
  {
    std::vector<char> in(count * es + 1), out(n * count * es + 1);
    for (size_t i = 0; i < count; ++i) put(in, dt, i, value(r, i, 1));
    pg.allgather(in.data(), out.data(), count, dt)->wait();
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < count; ++i)
        if (get(out, dt, b * count + i) != value(b, i, 1))
          rep.mismatch(tag + "allgather", b * count + i, get(out, dt, b * count + i), value(b, i, 1));
  }
  for (int root = 0; root < n; root += (n > 2 ? n - 1 : 1)) {
    std::vector<char> buf(count * es + 1);
    for (size_t i = 0; i < count; ++i) put(buf, dt, i, value(r, i, 2));
    pg.broadcast(buf.data(), count, dt, root)->wait();
    for (size_t i = 0; i < count; ++i)
      if (get(buf, dt, i) != value(root, i, 2)) rep.mismatch(tag + "broadcast", i, get(buf, dt, i), value(root, i, 2));
    for (size_t i = 0; i < count; ++i) put(buf, dt, i, value(r, i));
    pg.reduce(buf.data(), count, dt, ReduceOp::kSum, root)->wait();
    for (size_t i = 0; i < count; ++i) {
      double want = r == root ? combine_all(ReduceOp::kSum, n, i, dt) : value(r, i);
      if (get(buf, dt, i) != want) rep.mismatch(tag + "reduce root " + std::to_string(root), i, get(buf, dt, i), want);
    }
  }
  {  // all_to_all: block p of rank r's input = value(r, p*count+i, 3)
    std::vector<char> in(n * count * es + 1), out(n * count * es + 1);
    for (size_t i = 0; i < n * count; ++i) put(in, dt, i, value(r, i, 3));
    pg.all_to_all(in.data(), out.data(), count, dt)->wait();
    for (int p = 0; p < n; ++p)
      for (size_t i = 0; i < count; ++i) {
        double want = value(p, size_t(r) * count + i, 3);
        if (get(out, dt, p * count + i) != want) rep.mismatch(tag + "all_to_all", p * count + i, get(out, dt, p * count + i), want);
      }
  }
  if (n > 1) {  // send to r+1, receive from r-1 (even ranks send first, odd ones receive first)
    std::vector<char> out(count * es + 1), in(count * es + 1);
    for (size_t i = 0; i < count; ++i) put(out, dt, i, value(r, i, 4));
    int next = (r + 1) % n, prev = (r + n - 1) % n;
    // Each Work waited for before the next call: blocking use of the non-blocking calls.
    if (r % 2 == 0) {
      pg.send(out.data(), count, dt, next, 7)->wait();
      pg.recv(in.data(), count, dt, prev, 7)->wait();
    } else {
      pg.recv(in.data(), count, dt, prev, 7)->wait();
      pg.send(out.data(), count, dt, next, 7)->wait();
    }
    for (size_t i = 0; i < count; ++i)
      if (get(in, dt, i) != value(prev, i, 4)) rep.mismatch(tag + "send/recv", i, get(in, dt, i), value(prev, i, 4));
  }
  pg.barrier()->wait();
}

// Ranks as threads of this process: fn(rank, pg) runs on n threads, each with its own group
// over one in-process HashStore. The group is destroyed when fn returns, or earlier where fn
// resets `pg` (a rank leaving before its peers). Returns each rank's error ("" = none).
template <typename Fn>
std::vector<std::string> run_thread_ranks(int n, const ProcessGroupOptions& opts, Fn fn) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::milliseconds(20000));
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<ProcessGroup> pg = create_process_group(store, r, n, opts);
        fn(r, pg);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// Random floats (fixed seed per rank) for the rank-ordered test.
inline std::vector<float> random_floats(int rank, size_t count) {
  std::mt19937 gen(1234 + rank);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> v(count);
  for (auto& x : v) x = d(gen) * std::exp2(float(int(gen() % 20) - 10));
  return v;
}

// The in-order sum x0 + x1 + ... in f32, as one process computes it.
inline std::vector<float> in_order_sum(int n, size_t count) {
  std::vector<float> acc = random_floats(0, count);
  for (int r = 1; r < n; ++r) {
    auto x = random_floats(r, count);
    for (size_t i = 0; i < count; ++i) acc[i] = acc[i] + x[i];
  }
  return acc;
}

}  // namespace paratrain::comm::testing
