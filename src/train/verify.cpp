// verify(): the loop of train/verify.h. Each step: the distributed model's micro-batches and
// synchronised step (ParallelModel and DataParallelStep, as `paratrain train` runs them); a
// plain copy of the model computes this rank's local gradient on the same micro-batches; the
// three checks (verify_checks.h) after the reduction and after the optimizer step; on rank 0
// the single-process reference takes the same step on the whole global batch.
#include "paratrain/train/verify.h"

#include <algorithm>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <thread>

#include "lr_schedule.h"
#include "config_check.h"
#include "data_parallel_step.h"
#include "device_placement.h"
#include "paratrain/tensor/device.h"
#include "parallel_model.h"
#include "task_checks.h"
#include "verify_checks.h"
#include "paratrain/amp/mixed_precision.h"
#include "paratrain/autograd/engine.h"
#include "paratrain/base/env.h"
#include "paratrain/base/error.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/parallel/mesh.h"

namespace paratrain::train {

using namespace parallel;

namespace {

class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

void set_threads(const TrainConfig& cfg, const comm::JobEnv& job) {
  int t = cfg.threads;
  if (t <= 0) t = static_cast<int>(env::get_int("PARATRAIN_THREADS"));
  if (t <= 0)
    t = std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) /
                        std::max(1, static_cast<int>(job.local_world_size)));
  kernels::cpu::set_num_threads(t);
}

void refuse_unsupported(const TrainConfig& cfg, const MeshShape& shape) {
  auto not_built = [](const std::string& what) {
    PT_THROW(InputError, "paratrain verify: ", what,
             " is not built yet (verify compares whole tensors of data-parallel replicas; use --dp, --zero 0|1|2)");
  };
  if (shape.tp > 1) not_built("--tp " + std::to_string(shape.tp));
  if (shape.pp > 1) not_built("--pp " + std::to_string(shape.pp));
  if (cfg.zero == 3) not_built("--zero 3");
  if (cfg.balance == "auto") not_built("--balance auto");
  if (cfg.dropout > 0)
    PT_THROW(InputError, "paratrain verify needs --dropout 0 (each copy of the model would draw its own dropout masks)");
  const std::pair<const char*, bool> writes[] = {{"--save-final", !cfg.save_final.empty()},
                                                 {"--checkpoint-dir", !cfg.checkpoint_dir.empty()},
                                                 {"--resume", cfg.resume},
                                                 {"--metrics", !cfg.metrics.empty()}};
  for (const auto& [flag, set] : writes)
    if (set) PT_THROW(InputError, "paratrain verify reads and writes no training state: drop ", flag);
}

// One model trained step by step as `paratrain train` trains it: the distributed one, or
// rank 0's single-process reference (a mesh of one).
class Replica {
 public:
  Replica(const TrainConfig& cfg, Task& task, const DeviceMesh& mesh, double lr, int64_t micro_batch, int dp_rank,
          comm::ProcessGroup* pg, const DeviceSpec& device)
      : cfg_(cfg),
        task_(task),
        pm_(cfg, task, mesh, lr, micro_batch),
        mp_(amp::parse_precision(cfg.precision), cfg.loss_scale.empty()
                                                     ? amp::default_loss_scale(amp::parse_precision(cfg.precision))
                                                     : amp::LossScalerOptions::parse(cfg.loss_scale)),
        pg_(pg),
        base_seed_(pm_.backward_seed(cfg.grad_accum)),
        seed_(Tensor::full({}, base_seed_).to(device)) {
    MicroBatches batches{[this, dp_rank, micro_batch](int64_t s, int64_t k) -> const data::Batch& {
                           batch_.request = data::BatchRequest{s, k, dp_rank * micro_batch, micro_batch};
                           task_.fill(batch_.request, batch_.inputs, batch_.targets);
                           return batch_;
                         },
                         [](int64_t) {}};
    schedule_ = std::make_unique<DataParallelStep>(task, pm_, batches, cfg.grad_accum, mp_.compute_dtype(),
                                                   mp_.half_copies(), 1.0, device);
  }
  ParallelModel& model() { return pm_; }
  DType compute_dtype() const { return mp_.compute_dtype(); }
  double loss_scale() const { return loss_scale_; }
  bool skipped() const { return skipped_; }

