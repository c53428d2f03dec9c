#include "paratrain/launch/hang_report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

namespace paratrain::launch {
namespace {

using nlohmann::json;

// One call as the report sees it (from a dump record or a progress file).
struct Call {
  bool valid = false;
  std::string op, dtype, state;
  uint64_t seq = 0;
  int64_t coll = -1;
  uint64_t count = 0;
  int peer = -1;
  double t = 0;  // wall clock: enqueued (pending) or finished (completed)
};

struct GroupView {
  std::vector<int> ranks;  // global ranks, when a dump told them
  int size = 0;
  Call last;               // last completed call
  Call pending;            // oldest pending collective (else oldest pending call)
  std::map<int64_t, Call> colls;  // every collective still in the ring, by ordinal
};

struct RankView {
  const RankFlightInput* in = nullptr;
  std::string source;  // "dump (reason)", "progress file", "nothing"
  std::map<std::string, GroupView> groups;
};

Call from_record(const json& r) {
  Call c;
  c.valid = true;
  c.op = r.value("op", "?");
  c.dtype = r.value("dtype", "?");
  c.state = r.value("state", "?");
  c.seq = r.value("seq", uint64_t(0));
  c.coll = r.value("coll", int64_t(-1));
  c.count = r.value("count", uint64_t(0));
  c.peer = r.value("peer", -1);
  c.t = c.state == "completed" || c.state == "failed" ? r.value("finished_s", 0.0) : r.value("enqueued_s", 0.0);
  return c;
}

Call from_progress(const comm::FlightProgressCall& p) {
  Call c;
  if (!p.valid) return c;
  c.valid = true;
  c.op = comm::op_type_name(static_cast<comm::OpType>(p.op));
  c.dtype = dtype_name(static_cast<DType>(p.dtype));
  c.state = comm::record_state_name(static_cast<comm::RecordState>(p.state));
  c.seq = p.seq;
  c.coll = p.coll;
  c.count = p.count;
  c.t = p.t_unix_us / 1e6;
  return c;
}

bool p2p(const Call& c) { return c.op == "send" || c.op == "recv"; }

std::string show(const Call& c) {
  if (!c.valid) return "-";
  std::string s = c.op + " #" + std::to_string(c.seq);
  if (c.op == "barrier") return s;
  s += " (" + c.dtype + " x " + std::to_string(c.count);
  if (c.op == "broadcast" || c.op == "reduce") s += ", root " + std::to_string(c.peer);
  if (c.op == "send") s += ", to " + std::to_string(c.peer);
  if (c.op == "recv") s += ", from " + std::to_string(c.peer);
  return s + ")";
}

// What makes two ranks' calls at one collective ordinal the same call.
std::string signature(const Call& c) {
  return c.op + "/" + c.dtype + "/" + std::to_string(c.count) +
         (c.op == "broadcast" || c.op == "reduce" ? "/" + std::to_string(c.peer) : "");
}

std::string fmt_s(double s) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.1f s", s < 0 ? 0.0 : s);
  return b;
}

std::string rank_list(const std::vector<int>& rs) {
  std::string s;
  for (size_t i = 0; i < rs.size(); ++i) s += (i ? "," : "") + std::to_string(rs[i]);
  return s;
}

RankView view_of(const RankFlightInput& in) {
  RankView v;
  v.in = &in;
  v.source = "nothing";
  if (!in.dump_json.empty()) {
    try {
      json j = json::parse(in.dump_json);
      v.source = std::string(in.answered ? "dump" : "last dump") + " (" + j.value("reason", "?") + ")";
      std::map<int, std::string> names;
      for (const json& g : j.at("groups")) {
        GroupView& gv = v.groups[g.value("name", "?")];
        names[g.value("id", -1)] = g.value("name", "?");
        gv.size = g.value("size", 0);
        for (const json& r : g.at("ranks")) gv.ranks.push_back(r.get<int>());
        if (!g.at("last_completed").is_null()) gv.last = from_record(g.at("last_completed"));
        for (const json& p : g.at("pending")) {
          Call c = from_record(p);
          if (!gv.pending.valid || (p2p(gv.pending) && !p2p(c))) gv.pending = c;
          if (!p2p(gv.pending)) break;
        }
      }
      for (const json& r : j.at("records")) {
        Call c = from_record(r);
        if (c.coll < 0) continue;
        auto it = names.find(r.value("group", -1));
        if (it != names.end()) v.groups[it->second].colls[c.coll] = c;
      }
      return v;
    } catch (const std::exception&) {
      v.groups.clear();
      v.source = "unreadable dump";
    }
  }
  if (in.progress) {
    v.source = "progress file";
    const auto& p = *in.progress;
    Call last = from_progress(p.last_finished);
    if (last.valid && last.state == "completed") v.groups[p.last_finished.group].last = last;
    if (p.issued > p.finished) {
      Call pend = from_progress(p.last_issued);
      if (pend.valid) {
        GroupView& g = v.groups[p.last_issued.group];
        g.pending = pend;
        g.size = p.last_issued.group_size;
        if (pend.coll >= 0) g.colls[pend.coll] = pend;
      }
    }
  }
  return v;
}

}  // namespace

