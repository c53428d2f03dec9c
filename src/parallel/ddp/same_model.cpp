// The same-model check of the data-parallel wrappers (same_model.h).
#include "parallel/same_model.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "paratrain/base/error.h"
#include "paratrain/parallel/ddp.h"
#include "parallel/host_collective.h"

namespace paratrain::parallel {

namespace {
uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

std::string describe(const std::string& name, const Tensor& t) {
  return name + " " + dtype_name(t.dtype()) + " " + shape_str(t.shape());
}
}  // namespace

uint64_t parameter_fingerprint(const std::string& name, const Tensor& t) {
  return fnv1a(name + "|" + dtype_name(t.dtype()) + "|" + shape_str(t.shape()));
}

namespace detail {

void check_same_model(comm::ProcessGroup& pg, const std::vector<std::pair<std::string, Tensor>>& params,
                      const std::string& who) {
  const int n = static_cast<int>(params.size());
  const int W = pg.size();
  // The group's buffers live where the parameters do (a GPU for nccl; host_collective.h).
  const DeviceSpec staging = n > 0 ? params[0].second.device_spec() : DeviceSpec{};
  std::vector<int64_t> hashes(n);
  uint64_t all = 1469598103934665603ull;
  for (int i = 0; i < n; ++i) {
    const uint64_t h = parameter_fingerprint(params[i].first, params[i].second);
    hashes[i] = static_cast<int64_t>(h);
    all = (all ^ h) * 1099511628211ull;
  }
  int64_t mine[2] = {n, static_cast<int64_t>(all)};
  std::vector<int64_t> summary(2 * W);
  allgather_host(pg, mine, summary.data(), 2, DType::I64, staging);
  bool same = true;
  int64_t m = n;
  for (int r = 0; r < W; ++r) {
    same = same && summary[2 * r] == summary[0] && summary[2 * r + 1] == summary[1];
    m = std::min(m, summary[2 * r]);
  }
  if (!same) {
    std::vector<int64_t> per(static_cast<size_t>(m) * W);
    allgather_host(pg, hashes.data(), per.data(), static_cast<size_t>(m), DType::I64, staging);
    int64_t idx = m;
    for (int64_t i = 0; i < m && idx == m; ++i)
      for (int r = 1; r < W; ++r)
        if (per[r * m + i] != per[i]) {
          idx = i;
          break;
        }
    // Each rank's description of parameter #idx, 256 bytes (as 64 i32), gathered.
    char desc[256] = {};
    std::string d = idx < n ? describe(params[idx].first, params[idx].second)
                            : "nothing (it has only " + std::to_string(n) + " parameters)";
    std::strncpy(desc, d.c_str(), sizeof(desc) - 1);
    std::vector<char> descs(256 * W);
    allgather_host(pg, desc, descs.data(), 64, DType::I32, staging);
    std::ostringstream msg;
    msg << who << ": the ranks hold different models; first difference at parameter #" << idx
        << ":";
    int first_other = -1;
    for (int r = 1; r < W && first_other < 0; ++r)
      if (std::strncmp(descs.data() + 256 * r, descs.data(), 256) != 0) first_other = r;
    if (first_other < 0) first_other = 1;
    msg << " rank 0 has " << std::string(descs.data(), strnlen(descs.data(), 255)) << ", rank " << first_other
        << " has " << std::string(descs.data() + 256 * first_other, strnlen(descs.data() + 256 * first_other, 255))
        << " (every rank must build the same model: names, shapes and dtypes)";
    PT_THROW(InputError, msg.str());
  }
}

}  // namespace detail
}  // namespace paratrain::parallel
