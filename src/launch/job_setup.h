// What a launch sets up once, before its first attempt (Launcher::run): the checks that can be
// made before any rank starts (the program, the token of a multi-node job, --log-dir, node 0's
// ports: InputError, one line), the number of local ranks (--nproc-per-node auto's choice, said
// once), the threads of each rank, and on a multi-node job the launchers' rendezvous store
// (hosted by node 0 at MASTER_PORT+1 for the whole job) and this node's NodeRendezvous.
// MASTER_PORT itself is the program's (its rank 0 hosts a store there, as PyTorch's TCPStore
// does under env://): node 0 only checks that it is free, or picks a free one on one node
// without --master-port. The paratrain ranks' own store is a fresh one for every attempt, on
// a port the kernel picks (host_attempt_store).
// Used from the launcher's thread only; a JobSetup lives as long as the launch.
#pragma once

#include <memory>
#include <string>

#include "paratrain/comm/store.h"
#include "paratrain/launch/options.h"
#include "paratrain/launch/rendezvous.h"

namespace paratrain::launch {

struct JobSetup {
  int nproc = 1;              // local ranks
  std::string exe;            // the program, resolved on PATH
  std::string token;          // PARATRAIN_TOKEN, or a fresh one on one node
  std::string host;           // this node's name
  int threads = 1;            // PARATRAIN_THREADS of each rank
  int omp_threads = 0;        // OMP_NUM_THREADS of each rank; 0: the caller's (or unset)
  int port = -1;              // MASTER_PORT
  std::string where;          // the launchers' store, "MASTER_ADDR:MASTER_PORT+1" (messages)
  std::string run_id;         // "MASTER_ADDR:MASTER_PORT"
  std::unique_ptr<comm::TcpStoreServer> rdzv_server;  // node 0 of a multi-node job
  std::unique_ptr<NodeRendezvous> rdzv;               // a multi-node job's; null on one node
};

// The checks and the setup above, in this order; say()s what it chooses for the user.
JobSetup set_up_job(const LaunchOptions& o);

// Node 0, before each attempt: the paratrain ranks' store on a port the kernel picks (never
// MASTER_PORT), published to the other nodes of a multi-node job. IoError or CommError (a
// rendezvous failure) naming what failed.
std::unique_ptr<comm::TcpStoreServer> host_attempt_store(const JobSetup& job, int attempt);

}  // namespace paratrain::launch