FlightReport analyse_flight_records(const std::vector<RankFlightInput>& ranks, double now_s) {
  FlightReport rep;
  std::vector<RankView> views;
  for (const auto& r : ranks) views.push_back(view_of(r));

  // ---- the table
  char line[512];
  std::snprintf(line, sizeof(line), "  %-5s %-8s %-18s %-10s %-34s %-44s %s\n", "rank", "pid", "state", "group",
                "last completed", "pending (since)", "source");
  rep.table = line;
  for (const RankView& v : views) {
    auto row = [&](const std::string& group, const GroupView* g) {
      std::string pend = "-";
      if (g && g->pending.valid) pend = show(g->pending) + " " + g->pending.state + " (" + fmt_s(now_s - g->pending.t) + ")";
      std::snprintf(line, sizeof(line), "  %-5d %-8ld %-18s %-10s %-34s %-44s %s\n", v.in->rank, v.in->pid,
                    v.in->state.c_str(), group.c_str(), g ? show(g->last).c_str() : "-", pend.c_str(),
                    v.source.c_str());
      rep.table += line;
    };
    if (v.groups.empty()) row("-", nullptr);
    for (const auto& [name, g] : v.groups) row(name, &g);
  }

  // ---- per group: who is missing, who disagrees
  std::set<std::string> names;
  for (const RankView& v : views)
    for (const auto& kv : v.groups) names.insert(kv.first);
  for (const std::string& name : names) {
    std::vector<int> members;
    for (const RankView& v : views) {
      auto it = v.groups.find(name);
      if (it != v.groups.end() && !it->second.ranks.empty()) {
        members = it->second.ranks;
        break;
      }
    }
    if (members.empty())
      for (const RankView& v : views)
        if (v.groups.count(name)) members.push_back(v.in->rank);
    auto view = [&](int rank) -> const RankView* {
      for (const RankView& v : views)
        if (v.in->rank == rank) return &v;
      return nullptr;
    };
    auto gview = [&](int rank) -> const GroupView* {
      const RankView* v = view(rank);
      if (!v) return nullptr;
      auto it = v->groups.find(name);
      return it == v->groups.end() ? nullptr : &it->second;
    };

    // Mismatch: the first collective ordinal at which two ranks' calls differ.
    std::map<int64_t, std::map<std::string, std::vector<int>>> by_coll;
    std::map<int64_t, std::map<std::string, Call>> example;
    for (int r : members)
      if (const GroupView* g = gview(r))
        for (const auto& [k, c] : g->colls) {
          by_coll[k][signature(c)].push_back(r);
          example[k][signature(c)] = c;
        }
    bool mismatched = false;
    for (const auto& [k, sigs] : by_coll) {
      if (sigs.size() < 2) continue;
      mismatched = true;
      std::string s = "mismatch in group " + name + " at its collective " + std::to_string(k) + ": ";
      bool first = true;
      for (const auto& [sig, rs] : sigs) {
        s += (first ? "" : ", ") + std::string(rs.size() > 1 ? "ranks " : "rank ") + rank_list(rs) + " called " +
             show(example[k][sig]);
        first = false;
      }
      rep.verdicts.push_back(s);
      break;
    }

    // The collective the most advanced waiting ranks are in, and who never arrived there.
    int64_t K = -1;
    for (int r : members)
      if (const GroupView* g = gview(r))
        if (g->pending.valid && g->pending.coll >= 0) K = std::max(K, g->pending.coll);
    if (K < 0) continue;
    std::vector<int> waiting, missing;
    Call at;
    double since = 0;
    for (int r : members) {
      const GroupView* g = gview(r);
      if (g && g->pending.valid && g->pending.coll == K) {
        waiting.push_back(r);
        if (!at.valid || g->pending.t < at.t) at = g->pending;
        since = std::max(since, now_s - g->pending.t);
      } else if (!g || !g->last.valid || g->last.coll < K) {
        missing.push_back(r);
      }
    }
    if (missing.empty()) {
      if (mismatched) continue;  // the mismatch is the story
      rep.verdicts.push_back("every rank of group " + name + " is in " + show(at) + " (for up to " + fmt_s(since) +
                             "): the collective itself does not advance");
      continue;
    }
    for (int r : missing) {
      const RankView* v = view(r);
      const GroupView* g = gview(r);
      std::string s = "rank " + std::to_string(r) + " never called " + at.op + " #" + std::to_string(at.seq) +
                      " (group " + name + "); " + (waiting.size() > 1 ? "ranks " : "rank ") + rank_list(waiting) +
                      (waiting.size() > 1 ? " wait" : " waits") + " for it since " + fmt_s(since);
      std::vector<std::string> about;
      if (!v) about.push_back("no record of it (not a local rank, or it never created a group)");
      else if (v->in->state != "running") about.push_back("it is " + v->in->state);
      if (g && g->pending.valid) about.push_back("it waits in " + show(g->pending) + " since " + fmt_s(now_s - g->pending.t));
      else if (v && v->in->state == "running") about.push_back("it is outside any collective of this group");
      if (g && g->last.valid) about.push_back("its last completed is " + show(g->last));
      for (size_t i = 0; i < about.size(); ++i) s += (i ? "; " : " (") + about[i];
      if (!about.empty()) s += ")";
      rep.verdicts.push_back(s);
    }
  }
  if (rep.verdicts.empty()) rep.verdicts.push_back("no rank waits in a collective that another rank did not call");
  return rep;
}

}  // namespace paratrain::launch
