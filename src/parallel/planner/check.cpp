// The planner's estimate against a run's measured memory (`paratrain plan --check`, planner.h).
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include <nlohmann/json.hpp>

#include "paratrain/base/error.h"
#include "paratrain/parallel/planner.h"

namespace paratrain::parallel::planner {

namespace {
std::vector<int64_t> int_array(const nlohmann::json& j, const char* key) {
  std::vector<int64_t> out;
  if (!j.contains(key)) return out;
  if (j[key].is_array())
    for (const auto& x : j[key]) out.push_back(x.get<int64_t>());
  else if (j[key].is_number())
    out.push_back(j[key].get<int64_t>());
  return out;
}
std::string mib(int64_t b) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(1) << static_cast<double>(b) / double(1 << 20);
  return o.str();
}
}  // namespace

CheckResult check_metrics(const std::string& path, const CheckInput& in) {
  std::ifstream f(path);
  if (!f) PT_THROW(InputError, "--check ", path, ": cannot open the metrics file");
  nlohmann::json last;
  int64_t line_no = 0;
  for (std::string line; std::getline(f, line);) {
    ++line_no;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      PT_THROW(InputError, "--check ", path, ": line ", line_no, " is not JSON");
    }
    if (j.value("eval", false)) continue;
    last = j;
  }
  if (last.is_null()) PT_THROW(InputError, "--check ", path, ": no step line (is it a `paratrain train --metrics` file?)");
  if (!last.contains("mem_peak_bytes"))
    PT_THROW(InputError, "--check ", path, ": the step lines have no mem_peak_bytes");
  if (!in.micro_batch && !last.contains("micro_batch"))
    PT_THROW(InputError, "--check ", path, ": the metrics do not record the micro-batch; pass the run's --micro-batch");
  CheckResult r;
  Layout& L = r.layout;
  if (last.contains("layout")) {
    L.dp = last["layout"].value("dp", 1);
    L.tp = last["layout"].value("tp", 1);
    L.pp = last["layout"].value("pp", 1);
  }
  L.zero = last.value("zero", 0);
  L.recompute = parse_recompute(last.value("recompute", std::string("none")));
  L.micro_batch = in.micro_batch ? *in.micro_batch : last["micro_batch"].get<int64_t>();
  L.grad_accum = last.value("grad_accum", in.grad_accum);
  if (last.contains("pp_schedule")) L.schedule = pipeline::parse_schedule(last["pp_schedule"].get<std::string>());
  L.virtual_chunks = last.value("pp_virtual", 1);
  r.options.bf16 = last.value("precision", std::string("fp32")) == "bf16";
  r.options.sequence_parallel = last.value("sequence_parallel", false);
  r.options.bucket_mb = last.value("bucket_mb", in.bucket_mb);
  // The run's model as its metrics record it (`paratrain train` writes "model"); the flags'
  // otherwise (older files).
  nn::GPTConfig cfg = in.model;
  if (last.contains("model") && last["model"].is_object()) {
    const nlohmann::json& m = last["model"];
    cfg.n_layer = m.value("n_layer", cfg.n_layer);
    cfg.n_head = m.value("n_head", cfg.n_head);
    cfg.n_embd = m.value("n_embd", cfg.n_embd);
    cfg.block_size = m.value("block_size", cfg.block_size);
    cfg.vocab_size = m.value("vocab_size", cfg.vocab_size);
    cfg.dropout = m.value("dropout", cfg.dropout);
  }
  const std::vector<int64_t> peaks = int_array(last, "mem_peak_bytes");
  const int world = L.dp * L.tp * L.pp;
  if (static_cast<int>(peaks.size()) != world)
    PT_THROW(InputError, "--check ", path, ": mem_peak_bytes has ", peaks.size(), " ranks for a layout of ", world);
  r.measured_params = int_array(last, "mem_param_bytes");
  r.measured_grads = int_array(last, "mem_grad_bytes");
  r.measured_optimizer = int_array(last, "mem_optimizer_bytes");
  if (last.contains("mem_activation_bytes")) r.measured_activations = last["mem_activation_bytes"].get<int64_t>();
  for (int rank = 0; rank < world; ++rank) {
    RankCheck c;
    c.rank = rank;
    c.split = estimate_rank_memory(cfg, L, r.options, rank);
    c.estimate = c.split.total();
    c.measured = peaks[static_cast<size_t>(rank)];
    c.rel_error = c.measured > 0 ? static_cast<double>(c.estimate - c.measured) / static_cast<double>(c.measured) : 0;
    r.ranks.push_back(c);
  }
  return r;
}

std::string format_check(const CheckResult& r) {
  std::ostringstream o;
  o << "layout: " << r.layout.str() << (r.options.bf16 ? ", bf16" : ", fp32") << "\n";
  o << "per rank, MiB: estimate (weights + grads + optim + activ + buffers) against the measured peak "
       "(mem_peak_bytes)\n";
  for (const auto& c : r.ranks) {
    const auto& s = c.split;
    o << "rank " << c.rank << ": estimate " << mib(c.estimate) << " (" << mib(s.weights) << " + " << mib(s.gradients)
      << " + " << mib(s.optimizer) << " + " << mib(s.activations) << " + " << mib(s.buffers) << "), measured "
      << mib(c.measured) << ", error " << std::showpos << std::fixed << std::setprecision(1) << 100.0 * c.rel_error
      << std::noshowpos << "%";
    const size_t i = static_cast<size_t>(c.rank);
    if (i < r.measured_params.size())
      o << "; measured weights " << mib(r.measured_params[i]) << ", grads "
        << (i < r.measured_grads.size() ? mib(r.measured_grads[i]) : "?") << ", optim "
        << (i < r.measured_optimizer.size() ? mib(r.measured_optimizer[i]) : "?");
    if (c.rank == 0 && r.measured_activations >= 0) o << ", activ " << mib(r.measured_activations);
    o << "\n";
  }
  double worst = 0;
  for (const auto& c : r.ranks) worst = std::max(worst, std::fabs(c.rel_error));
  o << "worst relative error: " << std::fixed << std::setprecision(1) << 100.0 * worst << "%\n";
  return o.str();
}

}  // namespace paratrain::parallel::planner