  // The micro-batches' forwards and backwards, the reduction and the unscaling; returns the
  // sum of this rank's micro-batch losses.
  double backward(int64_t step, double lr) {
    pm_.optimizer().set_lr(lr);
    pm_.zero_grad();
    loss_scale_ = mp_.scaler().scale();
    seed_.fill_(static_cast<float>(base_seed_ * loss_scale_));  // on the device, no wait
    const StepOutcome out = schedule_->run(step, seed_);
    pm_.finish();
    std::vector<Tensor> grads;
    for (const auto& [name, p] : pm_.optimizer_params()) grads.push_back(p.grad());
    skipped_ = mp_.scaler().enabled() && !mp_.scaler().unscale_and_check(grads, pg_);
    return out.loss_sum;
  }
  // Clipping and the optimizer update (unless the loss scaler skips the step).
  void update() {
    if (!skipped_) {
      const double norm = pm_.grad_norm();
      pm_.clip_and_step(cfg_.grad_clip, norm);
      mp_.parameters_changed();
    }
    mp_.scaler().update();
  }

 private:
  const TrainConfig& cfg_;
  Task& task_;
  ParallelModel pm_;
  amp::MixedPrecision mp_;
  comm::ProcessGroup* pg_;
  float base_seed_;
  Tensor seed_;
  data::Batch batch_;
  std::unique_ptr<StepSchedule> schedule_;
  double loss_scale_ = 1;
  bool skipped_ = false;
};

// This rank's local gradient: a plain copy of the model (no data parallelism, on the same
// device) loaded with the distributed model's parameters, run on the rank's micro-batches.
class LocalGradient {
 public:
  LocalGradient(Task& task, const TaskLayout& layout, DType compute, const DeviceSpec& device)
      : task_(task), layout_(layout), mp_(compute, {}), device_(device) {}
  // The gradient of the mean micro-batch loss, flat in parameter order (unscaled).
  std::vector<float> compute(int64_t step, nn::Module& from, double loss_scale) {
    nn::Module& m = task_.module();
    m.load_state_dict(from.state_dict(), true);
    mp_.parameters_changed();
    m.zero_grad();
    Tensor seed =
        Tensor::full({}, static_cast<float>(loss_scale / static_cast<double>(layout_.grad_accum))).to(device_);
    for (int64_t k = 0; k < layout_.grad_accum; ++k) {
      batch_.request = data::BatchRequest{step, k, layout_.dp_rank * layout_.micro_batch, layout_.micro_batch};
      task_.fill(batch_.request, batch_.inputs, batch_.targets);
      Tensor loss;
      {
        autograd::AutocastGuard autocast(mp_.compute_dtype(), mp_.half_copies());
        loss = task_.loss(upload(batch_.inputs, device_), upload(batch_.targets, device_));
      }
      autograd::backward(loss, seed);
    }
    std::vector<float> flat;
    for (const auto& [name, p] : m.named_parameters()) {
      const size_t off = flat.size();
      flat.resize(off + static_cast<size_t>(p.numel()), 0.0f);
      if (!p.grad().defined()) continue;
      Tensor g = p.grad().to(DeviceSpec{Device::CPU, -1}).contiguous();
      const float* d = g.data<float>();
      for (int64_t i = 0; i < g.numel(); ++i) flat[off + i] = static_cast<float>(d[i] / loss_scale);
    }
    return flat;
  }

 private:
  Task& task_;
  TaskLayout layout_;
  amp::MixedPrecision mp_;
  DeviceSpec device_;
  data::Batch batch_;
};

std::string sci(double x) {
  std::ostringstream s;
  s << std::scientific << std::setprecision(1) << x;
  return s.str();
}

