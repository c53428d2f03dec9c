// One rank of a program that trains its own model through the library loop
// (user_task_test.cpp): the blobs MLP of user_task_util.h in a SupervisedTask, handed to
// train::train(cfg, task, log). Started once per rank with RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT (or alone).
//
//   user_task_helper out=FILE [steps=N] [micro=B] [accum=K] [zero=Z] [precision=P] [tp=T]
//                    [ckpt=DIR] [every=N] [stop=N] [resume=1] [mismatch=1] [n=EXAMPLES]
//
// Rank 0 writes FILE: one line "loss X" per step this call ran (%.17g), then "val_loss V"
// and "accuracy A". mismatch=1 gives rank 1 a wider hidden layer, n1 rank 1 another number of training examples. Exit 2 on InputError
// (its message on stderr, "error: ..."), 1 on any other failure.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <string>

#include "paratrain/base/error.h"
#include "paratrain/train/trainer.h"
#include "train/user_task_util.h"

using namespace paratrain;

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    a[s.substr(0, eq)] = eq == std::string::npos ? "1" : s.substr(eq + 1);
  }
  const auto num = [&](const char* k, int64_t d) { return a.count(k) ? std::atoll(a[k].c_str()) : d; };
  const int rank = std::getenv("RANK") ? std::atoi(std::getenv("RANK")) : 0;
  try {
    train::TrainConfig cfg = test::blobs_config(num("steps", 8));
    cfg.micro_batch = num("micro", 8);
    cfg.grad_accum = num("accum", 1);
    cfg.zero = static_cast<int>(num("zero", 0));
    cfg.tp = num("tp", 0);
    cfg.precision = a.count("precision") ? a["precision"] : "fp32";
    cfg.checkpoint_dir = a.count("ckpt") ? a["ckpt"] : "";
    cfg.checkpoint_every = num("every", 0);
    cfg.stop_at_step = num("stop", 0);
    cfg.resume = num("resume", 0) != 0;
    cfg.eval_every = 0;
    const int64_t hidden = num("mismatch", 0) && rank == 1 ? 17 : 16;
    const int64_t n = rank == 1 && a.count("n1") ? num("n1", 256) : num("n", 256);
    test::BlobsRun run(hidden, n);
    const train::TrainResult r = train::train(cfg, run.task, std::cerr);
    if (rank == 0) {
      FILE* f = std::fopen(a["out"].c_str(), "w");
      if (!f) throw IoError("cannot write " + a["out"]);
      for (double l : r.losses) std::fprintf(f, "loss %.17g\n", l);
      std::fprintf(f, "val_loss %.17g\naccuracy %.17g\n", r.val_loss, r.accuracy);
      std::fclose(f);
    }
  } catch (const InputError& e) {
    std::fprintf(stderr, "rank %d error: %s\n", rank, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
