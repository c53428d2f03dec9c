#include "paratrain/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iomanip>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <ostream>
#include <sstream>
#include <thread>

#include "lr_schedule.h"
#include "checkpoint_saver.h"
#include "config_check.h"
#include "data_parallel_step.h"
#include "device_placement.h"
#include "parallel_model.h"
#include "pipeline_step.h"
#include "resume.h"
#include "run_log.h"
#include "step_report.h"
#include "step_traffic.h"
#include "run_record.h"
#include "task_checks.h"
#include "test_hooks.h"
#include "paratrain/amp/mixed_precision.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/env.h"
#include "paratrain/base/log.h"
#include "paratrain/base/trace.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/training_state.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/monitor/progress.h"
#include "paratrain/tensor/cuda.h"
#include "paratrain/monitor/trace_file.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/load_balancer.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

using namespace parallel;


namespace {

using Clock = std::chrono::steady_clock;

int default_threads(const comm::JobEnv& job) {
  if (int64_t t = env::get_int("PARATRAIN_THREADS"); t > 0) return static_cast<int>(t);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int64_t local = env::raw_int("LOCAL_WORLD_SIZE").value_or(env::raw_int("OMPI_COMM_WORLD_LOCAL_SIZE").value_or(1));
  local = std::max<int64_t>(local, job.local_world_size);
  return std::max(1, cores / static_cast<int>(std::max<int64_t>(local, 1)));
}

// A stream that drops everything (ranks other than 0 print nothing).
class NullBuffer : public std::streambuf {
 protected:
  int overflow(int c) override { return c; }
};

std::vector<Tensor> grads_of(const optim::NamedParams& params) {
  std::vector<Tensor> g;
  g.reserve(params.size());
  for (const auto& [name, p] : params) g.push_back(p.grad());
  return g;
}

// The pipeline's combinations, checked before anything is read.
void check_pipeline_config(const TrainConfig& c, int64_t pp) {
  // The schedule itself: InputError for --pp-virtual without interleaved, interleaved with
  // micro-batches not a multiple of the stages.
  pipeline::build_schedule({pipeline::parse_schedule(c.pp_schedule), static_cast<int>(pp), static_cast<int>(c.grad_accum),
                            pipeline_virtual_chunks(c)});
  if (c.zero == 3)
    PT_THROW(InputError, "--zero 3 cannot be combined with --pp ", pp,
             " (each stage's parameters are already its own; use --zero 1 or 2 over the data-parallel ranks)");
  if (c.balance == "auto")
    PT_THROW(InputError, "--balance auto cannot be combined with --pp ", pp,
             " (the stages of a pipeline share every micro-batch)");
  if (c.compress != "none")
    PT_THROW(InputError, "--compress ", c.compress, " cannot be combined with --pp ", pp,
             " yet (the pipeline reduces its gradients uncompressed)");
  if (c.deterministic)
    PT_THROW(InputError, "--deterministic cannot be combined with --pp ", pp,
             " (the pipeline's micro-batch gradients accumulate in schedule order)");
}

// The entries of `state` ("<param>" or "<param>.<state>") that belong to `params`.
std::map<std::string, Tensor> state_of(const std::map<std::string, Tensor>& state, const optim::NamedParams& params) {
  std::map<std::string, Tensor> out;
  for (const auto& [key, t] : state)
    for (const auto& [name, p] : params)
      if (key == name || (key.size() > name.size() && key.compare(0, name.size(), name) == 0 && key[name.size()] == '.')) {
        out.emplace(key, t);
        break;
      }
  return out;
}

// The layout's combinations (the mesh against the other options), checked before anything is read.
void check_layout(const TrainConfig& cfg, const MeshShape& shape) {
  if (shape.pp > 1) check_pipeline_config(cfg, shape.pp);
  if (cfg.sequence_parallel && shape.tp == 1) PT_THROW(InputError, "--sequence-parallel needs --tp 2 or more");
  if (shape.tp > 1 && cfg.balance == "auto")
    PT_THROW(InputError, "--balance auto cannot be combined with --tp ", shape.tp,
             " (the ranks of a tensor-parallel group share every micro-batch)");
}

void set_threads(const TrainConfig& cfg, const comm::JobEnv& job) {
  kernels::cpu::set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads(job));
}

