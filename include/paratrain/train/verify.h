// `paratrain verify`: is the gradient synchronisation correct? verify() runs N optimizer
// steps of a training configuration and checks, after every step:
//  1. gradients: what each data-parallel rank is about to apply (after DDP / ZeRO's
//     reduce-scatter / compression, after loss-scale unscaling, before clipping) equals the
//     mean of the ranks' local gradients, computed separately on a plain copy of the model
//     (no DDP) on the rank's own micro-batches and averaged exactly (f64, rank order);
//  2. replicas: a 64-bit FNV-1a hash of every parameter's bytes, all-gathered over the
//     data-parallel group, is the same on every rank (bit-identical replicas);
//  3. single process, on rank 0: (a) the gradient of the whole global batch (grad_accum x dp
//     micro-batches, the DESIGN.md data order) computed in one process at the distributed
//     parameters equals that mean of the local gradients (the ranks read the right data);
//     (b) a reference model trained in one process on the same global batches from the same
//     start, with no data parallelism, against the distributed parameters after every step.
// Tolerances (VerifyReport::grad_tolerance / param_tolerance, relative to a tensor's largest
// absolute value) follow the config: docs/verify.md. The first check that fails names the
// step and the tensor (VerifyReport::failure).
//
// Layouts: data parallelism (DDP, --zero 1|2, --compress, --deterministic, --precision);
// tp > 1, pp > 1, zero 3, --balance auto and dropout are refused with an InputError (not
// built: the checks need whole, identically computed tensors). The flags that write files
// (save_final, checkpoint_dir, resume, metrics) are refused too.
//
// Ranks: collective over the job (RANK/WORLD_SIZE as for train()); every rank calls it with
// the same config and gets the same verdict (passed, failure); per-step figures of the
// single-process comparison are rank 0's. One process is trivially consistent (checks 1 and
// 2 hold by construction) and still runs check 3.
//
// Thread-safety: one call at a time per process (it sets the kernel thread count).
// Lifetime: keeps nothing after it returns.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/train/config.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

struct VerifyOptions {
  double grad_tolerance = -1;   // < 0: from the config (docs/verify.md)
  double param_tolerance = -1;  // < 0: from the config; 0 = bit-identical
};

// One tensor's largest differences over all steps.
struct TensorCheck {
  std::string name;
  double grad_abs = 0;   // max |applied grad - mean of local grads| over ranks and steps
  double grad_rel = 0;   // the same over the tensor's largest |mean grad| (per step, worst)
  double global_abs = 0; // max |mean of local grads - single-process gradient of the global batch|
  double global_rel = 0; // the same over the tensor's largest |single-process gradient|
  double param_abs = 0;  // max |distributed param - single-process param| (rank 0)
  double param_rel = 0;  // the same over the tensor's largest |single-process param|
};

struct VerifyStep {
  int64_t step = 0;           // 1-based
  double loss = 0;            // mean over the global batch (distributed)
  double reference_loss = 0;  // the single-process run's (rank 0; else 0)
  double grad_rel = 0;        // worst tensor of check 1
  std::string grad_worst;
  bool grad_judged = true;    // false: lossy compression (PowerSGD), reported only
  double global_rel = 0;      // worst tensor of check 3a (rank 0)
  std::string global_worst;
  bool replicas_identical = true;
  double param_rel = 0;       // worst tensor of check 3
  std::string param_worst;
};

struct VerifyReport {
  int world = 1, dp = 1;
  int64_t steps = 0;
  double grad_tolerance = 0;    // checks 1 (applied vs mean of local)
  double global_tolerance = 0;  // check 3a (mean of local vs single-process gradient)
  double param_tolerance = 0;   // check 3b
  bool params_judged = true;  // false: reported only (lossy compression; AdamW without --deterministic)
  std::string tolerance_note;  // why these tolerances (printed)
  std::vector<VerifyStep> per_step;
  std::vector<TensorCheck> tensors;  // in parameter order
  bool passed = true;
  int64_t fail_step = 0;    // first failing step (1-based), 0 when passed
  std::string fail_tensor;  // the tensor that diverged first
  std::string failure;      // "first divergence at step S in tensor NAME (...)"
  nlohmann::json to_json() const;
};

// Prints the per-tensor table and the verdict line ("verdict: PASS" / "verdict: FAIL: ...").
void print_verify_report(const VerifyReport& report, std::ostream& out);

// A task as verify() needs it, three times: the distributed model, the plain copy that
// computes the local gradients (both with the run's layout), and on rank 0 the
// single-process reference (dp 1, grad_accum x dp micro-batches). Each call returns a fresh
// task whose model is initialised the same way; verify() then calls setup(layout) on it.
using TaskFactory = std::function<std::unique_ptr<Task>(const TaskLayout& layout)>;

// The built-in task cfg names (`paratrain verify`). Per-step lines go to `log` (rank 0).
VerifyReport verify(const TrainConfig& cfg, std::ostream& log, const VerifyOptions& options = {});
// A program's own task.
VerifyReport verify(const TrainConfig& cfg, const TaskFactory& make_task, std::ostream& log,
                    const VerifyOptions& options = {});

}  // namespace paratrain::train
