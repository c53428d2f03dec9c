#include "paratrain/launch/options.h"

#include <cmath>
#include <cstdlib>

#include "paratrain/base/error.h"

namespace paratrain::launch {
namespace {

int parse_int(const std::string& flag, const std::string& v, int lo, int hi) {
  size_t pos = 0;
  long long x = 0;
  try {
    x = std::stoll(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (v.empty() || pos != v.size())
    PT_THROW(InputError, flag, " expects an integer, got '", v, "'");
  if (x < lo || x > hi) PT_THROW(InputError, flag, " must be in ", lo, "..", hi, ", got ", x);
  return static_cast<int>(x);
}

double parse_seconds(const std::string& flag, const std::string& v) {
  size_t pos = 0;
  double x = 0;
  try {
    x = std::stod(v, &pos);
  } catch (const std::exception&) {
    pos = 0;
  }
  if (v.empty() || pos != v.size() || !std::isfinite(x) || x < 0 || x > 1e7)
    PT_THROW(InputError, flag, " expects a number of seconds >= 0, got '", v, "'");
  return x;
}

}  // namespace

std::string launch_usage() {
  return
      "usage: paratrain launch [options] [--] PROGRAM [ARGS...]\n"
      "Starts one process per rank of PROGRAM, tells each who it is (RANK, LOCAL_RANK,\n"
      "WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, PARATRAIN_TOKEN,\n"
      "...), prefixes their output with [rank], and stops the group when one fails.\n"
      "\n"
      "  --nproc-per-node N|auto  ranks on this node (default 1; auto: one per GPU,\n"
      "                           else one per core group of cores sharing an L3 cache)\n"
      "  --nnodes M               nodes in the job (default 1)\n"
      "  --node-rank R            this node's index, 0..M-1 (default 0; node 0 hosts the store)\n"
      "  --master-addr A          address of node 0 (default 127.0.0.1)\n"
      "  --master-port P          MASTER_PORT, left to the program's rank 0 on node 0 (e.g.\n"
      "                           PyTorch's TCPStore); default: a free port on one node, 29500 on\n"
      "                           several, whose launchers also meet on P+1\n"
      "  --max-restarts K         restart the whole group up to K times after a failure (default 0)\n"
      "  --log-dir DIR            also write each rank's output to DIR/rank_<rank>.log\n"
      "  --rdzv-timeout S         seconds for all nodes to meet (default 300)\n"
      "  --grace-period S         seconds between SIGTERM and SIGKILL when stopping ranks (default 5)\n"
      "  --hang-timeout S         declare the job hung when no rank's collectives advance for S s\n"
      "                           while some wait: print the flight-recorder report and stop it\n"
      "                           (default 0 = off; kill -USR1 to the launcher prints the report\n"
      "                           and lets the job go on)\n"
      "  -h, --help               this text\n"
      "Multi-node jobs need PARATRAIN_TOKEN set to the same secret on every node.\n"
      "Exit code: 0 if every rank succeeded, else the first failed rank's code (128+signal);\n"
      "2 for bad usage, 1 for a failed rendezvous.\n";
}

LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions o;
  bool port_given = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      o.help = true;
      continue;
    }
    if (a.size() < 2 || a[0] != '-') break;  // the program starts here
    if (a.rfind("--", 0) != 0) PT_THROW(InputError, "launch: unknown option '", a, "' (see paratrain launch --help)");
    std::string name = a;
    std::string value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    for (size_t c = 2; c < name.size(); ++c)
      if (name[c] == '_') name[c] = '-';  // torchrun spells them --nproc_per_node
    static const char* kFlags[] = {"--nproc-per-node", "--nnodes", "--node-rank", "--master-addr",
                                   "--master-port", "--max-restarts", "--log-dir", "--rdzv-timeout",
                                   "--grace-period", "--hang-timeout"};
    bool known = false;
    for (const char* f : kFlags) known = known || name == f;
    if (!known) PT_THROW(InputError, "launch: unknown option '", a, "' (see paratrain launch --help)");
    if (!has_value) {
      if (i + 1 >= args.size()) PT_THROW(InputError, "launch: ", name, " needs a value");
      value = args[++i];
    }
    if (name == "--nproc-per-node") {
      if (value == "auto") {
        o.nproc_auto = true;
      } else {
        o.nproc_auto = false;
        o.nproc_per_node = parse_int(name, value, 1, 4096);
      }
    } else if (name == "--nnodes") {
      o.nnodes = parse_int(name, value, 1, 65536);
    } else if (name == "--node-rank") {
      o.node_rank = parse_int(name, value, 0, 65535);
    } else if (name == "--master-addr") {
      if (value.empty()) PT_THROW(InputError, "launch: --master-addr must not be empty");
      o.master_addr = value;
    } else if (name == "--master-port") {
      o.master_port = parse_int(name, value, 1, 65535);
      port_given = true;
    } else if (name == "--max-restarts") {
      o.max_restarts = parse_int(name, value, 0, 1000000);
    } else if (name == "--log-dir") {
      if (value.empty()) PT_THROW(InputError, "launch: --log-dir must not be empty");
      o.log_dir = value;
    } else if (name == "--rdzv-timeout") {
      o.rdzv_timeout_s = parse_seconds(name, value);
      if (o.rdzv_timeout_s <= 0) PT_THROW(InputError, "launch: --rdzv-timeout must be > 0");
    } else if (name == "--grace-period") {
      o.grace_period_s = parse_seconds(name, value);
    } else if (name == "--hang-timeout") {
      o.hang_timeout_s = parse_seconds(name, value);
    }
  }
  for (; i < args.size(); ++i) o.program.push_back(args[i]);
  if (o.help) return o;
  if (o.node_rank >= o.nnodes)
    PT_THROW(InputError, "launch: --node-rank ", o.node_rank, " is outside --nnodes ", o.nnodes,
             " (node ranks are 0..", o.nnodes - 1, ")");
  if (o.program.empty() || o.program[0].empty())
    PT_THROW(InputError, "launch: no program given (usage: paratrain launch [options] -- PROGRAM [ARGS...])");
  if (!port_given && o.nnodes > 1) o.master_port = kDefaultMasterPort;
  return o;
}

}  // namespace paratrain::launch