// A verified checkpoint's optimizer, data-order and loss-scaler state applied to this rank
// (the model's weights were loaded before the model was cut): the checkpoint holds the whole
// state, whatever layout saved it; this rank takes its tensor-parallel part of it, a pipeline
// stage the state of its own parameters, and ZeRO its pieces of that. The checkpoint's
// tensors are released once applied.
void apply_resumed_state(checkpoint::TrainingState& resumed, ParallelModel& pm, Task& task, amp::MixedPrecision& mp) {
  auto optimizer_state = pm.plan().cut_local(resumed.optimizer);
  if (pm.pipelined()) optimizer_state = state_of(optimizer_state, pm.params());
  if (ZeroOptimizer* zero = pm.zero())
    zero->load_state(optimizer_state, resumed.optimizer_steps);  // this rank's pieces, re-cut
  else
    pm.optimizer().load_state_dict(optimizer_state, resumed.optimizer_steps);
  if (Generator* gen = task.generator(); gen && resumed.rng) gen->set_state(*resumed.rng);
  if (mp.scaler().enabled()) mp.scaler().load_state(resumed.loss_scale, resumed.loss_scale_growth_tracker);
  resumed.model.clear();
  resumed.optimizer.clear();
}

// --save-final: the whole model with its Hugging Face names, whatever the layout (gathered over
// tp and pp: every rank takes part), written by rank 0 (in bf16 with --save-dtype bf16).
void save_final_weights(const TrainConfig& cfg, ParallelModel& pm, const Task& task, int rank, std::ostream& log) {
  std::map<std::string, Tensor> weights = pm.whole_weights();
  if (rank != 0) return;
  if (cfg.save_dtype == "bf16")
    for (auto& [name, t] : weights) t = t.to(DType::BF16);
  checkpoint::save_safetensors(cfg.save_final, weights, task.metadata());
  log << "saved " << cfg.save_final << "\n";
}

