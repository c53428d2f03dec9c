// VerifyReport's table, verdict line and JSON (train/verify.h).
#include <iomanip>
#include <ostream>
#include <sstream>

#include "paratrain/train/verify.h"

namespace paratrain::train {

nlohmann::json VerifyReport::to_json() const {
  nlohmann::json j = {{"world", world},
                      {"dp", dp},
                      {"steps", steps},
                      {"grad_tolerance", grad_tolerance},
                      {"global_tolerance", global_tolerance},
                      {"param_tolerance", param_tolerance},
                      {"params_judged", params_judged},
                      {"tolerance_note", tolerance_note},
                      {"passed", passed}};
  if (!passed) j["failure"] = {{"step", fail_step}, {"tensor", fail_tensor}, {"message", failure}};
  j["per_step"] = nlohmann::json::array();
  for (const auto& s : per_step)
    j["per_step"].push_back({{"step", s.step},
                             {"loss", s.loss},
                             {"reference_loss", s.reference_loss},
                             {"grad_rel", s.grad_rel},
                             {"grad_worst", s.grad_worst},
                             {"grad_judged", s.grad_judged},
                             {"global_rel", s.global_rel},
                             {"global_worst", s.global_worst},
                             {"replicas_identical", s.replicas_identical},
                             {"param_rel", s.param_rel},
                             {"param_worst", s.param_worst}});
  j["tensors"] = nlohmann::json::array();
  for (const auto& t : tensors)
    j["tensors"].push_back({{"name", t.name},
                            {"grad_abs", t.grad_abs},
                            {"grad_rel", t.grad_rel},
                            {"global_abs", t.global_abs},
                            {"global_rel", t.global_rel},
                            {"param_abs", t.param_abs},
                            {"param_rel", t.param_rel}});
  return j;
}

void print_verify_report(const VerifyReport& r, std::ostream& out) {
  size_t width = 6;
  for (const auto& t : r.tensors) width = std::max(width, t.name.size());
  std::ostringstream s;
  s << std::left << std::setw(static_cast<int>(width)) << "tensor" << std::right << std::setw(14) << "grad |d|"
    << std::setw(10) << "grad rel" << std::setw(14) << "global |d|" << std::setw(11) << "global rel"
    << std::setw(14) << "param |d|" << std::setw(11) << "param rel" << "\n";
  s << std::scientific << std::setprecision(2);
  for (const auto& t : r.tensors)
    s << std::left << std::setw(static_cast<int>(width)) << t.name << std::right << std::setw(14) << t.grad_abs
      << std::setw(10) << std::setprecision(1) << t.grad_rel << std::setw(14) << std::setprecision(2) << t.global_abs
      << std::setw(11) << std::setprecision(1) << t.global_rel << std::setw(14) << std::setprecision(2) << t.param_abs
      << std::setw(11) << std::setprecision(1) << t.param_rel << std::setprecision(2) << "\n";
  s << "(grad: applied gradient vs the mean of the ranks' local gradients, worst rank and step; global: that mean vs "
       "the single-process gradient of the global batch; param: distributed vs single-process parameters after each "
       "step; rel: over the tensor's largest |value|)\n";
  s << "tolerances: " << r.tolerance_note << "\n";
  s << "verdict: " << (r.passed ? "PASS" : "FAIL: " + r.failure) << "\n";
  out << s.str();
}

}  // namespace paratrain::train
