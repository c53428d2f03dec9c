// kernel_checks(): the BLAS (oneDNN), a GEMM checked and timed through the kernels' dispatch
// point, and which CPU kernel implementations were chosen at run time from the CPU flags.
#include <oneapi/dnnl/dnnl.h>

#include <chrono>
#include <cmath>
#include <vector>

#include "monitor/doctor/check_util.h"
#include "paratrain/kernels/registry.h"

namespace paratrain::monitor::doctor {
namespace {

using detail::make;

const char* isa_name(dnnl_cpu_isa_t isa) {
  switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    case dnnl_cpu_isa_all: return "all";
    default: return "other";
  }
}

const char* runtime_name(unsigned rt) {
  switch (rt) {
    case DNNL_RUNTIME_SEQ: return "sequential";
    case DNNL_RUNTIME_OMP: return "OpenMP";
    case DNNL_RUNTIME_TBB: return "TBB";
    case DNNL_RUNTIME_THREADPOOL: return "threadpool";
    default: return "unknown";
  }
}

void blas(std::vector<Check>& out) {
  const dnnl_version_t* v = dnnl_version();
  const char* isa = isa_name(dnnl_get_effective_cpu_isa());
  std::string ver = std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch);
  const bool narrow = std::string(isa) == "sse41" || std::string(isa) == "avx";
  out.push_back(make("blas.library", narrow ? Status::kWarn : Status::kPass,
                     "oneDNN " + ver + " (" + runtime_name(v->cpu_runtime) + "), effective ISA " + isa,
                     narrow ? "oneDNN runs narrow code on this CPU (or ONEDNN_MAX_CPU_ISA limits it): unset ONEDNN_MAX_CPU_ISA / use an AVX2 CPU" : "",
                     {{"library", "oneDNN"}, {"version", ver}, {"runtime", runtime_name(v->cpu_runtime)}, {"isa", isa}}));

  // A GEMM through the dispatch point, checked against a double-precision reference.
  const auto gemm = kernels::registry().gemm.at(Device::CPU, DType::F32);
  constexpr int kM = 96, kN = 80, kK = 72;
  std::vector<float> A(kM * kK), B(kK * kN), C(kM * kN, 0.f);
  for (int i = 0; i < kM * kK; ++i) A[i] = float((i * 7 % 13) - 6) / 8;
  for (int i = 0; i < kK * kN; ++i) B[i] = float((i * 5 % 11) - 5) / 4;
  gemm(false, false, kM, kN, kK, 1.f, A.data(), kK, B.data(), kN, 0.f, C.data(), kN);
  double max_err = 0;
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double ref = 0;
      for (int k = 0; k < kK; ++k) ref += double(A[i * kK + k]) * B[k * kN + j];
      max_err = std::max(max_err, std::abs(ref - C[i * kN + j]) / std::max(1.0, std::abs(ref)));
    }
  // Timed: 256^3 repeated for about 50 ms on the kernels' threads.
  constexpr int kS = 256;
  std::vector<float> X(kS * kS, 0.5f), Y(kS * kS, 0.25f), Z(kS * kS);
  gemm(false, false, kS, kS, kS, 1.f, X.data(), kS, Y.data(), kS, 0.f, Z.data(), kS);
  int reps = 0;
  auto t0 = std::chrono::steady_clock::now();
  double secs = 0;
  while (secs < 0.05 && reps < 1000) {
    gemm(false, false, kS, kS, kS, 1.f, X.data(), kS, Y.data(), kS, 0.f, Z.data(), kS);
    ++reps;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double gflops = 2.0 * kS * kS * kS * reps / secs / 1e9;
  char buf[160];
  std::snprintf(buf, sizeof(buf), "f32 GEMM %dx%dx%d max rel. error %.1e; 256^3 at %.1f GFLOP/s on %d thread(s)", kM, kN, kK,
                max_err, gflops, kernels::cpu::num_threads());
  nlohmann::json d = {{"max_rel_error", max_err}, {"gflops_256", gflops}, {"threads", kernels::cpu::num_threads()}};
  if (max_err > 1e-4)
    out.push_back(make("blas.gemm", Status::kFail, buf,
                       "the GEMM computes wrong results: check ONEDNN_* variables and the oneDNN package (libdnnl)", d));
  else
    out.push_back(make("blas.gemm", Status::kPass, buf, "", d));
}