// The loop, for a built-in task or a program's own (`builtin` false: its checks in the
// library's terms, and the ranks' tasks compared).
TrainResult run_training(const TrainConfig& cfg, Task& task_ref, int64_t micro_batch, bool builtin,
                         std::ostream& log_out, const StepCallback& on_step) {
  Task* const task = &task_ref;
  const comm::JobEnv job = comm::read_job_env();
  const int world = job.world_size;
  const int rank = job.rank;
  // ---- the device mesh: dp x tp x pp = world, checked before anything else ----
  const MeshShape shape = resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, world);
  if (!builtin) check_task_supports(cfg, shape, *task);
  check_layout(cfg, shape);
  const int dp = shape.dp;
  const int dp_rank = mesh_coord(rank, shape).dp;
  set_threads(cfg, job);
  // ---- the device: this rank's GPU becomes current (cuda: the local rank's) ----
  const DeviceSpec device = place_training(cfg, job);
  const std::string backend = backend_on(cfg, device);
  // --trace DIR: created (InputError when it cannot be) and recording from here; a failed run
  // still writes this rank's file (TraceSession's destructor).
  std::optional<monitor::TraceSession> tracing;
  if (!cfg.trace_dir.empty()) {
    tracing.emplace(cfg.trace_dir, rank);
    trace::set_thread_name("train");
  }
  NullBuffer null_buf;
  std::ostream null_log(&null_buf);
  std::ostream& log = rank == 0 ? log_out : null_log;

  // ---- everything that can be wrong with the input is checked before any file is written ----
  task->setup(TaskLayout{micro_batch, cfg.grad_accum, dp, dp_rank, cfg.seed});
  if (!builtin) check_trainable(*task);
  nn::Module& model = task->module();
  if (cfg.steps == 0 && task->steps_per_epoch() <= 0)
    PT_THROW(InputError, "TrainConfig::steps is 0 and task '", task->name(),
             "' does not know how many steps make an epoch (Task::steps_per_epoch() is 0); set steps");
  const int64_t steps = cfg.steps > 0 ? cfg.steps
                                      : std::max<int64_t>(1, static_cast<int64_t>(std::llround(
                                                                 (cfg.epochs > 0 ? cfg.epochs : 1.0) *
                                                                 static_cast<double>(task->steps_per_epoch()))));
  const optim::LRSchedule sched = lr_schedule_for(cfg, *task, steps);
  const double lr = sched.lr;

  // ---- resume: the whole checkpoint is verified and read before anything is applied ----
  const nlohmann::json this_run = run_config(cfg, task->name(), micro_batch, shape, steps, lr);
  // A group restarted by `paratrain launch --max-restarts` (TORCHELASTIC_RESTART_COUNT > 0)
  // resumes from its checkpoints without being told (issue: launcher restarts).
  const int64_t restart_count = env::raw_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  const bool looked_for_checkpoint = cfg.resume || (restart_count > 0 && !cfg.checkpoint_dir.empty());
  const int64_t kill_in_save = test_kill_in_save_step(rank, restart_count);
  std::optional<checkpoint::TrainingState> resumed;
  if (looked_for_checkpoint) resumed = find_resume_state(cfg, this_run, steps, world, restart_count, log);
  if (resumed)
    model.load_state_dict(resumed->model, true);
  else if (!cfg.init_from.empty())
    model.load_state_dict(checkpoint::load_safetensors(cfg.init_from), true, "transformer.");
  const int64_t start_step = resumed ? resumed->step : 0;
  // The whole (initialised or loaded) model moves to the GPU before anything is cut, wrapped
  // or given an optimizer: every later tensor of the run follows its parameters' device.
  if (device.kind != Device::CPU) model.to(device);
  PT_LOG_DEBUG(kTrain, "rank ", rank, " of ", world, " (", shape.str(), "): steps ", start_step, " to ", steps,
               resumed ? " (resumed)" : "", ", micro-batch ", micro_batch, " x grad-accum ", cfg.grad_accum);
  // Where this call stops: the last step, or stop_at_step (a run in sessions).
  const int64_t end_step =
      std::max(start_step, cfg.stop_at_step > 0 ? std::min<int64_t>(cfg.stop_at_step, steps) : steps);

  // ---- the mesh's groups; tensor parallelism cuts the (whole, initialised or loaded) model,
  // then DDP runs over the data-parallel group ----
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  if (world > 1) {
    comm::ProcessGroupOptions po;
    po.backend = backend;
    po.deterministic = cfg.deterministic;
    pg = comm::create_process_group_from_env(po);
    if (looked_for_checkpoint) check_ranks_start_at_the_same_step(*pg, start_step, cfg.checkpoint_dir);
    if (!builtin) check_tasks_agree(*pg, *task);
  }
  const DeviceMesh mesh(pg, shape);
  // Training FLOPs per item, from the whole model (before tensor or pipeline parallelism cut it).
  const double flops_per_item = task->flops_per_item() > 0
                                    ? task->flops_per_item()
                                    : 6.0 * static_cast<double>(model.num_parameters()) /
                                          static_cast<double>(std::max<int64_t>(1, task->items_per_example()));
  // Tensor parallelism cuts the model, pipeline parallelism keeps this rank's stages, then
  // DDP / ZeRO wrap it over the data-parallel group (which checks that every rank holds the
  // same parameters: InputError on every rank otherwise).
  ParallelModel pm(cfg, *task, mesh, lr, micro_batch);
  const TensorParallelPlan& plan = pm.plan();
  FullyShardedDataParallel* const fsdp = pm.fsdp();
  optim::Optimizer& opt = pm.optimizer();
  const optim::NamedParams& opt_params = pm.optimizer_params();
  // Mixed precision (docs/amp.md): the forward under autocast with the parameters' half
  // copies made once per step; the loss scaler's skip decision is agreed by every rank.
  const DType compute_dtype = amp::parse_precision(cfg.precision);
  amp::LossScalerOptions scaler_options = cfg.loss_scale.empty() ? amp::default_loss_scale(compute_dtype)
                                                                  : amp::LossScalerOptions::parse(cfg.loss_scale);
  scaler_options.growth_interval = cfg.loss_scale_growth_interval;
  amp::MixedPrecision mp(compute_dtype, scaler_options);
  // ZeRO 3 keeps no copy of the whole model across steps: each forward casts what it uses.
  autograd::WeightCastCache* const half_copies = fsdp ? nullptr : mp.half_copies();
  const int64_t inject_inf_step = test_inject_inf_step(rank);
  const int64_t stop_at_step = test_stop_at_step(rank, restart_count);
  if (resumed) apply_resumed_state(*resumed, pm, *task, mp);
  // PARATRAIN_TEST_KILL_IN_SAVE: this rank dies in the save of step kill_in_save, after its
  // files and before the manifest, leaving an incomplete checkpoint (test hook).
  auto die_if_told = [&](int64_t done) {
    if (done != kill_in_save) return;
    PT_LOG_WARN(kTrain, "PARATRAIN_TEST_KILL_IN_SAVE: killing this rank while it saves ",
                checkpoint::checkpoint_name(done), " (before the manifest)");
    std::raise(SIGKILL);
  };
  CheckpointSaver saver(cfg, *task, pm, mesh, mp, this_run, die_if_told);
  monitor::MetricsWriter metrics(rank == 0 ? cfg.metrics : std::string());

  // Items (tokens or images) of one optimizer step over all ranks.
  const int64_t items_per_step = task->items_per_example() * micro_batch * cfg.grad_accum * dp;
  log_run_header(log, cfg, *task, pm, mesh, steps, micro_batch);
  // What every metrics line carries; the memory per rank is gathered after the first step
  // (constant from then on). Every rank measures its hardware peak when rank 0 does, so their
  // timings stay comparable.
  RunFigures run;
  // On a GPU the peak is its measured bf16 GEMM rate (also for the progress line's MFU).
  run.peak_flops = device.kind == Device::CUDA ? monitor::gpu_bf16_peak_flops(device.index)
                   : !cfg.metrics.empty()      ? monitor::hardware_peak_flops()
                                               : 0.0;
  run.device = device.str();
  run.items_per_step = items_per_step;
  run.micro_batch = micro_batch;
  run.flops_per_item = flops_per_item;
  run.compute_dtype = compute_dtype;
  Allocator& alloc = memory_of(device);  // the GPU's figures on a GPU (torch.cuda.memory_allocated's)
  alloc.reset_peak();
  TrainResult result;
  result.steps = steps;
  result.start_step = start_step;
  const auto t_start = Clock::now();
  double timed_seconds = 0;
  int64_t timed_items = 0;
  const float base_seed = pm.backward_seed(cfg.grad_accum);
  Tensor accum_seed = Tensor::full({}, base_seed).to(device);

  // Micro-batch sizes per rank (even unless --balance auto moves items to faster ranks), and
  // the background loader that prepares the next step's batches during this one.
  LoadBalancer balancer(dp, micro_batch, cfg.balance == "auto");
  if (cfg.balance == "auto" && world == 1) log << "--balance auto: one rank, nothing to balance\n";
  const double slowdown = simulated_slowdown(rank);
  if (slowdown > 1.0)
    PT_LOG_WARN(kTrain, "PARATRAIN_SIMULATE_SLOWDOWN makes this rank ", slowdown, "x slower");
  data::BatchPrefetcher prefetcher(
      [&task](const data::BatchRequest& r, Tensor& x, Tensor& y) { task->fill(r, x, y); });
  auto request = [&](int64_t s, int64_t k) {
    return data::BatchRequest{s, k, balancer.first(dp_rank, s), balancer.count(dp_rank, s)};
  };
  auto announce = [&](int64_t s) {
    if (s < end_step)
      for (int64_t k = 0; k < cfg.grad_accum; ++k) prefetcher.enqueue(request(s, k));
  };
  announce(start_step);
  // The step as a schedule over the micro-batches: one after the other, or a pipeline's.
  MicroBatches batches{[&](int64_t s, int64_t k) -> const data::Batch& { return prefetcher.next(request(s, k)); },
                       announce};
  std::unique_ptr<StepSchedule> schedule;
  if (pm.pipelined()) {
    const pipeline::ScheduleSpec spec{pipeline::parse_schedule(cfg.pp_schedule), shape.pp,
                                      static_cast<int>(cfg.grad_accum), pipeline_virtual_chunks(cfg)};
    schedule = std::make_unique<PipelineStep>(*task->gpt(), pm, mesh, batches, spec, compute_dtype, half_copies,
                                              micro_batch, device);
  } else {
    schedule = std::make_unique<DataParallelStep>(*task, pm, batches, cfg.grad_accum, compute_dtype, half_copies, slowdown,
                                                  device);
  }

  monitor::ProgressLine progress(log, steps, &log == &std::cerr && monitor::stderr_is_terminal());
  auto run_eval = [&](int64_t step) {
    if (!task->has_eval()) return;
    trace::Span span("evaluation", "train");
    span.num("step", static_cast<double>(step));
    nlohmann::json e = {{"step", step}, {"eval", true}};
    {
      autograd::AutocastGuard autocast(compute_dtype, half_copies);
      // Collective (GPT): every rank takes part; the dp ranks share the batches, tp ranks compute
      // one replica together.
      Task::LossFn loss;
      if (schedule->pipelined())
        loss = [&](const Tensor& x, const Tensor& y) { return schedule->evaluation_loss(x, y); };
      else if (device.kind != Device::CPU)  // the evaluation batches go up to the model's GPU
        loss = [&](const Tensor& x, const Tensor& y) { return task->loss(x.to(device), y.to(device)); };
      task->evaluate(cfg.eval_batches, mesh.dp().get(), e, loss);
    }
    if (e.contains("val_loss")) result.val_loss = e["val_loss"];
    if (e.contains("accuracy")) result.accuracy = e["accuracy"];
    if (rank != 0) return;
    metrics.write(e);
    progress.finish();
    log << "eval step " << step << ":";
    if (e.contains("val_loss")) log << " val_loss " << std::to_string(result.val_loss);
    if (e.contains("accuracy")) log << " accuracy " << std::to_string(result.accuracy);
    log << "\n";
  };

  StepTraffic traffic(mesh);
  const double slow_rank_lag = env::get_double("PARATRAIN_SLOW_RANK_LAG");
  for (int64_t step = start_step; step < end_step; ++step) {
    if (step == stop_at_step) stop_this_rank(rank, step);  // test hook: a hung, live rank
    const auto t0 = Clock::now();
    traffic.begin();
    trace::Span step_span(trace::enabled() ? "step " + std::to_string(step + 1) : std::string(), "step", true);
    step_span.num("step", static_cast<double>(step + 1));
    const long faults_before = monitor::minor_page_faults();
    const uint64_t host_waits_before = cuda::host_waits();
    const double step_lr = sched.at(step);
    if (plan.size() > 1) plan.group()->take_stats();  // this step's tensor-parallel traffic from here
    opt.set_lr(step_lr);
    pm.zero_grad();
    const double weight = balancer.weight(dp_rank, step);  // 1 unless --balance gave this rank more or less
    const double loss_scale = mp.scaler().scale();  // the scale this step's gradients carry
    accum_seed.fill_(static_cast<float>(base_seed * weight * loss_scale));  // on the device, no wait
    const StepOutcome outcome = schedule->run(step, accum_seed);
    const double data_wait_s = prefetcher.take_wait_seconds();
    pm.finish();  // .grad = mean over every micro-batch of every rank (ZeRO: this rank's shard of it)
    if (step == inject_inf_step) inject_inf(opt_params, rank, step);
    // Loss scaling: the gradients are unscaled before clipping; a step with an inf/NaN on any
    // rank is skipped by all (the flag is reduced over the ranks that hold the gradients).
    const bool skipped = mp.scaler().enabled() && !mp.scaler().unscale_and_check(grads_of(opt_params), pg.get());
    double norm = std::numeric_limits<double>::quiet_NaN();
    if (skipped) {
      progress.finish();
      log << "step " << step + 1 << ": gradients hold inf/NaN at loss scale " << loss_scale << ": step skipped\n";
    } else {
      // The global norm: over the mesh with tensor or pipeline parallelism (tp shards summed,
      // replicated parameters once); over every rank's shard of the averaged gradient with
      // ZeRO; else the gradients are already averaged.
      trace::Span span("optimizer step", "train");
      norm = pm.grad_norm();
      pm.clip_and_step(cfg.grad_clip, norm);
    }
    const TpCommStats tp_stats = plan.size() > 1 ? plan.group()->take_stats() : TpCommStats{};
    const nlohmann::json step_traffic = traffic.end();
    if (!skipped) mp.parameters_changed();  // the half copies are refreshed at the next forward
    mp.scaler().update();
    if (step == start_step) gather_memory_between_steps(run, pm, pg.get());
    StepReport report;
    report.step = step, report.lr = step_lr, report.norm = norm, report.loss_scale = loss_scale;
    report.skipped = skipped, report.data_wait_s = data_wait_s, report.outcome = outcome, report.tp = tp_stats;
    report.traffic = step_traffic;
    report.step_s = seconds_since(t0);
    report.loss = outcome.loss_sum / static_cast<double>(cfg.grad_accum);
    gather_step_report(report, pg.get(), shape, weight, alloc.stats());
    report.page_faults = monitor::minor_page_faults() - faults_before;
    if (device.kind == Device::CUDA) report.host_waits = static_cast<int64_t>(cuda::host_waits() - host_waits_before);
    const double step_s = report.step_s, loss = report.loss;
    // The first two steps pay for first-touch of memory on every rank: not measured.
    if (pg && step > start_step + 1 && balancer.observe(step, report.compute_ms_per_rank)) {
      progress.finish();
      log_balance_change(log, step + 2, balancer.sizes_at(step + 2), report);
    }
    if (!std::isfinite(loss)) PT_THROW(Error, "training diverged: loss is ", loss, " at step ", step);
    if (step > start_step || steps - start_step == 1) {  // the first step pays for first-touch of memory
      timed_seconds += step_s;
      timed_items += items_per_step;
    }
    const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds
                                          : static_cast<double>(items_per_step) / step_s;
    result.last_loss = loss;
    result.losses.push_back(loss);
    if (on_step) on_step(StepInfo{step + 1, steps, loss, step_lr, norm, skipped});
    if (metrics.enabled()) {
      const std::vector<int64_t> sizes = balancer.sizes_at(step);
      metrics.write(metrics_line(report, cfg, pm, mesh, *task, mp, run, balancer.enabled() ? &sizes : nullptr));
    }
    if (!cfg.quiet) {
      ProgressFigures f;
      f.steps = steps;
      f.rate = rate;
      f.counts_tokens = task->counts_tokens();
      f.eta_s = (end_step - step - 1) *
                (timed_seconds > 0 ? timed_seconds / std::max<int64_t>(step - start_step, 1) : step_s);
      if (device.kind == Device::CUDA && run.peak_flops > 0)  // over every rank's GPU
        f.mfu = rate * flops_per_item / (run.peak_flops * world);
      f.loss_scaling = mp.scaler().enabled();
      f.slow_rank_lag = slow_rank_lag;
      progress.update(step, step_progress_text(report, f, cfg, pm));
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) || step + 1 == end_step))
      saver.save(step + 1);
    if (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && step + 1 < end_step) run_eval(step + 1);
  }
  if (!cfg.checkpoint_dir.empty() && start_step == end_step) saver.save(end_step);  // resumed at the end
  progress.finish();
  run_eval(end_step);
  const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds : 0.0;
  (task->counts_tokens() ? result.tokens_per_s : result.samples_per_s) = rate;
  result.peak_bytes = alloc.stats().peak_bytes_in_use;
  log << "done: " << end_step - start_step << " steps in " << monitor::format_duration(seconds_since(t_start)) << ", "
      << std::setprecision(0) << std::fixed << rate << (task->counts_tokens() ? " tokens/s" : " samples/s")
      << ", peak memory " << std::setprecision(1) << static_cast<double>(result.peak_bytes) / (1 << 20) << " MiB"
      << (world > 1 ? " (rank 0)" : "") << "\n";
  if (autograd::profiler::enabled()) log << autograd::profiler::report();
  if (!cfg.save_final.empty()) save_final_weights(cfg, pm, *task, rank, log);
  if (tracing) tracing->finish(pg.get());  // collective: rank 0 gathers DIR/trace.json
  return result;
}

}  // namespace

