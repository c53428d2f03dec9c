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

#include "checkpoint_saver.h"
#include "config_check.h"
#include "data_parallel_step.h"
#include "parallel_model.h"
#include "pipeline_step.h"
#include "run_record.h"
#include "test_hooks.h"
#include "paratrain/amp/mixed_precision.h"
#include "paratrain/autograd/autocast.h"
#include "paratrain/autograd/profiler.h"
#include "paratrain/base/env.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/training_state.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/data/prefetcher.h"
#include "paratrain/kernels/cpu.h"
#include "paratrain/monitor/metrics.h"
#include "paratrain/monitor/progress.h"
#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/grad_compression.h"
#include "paratrain/parallel/load_balancer.h"
#include "paratrain/parallel/mesh.h"
#include "paratrain/train/task.h"

namespace paratrain::train {

using namespace parallel;


namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

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
  if (!is_gpt_model(c.model))
    PT_THROW(InputError, "--pp ", pp, ": pipeline parallelism cuts the GPT models' blocks, not --model ", c.model);
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

}  // namespace

TrainResult train(const TrainConfig& cfg, std::ostream& log_out) {
  validate_config(cfg);
  const comm::JobEnv job = comm::read_job_env();
  const int world = job.world_size;
  const int rank = job.rank;
  // ---- the device mesh: dp x tp x pp = world, checked before anything else ----
  const MeshShape shape = resolve_mesh_shape(cfg.dp, cfg.tp, cfg.pp, world);
  if (shape.pp > 1) check_pipeline_config(cfg, shape.pp);
  if (shape.tp > 1 && !is_gpt_model(cfg.model))
    PT_THROW(InputError, "--tp ", shape.tp, ": tensor parallelism is built for the GPT models, not --model ", cfg.model);
  if (cfg.sequence_parallel && shape.tp == 1) PT_THROW(InputError, "--sequence-parallel needs --tp 2 or more");
  if (shape.tp > 1 && cfg.balance == "auto")
    PT_THROW(InputError, "--balance auto cannot be combined with --tp ", shape.tp,
             " (the ranks of a tensor-parallel group share every micro-batch)");
  const int dp = shape.dp;
  const int dp_rank = mesh_coord(rank, shape).dp;
  kernels::cpu::set_num_threads(cfg.threads > 0 ? cfg.threads : default_threads(job));
  const bool gpt = is_gpt_model(cfg.model);
  const int64_t micro_batch = cfg.micro_batch > 0 ? cfg.micro_batch : (gpt ? 8 : 64);
  NullBuffer null_buf;
  std::ostream null_log(&null_buf);
  std::ostream& log = rank == 0 ? log_out : null_log;

  // ---- everything that can be wrong with the input is checked before any file is written ----
  std::unique_ptr<Task> task = make_builtin_task(cfg, micro_batch, dp, shape.tp);
  nn::Module& model = task->module();
  const int64_t steps = cfg.steps > 0 ? cfg.steps
                                      : std::max<int64_t>(1, static_cast<int64_t>(std::llround(
                                                                 (cfg.epochs > 0 ? cfg.epochs : 1.0) *
                                                                 static_cast<double>(task->steps_per_epoch()))));
  const double lr = cfg.lr >= 0 ? cfg.lr : (cfg.optimizer == "sgd" ? 0.05 : (gpt ? 6e-4 : 1e-3));
  optim::LRSchedule sched;
  sched.kind = optim::LRSchedule::parse(cfg.lr_schedule);
  sched.lr = lr;
  sched.min_lr = cfg.min_lr >= 0 ? cfg.min_lr : lr / 10;
  sched.warmup = cfg.warmup_steps;
  sched.total = steps;

  // ---- resume: the whole checkpoint is verified and read before anything is applied ----
  const nlohmann::json this_run = run_config(cfg, micro_batch, shape, steps, lr);
  std::optional<checkpoint::TrainingState> resumed;
  // A group restarted by `paratrain launch --max-restarts` (TORCHELASTIC_RESTART_COUNT > 0)
  // resumes from its checkpoints without being told (issue: launcher restarts).
  const int64_t restart_count = env::raw_int("TORCHELASTIC_RESTART_COUNT").value_or(0);
  const bool looked_for_checkpoint = cfg.resume || (restart_count > 0 && !cfg.checkpoint_dir.empty());
  const int64_t kill_in_save = test_kill_in_save_step(rank, restart_count);
  if (looked_for_checkpoint) {
    if (!cfg.resume) log << "restart " << restart_count << " of the group: resuming from " << cfg.checkpoint_dir << "\n";
    const checkpoint::ResumePoint point = checkpoint::find_resume_point(cfg.checkpoint_dir);
    if (!point.ignored.empty()) log << ignored_checkpoints_warning(point) << "\n";
    if (const auto& ckpt = point.checkpoint) {
      resumed = checkpoint::load_training_state(*ckpt);
      check_resume_config(*ckpt, resumed->config, this_run);
      if (resumed->step > steps)
        PT_THROW(InputError, "cannot resume from ", *ckpt, ": it is at step ", resumed->step, ", beyond --steps ", steps);
      log << "resuming from " << *ckpt << " (step " << resumed->step << " of " << steps << ")";
      if (resumed->world_size != world) log << ", saved by " << resumed->world_size << " ranks, now " << world;
      if (!resumed->optimizer_shards.empty())
        log << ", optimizer state from " << resumed->optimizer_shards.size() << " shard(s)"
            << (cfg.zero > 0 ? (resumed->optimizer_shards.size() != static_cast<size_t>(world) ? ", re-cut" : "")
                             : ", assembled");
      log << "\n";
    } else if (point.ignored.empty()) {
      log << "no checkpoint in " << cfg.checkpoint_dir << ": starting from step 0\n";
    }
  }
  if (resumed)
    model.load_state_dict(resumed->model, true);
  else if (!cfg.init_from.empty())
    model.load_state_dict(checkpoint::load_safetensors(cfg.init_from), true, "transformer.");
  const int64_t start_step = resumed ? resumed->step : 0;

  // ---- the mesh's groups; tensor parallelism cuts the (whole, initialised or loaded) model,
  // then DDP runs over the data-parallel group ----
  std::shared_ptr<comm::ProcessGroup> pg;  // the world
  if (world > 1) {
    comm::ProcessGroupOptions po;
    po.backend = cfg.backend;
    po.deterministic = cfg.deterministic;
    pg = comm::create_process_group_from_env(po);
    if (looked_for_checkpoint) check_ranks_start_at_the_same_step(*pg, start_step, cfg.checkpoint_dir);
  }
  const DeviceMesh mesh(pg, shape);
  // Tensor parallelism cuts the model, pipeline parallelism keeps this rank's stages, then
  // DDP / ZeRO wrap it over the data-parallel group.
  ParallelModel pm(cfg, *task, mesh, lr, micro_batch);
  const TensorParallelPlan& plan = pm.plan();
  DistributedDataParallel* const ddp = pm.ddp();
  FullyShardedDataParallel* const fsdp = pm.fsdp();
  ZeroOptimizer* const zero = pm.zero();
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
  // Per rank, gathered after the first step (constant from then on): optimizer state bytes
  // and the gradient buffers held between steps.
  std::vector<int64_t> mem_optimizer_per_rank, mem_grad_per_rank, mem_param_per_rank;
  if (resumed) {
    // The checkpoint holds the whole state (any layout saved it); this rank's tensor-parallel
    // part of it, then (ZeRO) its pieces of that.
    // Pipeline stages take the state of their own parameters.
    auto optimizer_state = plan.cut_local(resumed->optimizer);
    if (pm.pipelined()) optimizer_state = state_of(optimizer_state, pm.params());
    if (zero)
      zero->load_state(optimizer_state, resumed->optimizer_steps);  // this rank's pieces, re-cut
    else
      opt.load_state_dict(optimizer_state, resumed->optimizer_steps);
    if (Generator* gen = task->generator(); gen && resumed->rng) gen->set_state(*resumed->rng);
    if (mp.scaler().enabled()) mp.scaler().load_state(resumed->loss_scale, resumed->loss_scale_growth_tracker);
    resumed->model.clear();
    resumed->optimizer.clear();
  }
  // PARATRAIN_TEST_KILL_IN_SAVE: this rank dies in the save of step kill_in_save, after its
  // files and before the manifest, leaving an incomplete checkpoint (test hook).
  auto die_if_told = [&](int64_t done) {
    if (done != kill_in_save) return;
    std::cerr << "rank " << rank << ": PARATRAIN_TEST_KILL_IN_SAVE: killing this rank while it saves "
              << checkpoint::checkpoint_name(done) << " (before the manifest)" << std::endl;
    std::raise(SIGKILL);
  };
  CheckpointSaver saver(cfg, *task, pm, mesh, mp, this_run, die_if_told);
  monitor::MetricsWriter metrics(rank == 0 ? cfg.metrics : std::string());

  // Items (tokens or images) of one optimizer step over all ranks.
  const int64_t items_per_step = task->items_per_micro_batch() * cfg.grad_accum * dp;
  log << "paratrain train: " << cfg.model << ", " << model.num_parameters() << " parameters"
      << (plan.size() > 1 || pm.pipelined() ? " on this rank" : "") << ", " << steps << " steps, global batch " << micro_batch << " x "
      << cfg.grad_accum << " x " << dp << " = " << micro_batch * cfg.grad_accum * dp << (gpt ? " sequences" : " images")
      << ", " << kernels::cpu::num_threads() << " threads" << (world > 1 ? " per rank" : "");
  if (pg)
    log << ", " << world << " ranks (" << pg->backend_name() << (cfg.deterministic ? ", deterministic" : "") << ")"
        << ", layout " << shape.str() << (cfg.sequence_parallel ? ", sequence parallel" : "");
  if (cfg.recompute != "none") log << ", recompute " << cfg.recompute;
  log << "\n";
  if (pm.pipelined())
    log << "pipeline: " << cfg.pp_schedule << ", " << pm.all_stages().size() << " stages, "
        << pipeline::describe_stages(pm.all_stages()) << " (cut by "
        << (cfg.pp_balance == "time" ? "measured time" : "parameter count") << "), " << cfg.grad_accum
        << " micro-batches per step\n";
  if (zero) {
    const ZeroMemory zm = zero->memory();
    const auto mib = [](int64_t b) {
      std::ostringstream o;
      o << std::fixed << std::setprecision(2) << static_cast<double>(b) / (1 << 20);
      return o.str();
    };
    if (fsdp) {
      const FsdpMemory fm = fsdp->memory();
      log << "zero 3: per rank, parameters " << mib(fm.parameter_shard_bytes) << " MiB (unsharded "
          << mib(fm.parameter_bytes) << " MiB), gradient shard " << mib(fm.gradient_shard_bytes) << " MiB, optimizer state "
          << mib(zm.optimizer_bytes) << " MiB (unsharded " << mib(zm.optimizer_unsharded_bytes) << " MiB); "
          << fsdp->num_units() << " units gathered one at a time (largest " << mib(fm.largest_unit_bytes) << " MiB)"
          << (cfg.zero3_reshard_after_forward ? "" : ", kept from forward to backward") << "\n";
    } else
    log << "zero " << cfg.zero << ": per rank, optimizer state " << mib(zm.optimizer_bytes) << " MiB (unsharded "
        << mib(zm.optimizer_unsharded_bytes) << " MiB), gradient shard " << mib(zm.gradient_shard_bytes) << " MiB"
        << (cfg.zero == 2 ? "; the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB) are held only from zero_grad to the reduce-scatter"
                          : " next to the full gradient buckets (" + mib(zm.gradient_bytes - zm.gradient_shard_bytes) +
                                " MiB)")
        << "\n";
  }
  if (cfg.compress != "none")
    log << (!mesh.dp() ? "--compress " + cfg.compress + ": one data-parallel rank, nothing to send"
            : fsdp     ? "--compress " + cfg.compress + " with --zero 3: parameters all-gathered and gradients "
                         "reduce-scattered in " + cfg.compress + " (half the bytes; shards and optimizer stay f32)"
                       : compress_summary(model, ddp->options().compress))
        << "\n";

  // Every rank measures its hardware peak when rank 0 does, so their timings stay comparable.
  const double peak_flops = !cfg.metrics.empty() ? monitor::hardware_peak_flops() : 0.0;
  Allocator& alloc = allocator_for(Device::CPU);
  alloc.reset_peak();
  TrainResult result;
  result.steps = steps;
  const auto t_start = Clock::now();
  double timed_seconds = 0;
  int64_t timed_items = 0;
  const float base_seed = pm.backward_seed(cfg.grad_accum);
  Tensor accum_seed = Tensor::full({}, base_seed);
  // Per rank: weighted loss, step ms, compute ms, data-wait ms, pipeline busy ms, pipeline wall ms.
  constexpr int kGathered = 6;
  std::vector<float> gathered_f(kGathered * static_cast<size_t>(world));

  // Micro-batch sizes per rank (even unless --balance auto moves items to faster ranks), and
  // the background loader that prepares the next step's batches during this one.
  LoadBalancer balancer(dp, micro_batch, cfg.balance == "auto");
  if (cfg.balance == "auto" && world == 1) log << "--balance auto: one rank, nothing to balance\n";
  const double slowdown = simulated_slowdown(rank);
  if (slowdown > 1.0)
    std::cerr << "rank " << rank << ": PARATRAIN_SIMULATE_SLOWDOWN makes this rank " << slowdown << "x slower\n";
  data::BatchPrefetcher prefetcher(
      [&task](const data::BatchRequest& r, Tensor& x, Tensor& y) { task->fill(r, x, y); });
  auto request = [&](int64_t s, int64_t k) {
    return data::BatchRequest{s, k, balancer.first(dp_rank, s), balancer.count(dp_rank, s)};
  };
  auto announce = [&](int64_t s) {
    if (s < steps)
      for (int64_t k = 0; k < cfg.grad_accum; ++k) prefetcher.enqueue(request(s, k));
  };
  announce(start_step);
  std::vector<int64_t> gathered_peak(2 * static_cast<size_t>(world));  // per rank: allocator peak, activations
  // The step as a schedule over the micro-batches: one after the other, or a pipeline's.
  MicroBatches batches{[&](int64_t s, int64_t k) -> const data::Batch& { return prefetcher.next(request(s, k)); },
                       announce};
  std::unique_ptr<StepSchedule> schedule;
  if (pm.pipelined()) {
    const pipeline::ScheduleSpec spec{pipeline::parse_schedule(cfg.pp_schedule), shape.pp,
                                      static_cast<int>(cfg.grad_accum), pipeline_virtual_chunks(cfg)};
    schedule = std::make_unique<PipelineStep>(*task->gpt(), pm, mesh, batches, spec, compute_dtype, half_copies,
                                              micro_batch);
  } else {
    schedule = std::make_unique<DataParallelStep>(*task, pm, batches, cfg.grad_accum, compute_dtype, half_copies, slowdown);
  }

  monitor::ProgressLine progress(log, steps, &log == &std::cerr && monitor::stderr_is_terminal());
  auto run_eval = [&](int64_t step) {
    if (!task->has_eval()) return;
    nlohmann::json e = {{"step", step}, {"eval", true}};
    {
      autograd::AutocastGuard autocast(compute_dtype, half_copies);
      // Collective (GPT): every rank takes part; the dp ranks share the batches, tp ranks compute
      // one replica together.
      Task::LossFn loss;
      if (schedule->pipelined())
        loss = [&](const Tensor& x, const Tensor& y) { return schedule->evaluation_loss(x, y); };
      task->evaluate(cfg.eval_batches, gpt ? mesh.dp().get() : pg.get(), e, loss);
    }
    if (rank != 0) return;
    if (e.contains("val_loss")) result.val_loss = e["val_loss"];
    if (e.contains("accuracy")) result.accuracy = e["accuracy"];
    metrics.write(e);
    progress.finish();
    log << "eval step " << step << ": "
        << (e.contains("val_loss") ? "val_loss " + std::to_string(result.val_loss)
                                   : "accuracy " + std::to_string(result.accuracy))
        << "\n";
  };

  for (int64_t step = start_step; step < steps; ++step) {
    const auto t0 = Clock::now();
    const long faults_before = monitor::minor_page_faults();
    const double step_lr = sched.at(step);
    if (plan.size() > 1) plan.group()->take_stats();  // this step's tensor-parallel traffic from here
    opt.set_lr(step_lr);
    pm.zero_grad();
    const double weight = balancer.weight(dp_rank, step);  // 1 unless --balance gave this rank more or less
    const double loss_scale = mp.scaler().scale();  // the scale this step's gradients carry
    accum_seed.data<float>()[0] = static_cast<float>(base_seed * weight * loss_scale);
    const StepOutcome outcome = schedule->run(step, accum_seed);
    const double loss_sum = outcome.loss_sum;
    const int64_t activation_bytes = outcome.activation_bytes;  // the most the forwards left for backward
    const double compute_s = outcome.compute_s;  // everything but waiting for the last buckets
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
      norm = pm.grad_norm();
      pm.clip_and_step(cfg.grad_clip, norm);
    }
    const TpCommStats tp_stats = plan.size() > 1 ? plan.group()->take_stats() : TpCommStats{};
    if (!skipped) mp.parameters_changed();  // the half copies are refreshed at the next forward
    mp.scaler().update();
    if (step == start_step) {  // memory per rank, as it stays between steps
      int64_t mine[3];  // optimizer state, gradients, parameters
      pm.memory_between_steps(mine);
      std::vector<int64_t> all(mine, mine + 3);
      if (pg) {
        all.resize(3 * static_cast<size_t>(world));
        pg->allgather(mine, all.data(), 3, DType::I64)->wait();
      }
      for (int r = 0; r < world; ++r) {
        mem_optimizer_per_rank.push_back(all[3 * r]);
        mem_grad_per_rank.push_back(all[3 * r + 1]);
        mem_param_per_rank.push_back(all[3 * r + 2]);
      }
    }
    double step_s = seconds_since(t0);
    double loss = loss_sum / static_cast<double>(cfg.grad_accum);
    std::vector<double> step_ms_per_rank = {step_s * 1e3};
    std::vector<int64_t> peak_per_rank = {alloc.stats().peak_bytes_in_use};
    std::vector<int64_t> activation_per_rank = {activation_bytes};
    std::vector<int64_t> micro_batch_per_rank = balancer.sizes_at(step);
    std::vector<double> compute_ms_per_rank = {compute_s * 1e3};
    // Pipeline: the share of the stages' schedule time they spent waiting (the bubble).
    double bubble_fraction = outcome.bubble_fraction;
    std::vector<double> busy_ms_per_rank = {outcome.busy_ms};  // pipeline: each rank's compute actions
    if (pg) {
      // The reported loss is the mean over the global batch (each rank's mean weighted by its
      // share); step times, compute times and peaks are gathered per rank.
      // Only the ranks holding the last pipeline stage computed a loss.
      const float mine[kGathered] = {outcome.computes_loss ? static_cast<float>(loss * weight) : 0.0f,
                                     static_cast<float>(step_s * 1e3),
                                     static_cast<float>(compute_s * 1e3),
                                     static_cast<float>(data_wait_s * 1e3),
                                     static_cast<float>(outcome.busy_ms),
                                     static_cast<float>(outcome.wall_ms)};
      auto w1 = pg->allgather(mine, gathered_f.data(), kGathered, DType::F32);
      const int64_t mine_bytes[2] = {peak_per_rank[0], activation_bytes};
      auto w2 = pg->allgather(mine_bytes, gathered_peak.data(), 2, DType::I64);
      w1->wait();
      w2->wait();
      double sum = 0, busy = 0, wall = 0;
      busy_ms_per_rank.clear();
      step_ms_per_rank.clear();
      compute_ms_per_rank.clear();
      for (int r = 0; r < world; ++r) {
        sum += gathered_f[kGathered * r];
        step_ms_per_rank.push_back(gathered_f[kGathered * r + 1]);
        compute_ms_per_rank.push_back(gathered_f[kGathered * r + 2]);
        busy += gathered_f[kGathered * r + 4];
        busy_ms_per_rank.push_back(gathered_f[kGathered * r + 4]);
        wall += gathered_f[kGathered * r + 5];
      }
      loss = sum / (world / shape.pp);
      if (pm.pipelined()) bubble_fraction = wall > 0 ? 1.0 - busy / wall : 0.0;
      peak_per_rank.clear(), activation_per_rank.clear();
      for (int r = 0; r < world; ++r) {
        peak_per_rank.push_back(gathered_peak[2 * r]);
        activation_per_rank.push_back(gathered_peak[2 * r + 1]);
      }
      // The first two steps pay for first-touch of memory on every rank: not measured.
      if (step > start_step + 1 && balancer.observe(step, compute_ms_per_rank)) {
        const auto& next = balancer.sizes_at(step + 2);
        progress.finish();
        log << "balance: from step " << step + 3 << " micro-batches per rank [";
        for (int r = 0; r < world; ++r) log << (r ? ", " : "") << next[r];
        log << "] (measured compute ms per rank last step [";
        for (int r = 0; r < world; ++r) log << (r ? ", " : "") << std::lround(compute_ms_per_rank[r]);
        log << "])\n";
      }
    }
    if (!std::isfinite(loss)) PT_THROW(Error, "training diverged: loss is ", loss, " at step ", step);
    if (step > start_step || steps - start_step == 1) {  // the first step pays for first-touch of memory
      timed_seconds += step_s;
      timed_items += items_per_step;
    }
    const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds
                                          : static_cast<double>(items_per_step) / step_s;
    result.last_loss = loss;
    if (metrics.enabled()) {
      const FsdpStepStats z3 = fsdp ? fsdp->last_stats() : FsdpStepStats{};
      const double comm_ms = ddp ? ddp->last_stats().comm_ms : z3.gather_ms + z3.reduce_scatter_ms;
      const double exposed_ms =
          ddp ? ddp->last_stats().exposed_comm_ms : z3.gather_exposed_ms + z3.reduce_scatter_exposed_ms;
      nlohmann::json m = {{"step", step},
                          {"loss", loss},
                          {"lr", step_lr},
                          {"grad_norm", norm},
                          {"step_ms", step_s * 1e3},
                          {"compute_ms", step_s * 1e3 - exposed_ms},
                          {"comm_ms", comm_ms},
                          {"exposed_comm_ms", exposed_ms},
                          {"mfu", peak_flops > 0 ? task->flops_per_item() * items_per_step / step_s /
                                                       (peak_flops * world)
                                                 : 0.0},
                          {"peak_flops", peak_flops * world},
                          {"page_faults", monitor::minor_page_faults() - faults_before},
                          {"loss_scale", loss_scale},
                          {"skipped", skipped},
                          {"mem_peak_bytes", peak_per_rank},
                          {"step_ms_per_rank", step_ms_per_rank},
                          {"compute_ms_per_rank", compute_ms_per_rank},
                          {"data_wait_ms", data_wait_s * 1e3}};
      if (pg) m["world_size"] = world;
      m["mem_optimizer_bytes"] = mem_optimizer_per_rank;
      m["mem_grad_bytes"] = mem_grad_per_rank;
      m["mem_param_bytes"] = mem_param_per_rank;
      if (zero) m["zero"] = cfg.zero;
      if (mp.half()) m["precision"] = amp::precision_name(compute_dtype), m["mem_half_copy_bytes"] = mp.half_copy_bytes();
      m["mem_activation_bytes"] = activation_bytes;
      m["mem_activation_bytes_per_rank"] = activation_per_rank;
      if (cfg.recompute != "none") m["recompute"] = cfg.recompute;
      if (ddp && mesh.dp())
        m["comm_bytes"] = ddp->last_stats().bytes, m["comm_bytes_uncompressed"] = ddp->last_stats().bytes_uncompressed;
      if (fsdp && mesh.dp()) {
        m["comm_bytes"] = z3.gather_bytes + z3.reduce_scatter_bytes;
        m["zero3"] = {{"gather_ms", z3.gather_ms},
                      {"gather_exposed_ms", z3.gather_exposed_ms},
                      {"reduce_scatter_ms", z3.reduce_scatter_ms},
                      {"reduce_scatter_exposed_ms", z3.reduce_scatter_exposed_ms},
                      {"gather_hidden_ms", std::max(0.0, z3.gather_ms - z3.gather_exposed_ms)},
                      {"reduce_scatter_hidden_ms", std::max(0.0, z3.reduce_scatter_ms - z3.reduce_scatter_exposed_ms)},
                      {"gathers", z3.gathers},
                      {"gather_bytes", z3.gather_bytes},
                      {"reduce_scatter_bytes", z3.reduce_scatter_bytes},
                      {"peak_gathered_units", z3.peak_gathered_units},
                      {"peak_gathered_bytes", z3.peak_gathered_bytes}};
      }
      m["layout"] = {{"dp", shape.dp}, {"tp", shape.tp}, {"pp", shape.pp}};
      // What `paratrain plan --check` needs to rebuild the run's memory estimate.
      m["micro_batch"] = micro_batch;
      m["grad_accum"] = cfg.grad_accum;
      m["bucket_mb"] = cfg.bucket_mb;
      if (const nn::GPT* g = task->gpt()) {
        const nn::GPTConfig& gc = g->config();
        m["model"] = {{"name", cfg.model},           {"n_layer", gc.n_layer},       {"n_head", gc.n_head},
                      {"n_embd", gc.n_embd},         {"block_size", gc.block_size}, {"vocab_size", gc.vocab_size},
                      {"dropout", gc.dropout}};
      }
      if (cfg.zero == 3) m["zero3_prefetch"] = cfg.zero3_prefetch;
      if (plan.size() > 1) {
        m["tp_comm_ms"] = tp_stats.ms;
        m["tp_comm_bytes"] = tp_stats.bytes;
        m["tp_comm_calls"] = tp_stats.calls;
        if (cfg.sequence_parallel) m["sequence_parallel"] = true;
      }
      if (pm.pipelined()) {
        m["bubble_fraction"] = bubble_fraction;
        m["pp_schedule"] = cfg.pp_schedule;
        m["pp_virtual"] = pipeline_virtual_chunks(cfg);
        m["pp_p2p_ms"] = outcome.p2p_ms;
        m["pp_p2p_bytes"] = outcome.p2p_bytes;
        m["pp_busy_ms_per_rank"] = busy_ms_per_rank;
      }
      if (balancer.enabled()) m["micro_batch_per_rank"] = micro_batch_per_rank;
      m[task->counts_tokens() ? "tokens_per_s" : "samples_per_s"] = static_cast<double>(items_per_step) / step_s;
      metrics.write(m);
    }
    if (!cfg.quiet) {
      const double eta = (steps - step - 1) * (timed_seconds > 0 ? timed_seconds / std::max<int64_t>(step - start_step, 1) : step_s);
      std::ostringstream line;
      line << "step " << step + 1 << "/" << steps << " | loss " << std::fixed << std::setprecision(4) << loss
           << " | lr " << std::scientific << std::setprecision(2) << step_lr << std::fixed << " | "
           << std::setprecision(0) << rate << (task->counts_tokens() ? " tok/s" : " samples/s") << " | ETA "
           << monitor::format_duration(eta);
      if (mp.scaler().enabled()) line << " | scale " << std::setprecision(0) << loss_scale << (skipped ? " (skipped)" : "");
      if (plan.size() > 1 || pm.pipelined()) line << " | " << shape.str();
      if (plan.size() > 1) line << ", tp comm " << std::setprecision(1) << tp_stats.ms << " ms";
      if (pm.pipelined()) line << ", " << cfg.pp_schedule << " bubble " << std::setprecision(2) << bubble_fraction;
      progress.update(step, line.str());
    }
    if (!cfg.checkpoint_dir.empty() &&
        ((cfg.checkpoint_every > 0 && (step + 1) % cfg.checkpoint_every == 0) || step + 1 == steps))
      saver.save(step + 1);
    if (cfg.eval_every > 0 && (step + 1) % cfg.eval_every == 0 && step + 1 < steps) run_eval(step + 1);
  }
  if (!cfg.checkpoint_dir.empty() && start_step == steps) saver.save(steps);  // resumed at the end
  progress.finish();
  run_eval(steps);
  const double rate = timed_seconds > 0 ? static_cast<double>(timed_items) / timed_seconds : 0.0;
  (task->counts_tokens() ? result.tokens_per_s : result.samples_per_s) = rate;
  result.peak_bytes = alloc.stats().peak_bytes_in_use;
  log << "done: " << steps - start_step << " steps in " << monitor::format_duration(seconds_since(t_start)) << ", "
      << std::setprecision(0) << std::fixed << rate << (task->counts_tokens() ? " tokens/s" : " samples/s")
      << ", peak memory " << std::setprecision(1) << static_cast<double>(result.peak_bytes) / (1 << 20) << " MiB"
      << (world > 1 ? " (rank 0)" : "") << "\n";
  if (autograd::profiler::enabled()) log << autograd::profiler::report();
  // The whole model with its Hugging Face names, whatever the layout (gathered over tp and pp:
  // every rank takes part).
  std::map<std::string, Tensor> weights;
  if (!cfg.save_final.empty()) weights = pm.whole_weights();
  if (!cfg.save_final.empty() && rank == 0) {
    if (cfg.save_dtype == "bf16")
      for (auto& [name, t] : weights) t = t.to(DType::BF16);
    checkpoint::save_safetensors(cfg.save_final, weights, task->metadata());
    log << "saved " << cfg.save_final << "\n";
  }
  return result;
}

}  // namespace paratrain::train