// The tolerances of the config (docs/verify.md).
void set_tolerances(const TrainConfig& cfg, const VerifyOptions& o, VerifyReport& r) {
  std::ostringstream note;
  const bool cast16 = cfg.compress == "fp16" || cfg.compress == "bf16";
  const bool lossy = cast16 || cfg.compress == "powersgd";
  r.grad_tolerance = cfg.compress == "fp16" ? 5e-3 : cfg.compress == "bf16" ? 3e-2 : 1e-5;
  r.global_tolerance = cfg.precision == "fp32" ? 1e-5 : 2e-2;
  if (cast16)
    note << "lossy: --compress " << cfg.compress << ": applied gradients compared with tolerance " << sci(r.grad_tolerance);
  else if (cfg.compress == "powersgd")
    note << "lossy: --compress powersgd: applied gradients judged (tolerance 1.0e-05) on the f32 steps 1.."
         << cfg.powersgd_start_iter << " only, reported after";
  else
    note << "applied gradients: f32 summation order, tolerance 1.0e-05";
  note << "; single-process gradient: tolerance " << sci(r.global_tolerance)
       << (cfg.precision == "fp32" ? "" : " (half-precision products)");
  const bool exact = cfg.deterministic && cfg.grad_accum == 1 && !lossy;
  r.params_judged = !lossy && (exact || cfg.optimizer == "sgd");
  r.param_tolerance = exact ? 0.0 : 1e-4;
  if (exact)
    note << "; parameters: --deterministic with one micro-batch per rank promises bit-identical (tolerance 0)";
  else if (lossy)
    note << "; parameters: reported, not judged (lossy compression: the runs part ways)";
  else if (cfg.optimizer == "sgd")
    note << "; parameters: f32 summation order, tolerance 1.0e-04";
  else
    note << "; parameters: reported, not judged (AdamW turns the rounding noise of zero-gradient elements into "
            "full-size steps; judged bit-identical with --deterministic --grad-accum 1)";
  if (o.grad_tolerance >= 0) {
    r.grad_tolerance = o.grad_tolerance;
    note << "; gradient tolerance set to " << sci(o.grad_tolerance);
  }
  if (o.param_tolerance >= 0) {
    r.param_tolerance = o.param_tolerance, r.params_judged = true;
    note << "; parameter tolerance set to " << sci(o.param_tolerance);
  }
  r.tolerance_note = note.str();
}

void fail(VerifyReport& r, int64_t step, const std::string& tensor, const std::string& what) {
  if (!r.passed) return;
  r.passed = false;
  r.fail_step = step;
  r.fail_tensor = tensor;
  std::ostringstream s;
  s << "first divergence at step " << step << " in tensor " << tensor << " (" << what << ")";
  r.failure = s.str();
}

// Folds one check's per-tensor differences of step `step` into the report: each tensor's worst
// (abs, rel) over the steps, the step's worst tensor, and, when `judged`, the first tensor
// above `tolerance` as the failure ("<what> by <abs>, relative <rel> > tolerance <tol><why>").
void record_check(VerifyReport& r, int64_t step, const std::vector<TensorDiff>& diffs,
                  const std::vector<std::string>& names, double TensorCheck::*abs, double TensorCheck::*rel,
                  double& step_rel, std::string& step_worst, bool judged, double tolerance, const std::string& what,
                  const std::string& why = "") {
  for (size_t t = 0; t < diffs.size(); ++t) {
    TensorCheck& tc = r.tensors[t];
    tc.*abs = std::max(tc.*abs, diffs[t].abs);
    tc.*rel = std::max(tc.*rel, diffs[t].rel);
    if (diffs[t].rel > step_rel || step_worst.empty()) step_rel = diffs[t].rel, step_worst = names[t];
    if (judged && diffs[t].rel > tolerance)
      fail(r, step, names[t],
           what + " by " + sci(diffs[t].abs) + ", relative " + sci(diffs[t].rel) + " > tolerance " + sci(tolerance) + why);
  }
}