void dispatch(std::vector<Check>& out) {
  // The implementations chosen at run time from the CPU flags (kernels/cpu/half.h, peak.h).
  const kernels::cpu::FmaPeak fma = kernels::cpu::fma_peak(1, 1, 1000);
  const std::string bf16 = kernels::cpu::gemm_path(DType::BF16), f16 = kernels::cpu::gemm_path(DType::F16),
                    conv = kernels::cpu::half_convert_path();
  const bool native = kernels::cpu::cpu_has_native_bf16();
  nlohmann::json d = {{"fma_isa", fma.isa}, {"fma_lanes", fma.lanes}, {"gemm_bf16", bf16}, {"gemm_f16", f16},
                      {"half_convert", conv}, {"native_bf16", native}};
  std::string v = "vector FMA " + fma.isa + " (" + std::to_string(fma.lanes) + " f32 lanes); half conversions " + conv +
                  "; GEMM bf16 " + bf16 + ", f16 " + f16 + "; native bf16 " + (native ? "yes" : "no");
  if (conv == "scalar")
    out.push_back(make("kernels.dispatch", Status::kWarn, v,
                       "bf16/f16 conversions run scalar (no AVX2+F16C): --precision bf16|fp16 will be slow on this CPU", d));
  else
    out.push_back(make("kernels.dispatch", Status::kPass, v, "", d));

  // Which dtypes the CPU kernels cover, over a sample of the tables.
  const auto& r = kernels::registry();
  struct Op {
    const char* name;
    bool (*has)(const kernels::Registry&, DType);
  };
  const Op ops[] = {
      {"gemm", [](const kernels::Registry& g, DType t) { return g.gemm.has(Device::CPU, t); }},
      {"attention", [](const kernels::Registry& g, DType t) { return g.attention_forward.has(Device::CPU, t); }},
      {"layernorm", [](const kernels::Registry& g, DType t) { return g.layernorm_forward.has(Device::CPU, t); }},
      {"gelu", [](const kernels::Registry& g, DType t) { return g.gelu_forward.has(Device::CPU, t); }},
      {"crossentropy", [](const kernels::Registry& g, DType t) { return g.crossentropy_forward.has(Device::CPU, t); }},
      {"adamw", [](const kernels::Registry& g, DType t) { return g.adamw_update.has(Device::CPU, t); }},
  };
  nlohmann::json cov = nlohmann::json::object();
  std::string cv;
  for (DType t : {DType::F32, DType::BF16, DType::F16}) {
    std::vector<std::string> have;
    for (const auto& op : ops)
      if (op.has(r, t)) have.push_back(op.name);
    cov[dtype_name(t)] = have;
    cv += std::string(cv.empty() ? "" : "; ") + dtype_name(t) + ": " + std::to_string(have.size()) + "/" +
          std::to_string(std::size(ops));
  }
  const bool f32_all = cov["f32"].size() == std::size(ops);
  out.push_back(make("kernels.cpu", f32_all ? Status::kPass : Status::kFail,
                     "cpu kernels of gemm, attention, layernorm, gelu, crossentropy, adamw: " + cv,
                     f32_all ? "" : "the f32 CPU kernels are incomplete: this build is broken, rebuild paratrain", cov));
}

}  // namespace

std::vector<Check> kernel_checks() {
  std::vector<Check> out;
  detail::guarded(out, "blas", blas);
  detail::guarded(out, "kernels", dispatch);
  return out;
}

}  // namespace paratrain::monitor::doctor