TrainResult train(const TrainConfig& cfg, std::ostream& log) {
  validate_config(cfg);
  validate_builtin_model(cfg);
  const comm::JobEnv job = comm::read_job_env();
  // ---- the device mesh and the layout, checked before any file is read ----
  const MeshShape shape = resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, job.world_size);
  if (shape.pp > 1 && !is_gpt_model(cfg.model))
    PT_THROW(InputError, "--pp ", shape.pp, ": pipeline parallelism cuts the GPT models' blocks, not --model ", cfg.model);
  if (shape.tp > 1 && !is_gpt_model(cfg.model))
    PT_THROW(InputError, "--tp ", shape.tp, ": tensor parallelism is built for the GPT models, not --model ", cfg.model);
  check_layout(cfg, shape);
  set_threads(cfg, job);
  const int64_t micro_batch = cfg.micro_batch > 0 ? cfg.micro_batch : (is_gpt_model(cfg.model) ? 8 : 64);
  std::unique_ptr<Task> task = make_builtin_task(cfg, micro_batch, shape.dp, shape.tp);
  return run_training(cfg, *task, micro_batch, true, log, {});
}

TrainResult train(const TrainConfig& cfg, Task& task, std::ostream& log, const StepCallback& on_step) {
  validate_config(cfg);
  refuse_builtin_fields(cfg);
  return run_training(cfg, task, cfg.micro_batch > 0 ? cfg.micro_batch : 32, false, log, on_step);
}

}  // namespace paratrain::train
