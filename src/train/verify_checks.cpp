#include "verify_checks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "paratrain/base/error.h"

namespace paratrain::train {

ParamLayout::ParamLayout(const optim::NamedParams& params) {
  int64_t off = 0;
  for (const auto& [name, p] : params) {
    names.push_back(name);
    offset.push_back(off);
    numel.push_back(p.numel());
    off += p.numel();
  }
}

int ParamLayout::index(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

std::vector<double> exact_mean(const std::vector<float>& local, comm::ProcessGroup* pg) {
  const int w = pg ? pg->size() : 1;
  std::vector<float> all(local);
  if (pg) {
    all.resize(local.size() * static_cast<size_t>(w));
    pg->allgather(local.data(), all.data(), local.size(), DType::F32)->wait();
  }
  std::vector<double> mean(local.size(), 0.0);
  for (int r = 0; r < w; ++r)
    for (size_t i = 0; i < local.size(); ++i) mean[i] += all[static_cast<size_t>(r) * local.size() + i];
  for (double& m : mean) m /= w;
  return mean;
}

namespace {

double relative(double abs, double scale) { return scale > 0 ? abs / scale : abs; }

// `t`'s elements in host memory (a GPU tensor is copied back; a CPU one is itself if contiguous).
Tensor on_host(const Tensor& t) { return t.to(DeviceSpec{Device::CPU, -1}).contiguous(); }

// max |t[i] - ref[begin + i]| over a tensor's elements.
double max_diff(const Tensor& t, const double* ref) {
  if (!t.defined()) return 0;
  Tensor c = on_host(t);
  const float* d = c.data<float>();
  double m = 0;
  for (int64_t i = 0; i < c.numel(); ++i) {
    const double x = std::fabs(static_cast<double>(d[i]) - ref[i]);
    m = std::isnan(x) ? INFINITY : std::max(m, x);
  }
  return m;
}

}  // namespace

std::vector<TensorDiff> applied_vs_mean(ParallelModel& model, const ParamLayout& layout, const std::vector<double>& mean,
                                      comm::ProcessGroup* pg) {
  const size_t n = layout.names.size();
  std::vector<float> abs(n, 0.0f);
  if (model.zero()) {
    // ZeRO 1/2: this rank's pieces of the reduced gradient shard.
    for (const auto& piece : model.ddp()->shard_pieces()) {
      const int t = layout.index(piece.name);
      PT_CHECK(t >= 0, "ZeRO piece of unknown parameter ", piece.name);
      const double d = max_diff(piece.grad, mean.data() + layout.offset[t] + piece.begin);
      abs[t] = std::max(abs[t], static_cast<float>(d));
    }
  } else {
    const auto& params = model.params();
    for (size_t t = 0; t < n; ++t) {
      const Tensor g = params[t].second.grad();
      if (g.defined()) {
        abs[t] = static_cast<float>(max_diff(g, mean.data() + layout.offset[t]));
      } else {  // no gradient: applies zero
        double m = 0;
        for (int64_t i = 0; i < layout.numel[t]; ++i) m = std::max(m, std::fabs(mean[layout.offset[t] + i]));
        abs[t] = static_cast<float>(m);
      }
    }
  }
  if (pg) pg->allreduce(abs.data(), n, DType::F32, comm::ReduceOp::kMax)->wait();
  std::vector<TensorDiff> out(n);
  for (size_t t = 0; t < n; ++t) {
    double scale = 0;
    for (int64_t i = 0; i < layout.numel[t]; ++i) scale = std::max(scale, std::fabs(mean[layout.offset[t] + i]));
    out[t].abs = abs[t];
    out[t].rel = relative(abs[t], scale);
  }
  return out;
}

uint64_t fnv1a(const Tensor& t) {
  Tensor c = on_host(t);
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < c.nbytes(); ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

ReplicaMismatch compare_replica_hashes(const optim::NamedParams& params, comm::ProcessGroup* pg) {
  ReplicaMismatch m;
  if (!pg || pg->size() == 1) return m;
  const size_t n = params.size();
  std::vector<int64_t> mine(n), all(n * static_cast<size_t>(pg->size()));
  for (size_t t = 0; t < n; ++t) {
    const uint64_t h = fnv1a(params[t].second);
    std::memcpy(&mine[t], &h, sizeof h);
  }
  pg->allgather(mine.data(), all.data(), n, DType::I64)->wait();
  for (size_t t = 0; t < n && m.tensor < 0; ++t)
    for (int r = 1; r < pg->size(); ++r)
      if (all[static_cast<size_t>(r) * n + t] != all[t]) {
        m.tensor = static_cast<int>(t), m.other_rank = r;
        break;
      }
  return m;
}

std::vector<TensorDiff> flat_vs_reference(const std::vector<double>& a, const std::vector<float>& ref,
                                         const ParamLayout& layout) {
  PT_CHECK(a.size() == ref.size(), "flat_vs_reference: ", a.size(), " vs ", ref.size(), " elements");
  std::vector<TensorDiff> out(layout.names.size());
  for (size_t t = 0; t < out.size(); ++t) {
    double abs = 0, scale = 0;
    for (int64_t i = layout.offset[t]; i < layout.offset[t] + layout.numel[t]; ++i) {
      const double d = std::fabs(a[i] - static_cast<double>(ref[i]));
      abs = std::isnan(d) ? INFINITY : std::max(abs, d);
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    }
    out[t] = {abs, relative(abs, scale)};
  }
  return out;
}

std::vector<TensorDiff> params_vs_reference(const optim::NamedParams& a, const optim::NamedParams& b) {
  std::vector<TensorDiff> out(a.size());
  for (size_t t = 0; t < a.size(); ++t) {
    const Tensor* ref = nullptr;
    for (const auto& [name, p] : b)
      if (name == a[t].first) ref = &p;
    PT_CHECK(ref != nullptr && ref->numel() == a[t].second.numel(), "reference lacks parameter ", a[t].first);
    Tensor x = on_host(a[t].second), y = on_host(*ref);
    const float *px = x.data<float>(), *py = y.data<float>();
    double abs = 0, scale = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double d = std::fabs(static_cast<double>(px[i]) - py[i]);
      abs = std::isnan(d) ? INFINITY : std::max(abs, d);
      scale = std::max(scale, std::fabs(static_cast<double>(py[i])));
    }
    out[t] = {abs, relative(abs, scale)};
  }
  return out;
}

}  // namespace paratrain::train
