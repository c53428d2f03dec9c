// Reading a metrics file (DESIGN.md "Metrics") for the report: one JSON object per line,
// split into training and evaluation lines. Unknown keys are kept (the report reads what it
// knows); every error names the file and, for a bad line, its number.
#include <fstream>
#include <string>

#include "paratrain/base/error.h"
#include "paratrain/monitor/report.h"

namespace paratrain::monitor {

namespace {

bool blank(const std::string& s) {
  for (char c : s)
    if (c != ' ' && c != '\t' && c != '\r') return false;
  return true;
}

}  // namespace

MetricsLog read_metrics_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open the metrics file");
  MetricsLog log;
  log.path = path;
  std::string line;
  int64_t number = 0, non_blank = 0;
  while (std::getline(in, line)) {
    ++number;
    if (blank(line)) continue;
    ++non_blank;
    const std::string where = path + ":" + std::to_string(number) + ": ";
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      throw InputError(where + "not a JSON object (a metrics file holds one JSON object per line)");
    if (!j.is_object()) throw InputError(where + "expected a JSON object, got " + std::string(j.type_name()));
    if (!j.contains("step") || !j["step"].is_number())
      throw InputError(where + "the line has no numeric \"step\"");
    const bool eval = j.contains("eval") && j["eval"].is_boolean() && j["eval"].get<bool>();
    (eval ? log.evals : log.steps).push_back(std::move(j));
  }
  if (non_blank == 0) throw InputError(path + ": the metrics file is empty");
  if (log.steps.empty()) throw InputError(path + ": the metrics file holds no training step (only evaluation lines)");
  return log;
}

}  // namespace paratrain::monitor