VerifyReport run_verify(const TrainConfig& cfg, const TaskFactory& make_task, int64_t micro_batch, bool builtin,
                        std::ostream& log_out, const VerifyOptions& options) {
  const comm::JobEnv job = comm::read_job_env();
  const int world = job.world_size, rank = job.rank;
  const MeshShape shape = resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, world);
  refuse_unsupported(cfg, shape);
  set_threads(cfg, job);
  const DeviceSpec device = place_training(cfg, job);  // this rank's GPU becomes current
  const int dp = shape.dp, dp_rank = mesh_coord(rank, shape).dp;
  NullBuffer null_buf;
  std::ostream null_log(&null_buf);
  std::ostream& log = rank == 0 ? log_out : null_log;

  const TaskLayout layout{micro_batch, cfg.grad_accum, dp, dp_rank, cfg.seed};
  std::unique_ptr<Task> task = make_task(layout);
  task->setup(layout);
  if (!builtin) check_trainable(*task);
  const int64_t steps = cfg.steps > 0 ? cfg.steps : 3;
  const optim::LRSchedule sched = lr_schedule_for(cfg, *task, steps);
  const double lr = sched.lr;
  if (!cfg.init_from.empty())
    task->module().load_state_dict(checkpoint::load_safetensors(cfg.init_from), true, "transformer.");
  // Every model of the run lives on the run's device, as `paratrain train` moves its model.
  auto place = [&device](Task& t) {
    if (device.kind != Device::CPU) t.module().to(device);
  };
  place(*task);

  std::shared_ptr<comm::ProcessGroup> pg;
  if (world > 1) {
    comm::ProcessGroupOptions po;
    po.backend = backend_on(cfg, device);
    po.deterministic = cfg.deterministic;
    pg = comm::create_process_group_from_env(po);
  }
  const DeviceMesh mesh(pg, shape);
  Replica dist(cfg, *task, mesh, lr, micro_batch, dp_rank, pg.get(), device);  // DDP broadcasts dp rank 0's weights
  std::unique_ptr<Task> probe_task = make_task(layout);
  probe_task->setup(layout);
  place(*probe_task);
  LocalGradient local(*probe_task, layout, dist.compute_dtype(), device);
  // Rank 0's single-process reference: the whole global batch as grad_accum x dp micro-batches.
  TrainConfig ref_cfg = cfg;
  ref_cfg.grad_accum = cfg.grad_accum * dp;
  ref_cfg.dp = ref_cfg.tp = ref_cfg.pp = 1;
  ref_cfg.zero = 0;
  ref_cfg.compress = "none";
  const TaskLayout ref_layout{micro_batch, ref_cfg.grad_accum, 1, 0, cfg.seed};
  std::unique_ptr<Task> ref_task;
  const DeviceMesh ref_mesh(nullptr, MeshShape{1, 1, 1});
  std::unique_ptr<Replica> ref;
  std::unique_ptr<Task> global_task;
  std::unique_ptr<LocalGradient> global;  // the global batch's gradient at the distributed parameters
  if (rank == 0) {
    global_task = make_task(ref_layout);
    global_task->setup(ref_layout);
    place(*global_task);
    global = std::make_unique<LocalGradient>(*global_task, ref_layout, dist.compute_dtype(), device);
    ref_task = make_task(ref_layout);
    ref_task->setup(ref_layout);
    place(*ref_task);
    ref_task->module().load_state_dict(task->module().state_dict(), true);
    ref = std::make_unique<Replica>(ref_cfg, *ref_task, ref_mesh, lr, micro_batch, 0, nullptr, device);
  }

  VerifyReport r;
  r.world = world, r.dp = dp, r.steps = steps;
  set_tolerances(cfg, options, r);
  const ParamLayout params(dist.model().params());
  PT_CHECK(probe_task->module().named_parameters().size() == params.names.size(),
           "the task factory's tasks hold different parameters");
  for (const auto& name : params.names) r.tensors.push_back(TensorCheck{name});
  comm::ProcessGroup* dpg = mesh.dp().get();
  log << "verify: " << task->name() << ", " << steps << " steps, " << dp << " data-parallel rank" << (dp > 1 ? "s" : "")
      << (cfg.zero ? ", zero " + std::to_string(cfg.zero) : "") << (cfg.compress != "none" ? ", compress " + cfg.compress : "")
      << ", precision " << cfg.precision << (cfg.deterministic ? ", deterministic" : "")
      << (device.kind != Device::CPU ? ", on " + device.str() : "") << "\n";
  if (dp == 1) log << "verify: one data-parallel rank: the replica and reduction checks hold trivially\n";
  log << "tolerances: " << r.tolerance_note << "\n";

  for (int64_t step = 0; step < steps; ++step) {
    VerifyStep s;
    s.step = step + 1;
    const double step_lr = sched.at(step);
    double loss_sum = dist.backward(step, step_lr);
    // ---- 1. the applied gradient against the exact mean of the local gradients ----
    const std::vector<float> mine = local.compute(step, dist.model().module(), dist.loss_scale());
    const std::vector<double> mean = exact_mean(mine, dpg);
    s.grad_judged = !(cfg.compress == "powersgd" && step >= cfg.powersgd_start_iter);
    if (!dist.skipped()) {
      record_check(r, s.step, applied_vs_mean(dist.model(), params, mean, dpg), params.names, &TensorCheck::grad_abs,
                   &TensorCheck::grad_rel, s.grad_rel, s.grad_worst, s.grad_judged, r.grad_tolerance,
                   "applied gradient differs from the mean of the ranks' local gradients");
    }
    // ---- 3a. rank 0: that mean against the single-process gradient of the whole global batch ----
    if (global && !dist.skipped()) {
      const std::vector<float> g = global->compute(step, dist.model().module(), dist.loss_scale());
      record_check(r, s.step, flat_vs_reference(mean, g, params), params.names, &TensorCheck::global_abs,
                   &TensorCheck::global_rel, s.global_rel, s.global_worst, true, r.global_tolerance,
                   "the mean of the ranks' local gradients differs from the single-process gradient of the global batch",
                   ": the ranks do not read the global batch's micro-batches");
    }
    dist.update();
    // ---- 2. replicas bit-identical ----
    const ReplicaMismatch mm = compare_replica_hashes(dist.model().params(), dpg);
    s.replicas_identical = mm.tensor < 0;
    if (!s.replicas_identical)
      fail(r, s.step, params.names[mm.tensor],
           "replicas differ after the optimizer step: dp rank " + std::to_string(mm.other_rank) +
               "'s parameter hash differs from dp rank 0's");
    float loss_f = static_cast<float>(loss_sum);
    if (dpg) dpg->allreduce(&loss_f, 1, DType::F32)->wait();
    s.loss = loss_f / static_cast<double>(cfg.grad_accum * dp);
    // ---- 3b. rank 0: the single-process run of the same global batches ----
    if (ref) {
      s.reference_loss = ref->backward(step, step_lr) / static_cast<double>(ref_cfg.grad_accum);
      ref->update();
      record_check(r, s.step, params_vs_reference(dist.model().params(), ref->model().params()), params.names,
                   &TensorCheck::param_abs, &TensorCheck::param_rel, s.param_rel, s.param_worst, r.params_judged,
                   r.param_tolerance, "parameter differs from the single-process run's");
    }
    log << "step " << s.step << "/" << steps << "  loss " << std::fixed << std::setprecision(4) << s.loss
        << " (single process " << s.reference_loss << ")  grads vs mean of local: max rel " << sci(s.grad_rel)
        << (dist.skipped() ? " (step skipped by the loss scaler)" : s.grad_judged ? "" : " (lossy, not judged)")
        << "  vs single-process grad: max rel " << sci(s.global_rel) << "  replicas: " << (s.replicas_identical ? "identical" : "DIFFER") << "  params vs single process: max rel "
        << sci(s.param_rel) << "\n";
    r.per_step.push_back(s);
  }
  // The verdict is rank 0's (it alone ran check 3); every rank returns it.
  int64_t verdict[2] = {r.passed ? 1 : 0, r.fail_step};
  if (pg) pg->broadcast(verdict, 2, DType::I64, 0)->wait();
  if (rank != 0) {
    r.passed = verdict[0] != 0, r.fail_step = verdict[1];
    if (!r.passed && r.failure.empty()) r.failure = "first divergence at step " + std::to_string(r.fail_step) + " (see rank 0)";
  }
  return r;
}

}  // namespace

VerifyReport verify(const TrainConfig& cfg, std::ostream& log, const VerifyOptions& options) {
  validate_config(cfg);
  validate_builtin_model(cfg);
  const comm::JobEnv job = comm::read_job_env();
  refuse_unsupported(cfg, resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, job.world_size));
  const int64_t micro_batch = cfg.micro_batch > 0 ? cfg.micro_batch : (is_gpt_model(cfg.model) ? 8 : 64);
  auto make = [&cfg](const TaskLayout& l) {
    TrainConfig c = cfg;
    c.grad_accum = l.grad_accum;
    return make_builtin_task(c, l.micro_batch, l.dp, 1);
  };
  return run_verify(cfg, make, micro_batch, true, log, options);
}

VerifyReport verify(const TrainConfig& cfg, const TaskFactory& make_task, std::ostream& log,
                    const VerifyOptions& options) {
  validate_config(cfg);
  refuse_builtin_fields(cfg);
  return run_verify(cfg, make_task, cfg.micro_batch > 0 ? cfg.micro_batch : 32, false, log, options);
}

}  // namespace paratrain::train
