// run(), the report's JSON document and its table, and the checks' JSON form.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "monitor/doctor/check_util.h"
#include "monitor/doctor/job_session.h"
#include "paratrain/base/env.h"
#include "paratrain/version.h"

namespace paratrain::monitor::doctor {

const char* status_name(Status s) {
  switch (s) {
    case Status::kPass: return "pass";
    case Status::kWarn: return "warn";
    case Status::kFail: return "fail";
    case Status::kSkip: return "skip";
  }
  return "?";
}

static Status parse_status(const std::string& s) {
  if (s == "warn") return Status::kWarn;
  if (s == "fail") return Status::kFail;
  if (s == "skip") return Status::kSkip;
  return Status::kPass;
}

bool Report::failed() const {
  return job_failed || std::any_of(checks.begin(), checks.end(), [](const Check& c) { return c.status == Status::kFail; });
}

int Report::count(Status s) const {
  return static_cast<int>(std::count_if(checks.begin(), checks.end(), [s](const Check& c) { return c.status == s; }));
}

namespace detail {

nlohmann::json check_to_json(const Check& c) {
  return {{"name", c.name},   {"group", c.name.substr(0, c.name.find('.'))}, {"status", status_name(c.status)},
          {"value", c.value}, {"fix", c.fix}, {"rank", c.rank}, {"data", c.data}};
}

Check check_from_json(const nlohmann::json& j) {
  Check c;
  c.name = j.at("name").get<std::string>();
  c.status = parse_status(j.at("status").get<std::string>());
  c.value = j.value("value", "");
  c.fix = j.value("fix", "");
  c.rank = j.value("rank", 0);
  c.data = j.value("data", nlohmann::json::object());
  return c;
}

}  // namespace detail

std::vector<Check> job_checks(const Options& options) {
  std::vector<Check> out;
  detail::guarded(out, "job", [&](std::vector<Check>& o) {
    if (auto s = detail::JobSession::open(options, o)) s->run_checks(o);
  });
  return out;
}

Report run(const Options& options) {
  Report rep;
  rep.host = detail::hostname();
  for (auto* group : {&host_checks, &kernel_checks, &cuda_checks, &env_checks})
    for (auto& c : (*group)()) rep.checks.push_back(std::move(c));
  for (auto& c : comm_checks(options)) rep.checks.push_back(std::move(c));
  std::unique_ptr<detail::JobSession> session;
  detail::guarded(rep.checks, "job", [&](std::vector<Check>& o) {
    session = detail::JobSession::open(options, o);
    if (session) session->run_checks(o);
  });
  if (!session) {
    // A job whose session could not even be opened still has its rank for the record.
    for (const char* v : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"})
      if (auto r = env::raw(v)) {
        rep.rank = std::atoi(r->c_str());
        break;
      }
    for (auto& c : rep.checks) c.rank = rep.rank;
    return rep;
  }
  rep.rank = session->rank();
  rep.world_size = session->size();
  for (auto& c : rep.checks) c.rank = rep.rank;
  // Rank 0 adds the other ranks' warnings and failures that it did not see the same itself.
  std::vector<Check> others = session->gather(rep.checks);
  for (auto& c : others) {
    if (c.status != Status::kWarn && c.status != Status::kFail) continue;
    const bool seen = std::any_of(rep.checks.begin(), rep.checks.end(), [&](const Check& m) {
      return m.name == c.name && m.status == c.status && m.value == c.value;
    });
    if (!seen) rep.checks.push_back(std::move(c));
  }
  rep.job_failed = session->agree(rep.failed());
  return rep;
}

nlohmann::json to_json(const Report& report) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : report.checks) checks.push_back(detail::check_to_json(c));
  return {{"schema", "paratrain.doctor/1"},
          {"version", PARATRAIN_VERSION_STRING},
          {"host", report.host},
          {"rank", report.rank},
          {"world_size", report.world_size},
          {"ok", !report.failed()},
          {"summary",
           {{"pass", report.count(Status::kPass)},
            {"warn", report.count(Status::kWarn)},
            {"fail", report.count(Status::kFail)},
            {"skip", report.count(Status::kSkip)}}},
          {"checks", checks},
          {"variables", variables_json()}};
}

std::string format_table(const Report& report) {
  std::ostringstream os;
  size_t w = 5;
  for (const auto& c : report.checks) w = std::max(w, c.name.size());
  os << "paratrain " PARATRAIN_VERSION_STRING " doctor on " << report.host;
  if (report.world_size > 1) os << " (rank " << report.rank << " of " << report.world_size << ")";
  os << "\n\nSTATUS  " << std::string("CHECK") + std::string(w - 5, ' ') << "  VALUE\n";
  for (const auto& c : report.checks) {
    std::string st = status_name(c.status);
    std::transform(st.begin(), st.end(), st.begin(), ::toupper);
    os << st << "    " << c.name << std::string(w - c.name.size(), ' ') << "  ";
    if (c.rank != report.rank) os << "rank " << c.rank << ": ";
    os << c.value;
    if (!c.fix.empty() && (c.status == Status::kWarn || c.status == Status::kFail)) os << "  -> fix: " << c.fix;
    os << "\n";
  }
  os << "\nsummary: " << report.count(Status::kPass) << " pass, " << report.count(Status::kWarn) << " warn, "
     << report.count(Status::kFail) << " fail, " << report.count(Status::kSkip) << " skip: "
     << (report.failed() ? "FAILED" : "ok") << "\n\nPARATRAIN_* variables in effect:\n";
  for (const auto& v : variables_json()) {
    std::string name = v["name"], value = v["value"], source = v["source"];
    os << "  " << name << std::string(name.size() < 30 ? 30 - name.size() : 1, ' ')
       << (source == "unset" ? "(unset)" : value + (source == "default" ? " (default)" : ""))
       << (v["known"].get<bool>() ? "" : "  (unknown)") << "\n";
  }
  return os.str();
}

}  // namespace paratrain::monitor::doctor
