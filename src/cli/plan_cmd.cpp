#include "plan_cmd.h"

#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli_util.h"
#include "paratrain/parallel/pipeline/schedule.h"
#include "paratrain/parallel/planner.h"

namespace paratrain::cli {

namespace {

int print_schedule(int pp, int micro_batches, const std::string& schedule, int virtual_chunks,
                   const std::vector<double>& rank_costs) {
  using namespace parallel::pipeline;
  const ScheduleSpec spec{parse_schedule(schedule), pp, micro_batches, virtual_chunks};
  const Schedule s = build_schedule(spec);
  const ScheduleCheck c = check_schedule(s);
  ScheduleCost weighted;
  weighted.rank_scale = rank_costs;
  const ScheduleCheck cw = rank_costs.empty() ? c : check_schedule(s, weighted);
  std::cout << schedule_name(spec.kind) << ", " << pp << " stages, " << micro_batches << " micro-batches"
            << (virtual_chunks > 1 ? ", " + std::to_string(virtual_chunks) + " chunks per rank" : "") << "\n"
            << format_schedule(s);
  if (!c.ok) throw Error("plan: the schedule does not check: " + c.problem);
  std::cout << std::fixed << std::setprecision(3) << "check: ok (no deadlock; every micro-batch forward before "
            << "backward on every stage; every receive has its send)\nbubble: " << c.bubble_fraction
            << " of the step (theory " << theoretical_bubble(spec) << "), with F = I = W = 1 (B = 2)\n"
            << "peak activations held (micro-batch chunks) per rank:";
  for (int a : c.peak_activations) std::cout << " " << a;
  std::cout << "\n";
  if (!rank_costs.empty()) {
    std::cout << "bubble with the ranks' compute scaled by";
    for (double f : rank_costs) std::cout << " " << f;
    std::cout << ": " << cw.bubble_fraction << " of the step\n";
  }
  return 0;
}

// "4" or "1,2,4" -> sizes.
std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 1) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      throw InputError(std::string("plan: ") + flag + " '" + s + "' is not a list of positive integers (e.g. 1,2,4)");
    }
  }
  if (out.empty()) throw InputError(std::string("plan: ") + flag + " is empty");
  return out;
}

}  // namespace

int run_plan(int argc, char** argv) {
  CLI::App app{"Plan a layout: memory, step time and communication of every dp x tp x pp layout of a GPT on N "
               "devices, and the one to use (docs/plan.md); --check compares the estimate with a run's metrics; "
               "--print-schedule prints and checks a pipeline schedule",
               "plan"};
  bool print_sched = false;
  int pp = 2, micro_batches = 4, virtual_chunks = 1;
  std::string schedule = "1f1b";
  app.add_flag("--print-schedule", print_sched,
               "print each rank's actions for one step (F, B, I, W and the sends and receives) and check them: "
               "no deadlock, forwards before backwards, held activations, the bubble against the theory");
  app.add_option("--pp", pp, "pipeline stages (ranks), with --print-schedule");
  app.add_option("--micro-batches", micro_batches, "micro-batches per step (train's --grad-accum), with --print-schedule");
  app.add_option("--pp-schedule", schedule, "gpipe | 1f1b | interleaved | zb1p, with --print-schedule");
  app.add_option("--pp-virtual", virtual_chunks, "model chunks per rank (interleaved), with --print-schedule");
  std::string rank_costs;
  app.add_option("--rank-costs", rank_costs,
                 "with --print-schedule: each rank's compute cost relative to the others, e.g. 1,1.3 (stages of "
                 "unequal work); also prints the bubble simulated with them");

  std::string model = "gpt2-124m";
  int64_t n_layer = 0, n_head = 0, n_embd = 0, block_size = 0, vocab_size = 0;
  float dropout = 0.0f;
  int64_t global_batch = 0;
  int devices = 0;
  std::string device, precision = "fp32", micro_batch, check_path;
  double memory_gib = 0, peak_tflops = 0, efficiency = 0.5, bucket_mb = 25;
  int top = 10;
  int64_t grad_accum = 1;
  bool json = false;
  app.add_option("--model", model, "gpt-nano | gpt-mini | gpt2-124m | gpt (sizes below override the preset)");
  app.add_option("--n-layer", n_layer, "GPT layers (0 = the preset's)");
  app.add_option("--n-head", n_head, "attention heads (0 = the preset's)");
  app.add_option("--n-embd", n_embd, "width (0 = the preset's)");
  app.add_option("--block-size", block_size, "context length (0 = the preset's)");
  app.add_option("--vocab-size", vocab_size, "vocabulary (0 = the preset's)");
  app.add_option("--dropout", dropout, "dropout probability (its masks are activations)");
  app.add_option("--global-batch", global_batch, "sequences per optimizer step (micro-batch x grad-accum x dp)");
  app.add_option("--devices", devices, "number of devices (ranks)");
  app.add_option("--device", device,
                 "cpu | h100-80g | h200-141g | a100-40g | a100-80g | v100-16g | rtx4090-24g (cpu: this machine "
                 "shared by --devices ranks)");
  app.add_option("--memory-gib", memory_gib, "memory per device, GiB (instead of or over --device)");
  app.add_option("--peak-tflops", peak_tflops, "peak TFLOP/s per device at --precision (instead of or over --device)");
  app.add_option("--efficiency", efficiency, "fraction of peak the matrix products reach (default 0.5)");
  app.add_option("--precision", precision, "fp32 | bf16");
  app.add_option("--micro-batch", micro_batch,
                 "micro-batch sizes to consider, e.g. 1,2,4 (default: powers of 2 up to global / dp); with --check "
                 "the run's --micro-batch");
  app.add_option("--grad-accum", grad_accum, "with --check: the run's --grad-accum");
  app.add_option("--bucket-mb", bucket_mb, "DDP gradient bucket size, MiB (train's --bucket-mb)");
  app.add_option("--top", top, "rows of the table to print (0 = all)");
  app.add_flag("--json", json, "print the plan as JSON");
  app.add_option("--check", check_path,
                 "a `paratrain train --metrics` file: compare the memory estimate with its measured per-rank peaks");
  if (!parse_or_throw(app, argc, argv)) return 0;
  if (print_sched) {
    std::vector<double> costs;
    if (!rank_costs.empty()) {
      std::stringstream in(rank_costs);
      for (std::string item; std::getline(in, item, ',');) {
        try {
          size_t used = 0;
          costs.push_back(std::stod(item, &used));
          if (used != item.size()) throw std::invalid_argument(item);
        } catch (const std::exception&) {
          throw InputError("plan: --rank-costs '" + rank_costs + "' is not a comma-separated list of numbers");
        }
      }
    }
    return print_schedule(pp, micro_batches, schedule, virtual_chunks, costs);
  }

  nn::GPTConfig cfg;
  if (model == "gpt-nano" || model == "gpt-mini" || model == "gpt2-124m" || model == "gpt")
    cfg = nn::GPTConfig::preset(model);
  else
    throw InputError("plan: unknown --model '" + model + "' (expected gpt-nano, gpt-mini, gpt2-124m or gpt)");
  if (n_layer < 0 || n_head < 0 || n_embd < 0 || block_size < 0 || vocab_size < 0)
    throw InputError("plan: model sizes must be positive (0 = the preset's)");
  if (n_layer) cfg.n_layer = n_layer;
  if (n_head) cfg.n_head = n_head;
  if (n_embd) cfg.n_embd = n_embd;
  if (block_size) cfg.block_size = block_size;
  if (vocab_size) cfg.vocab_size = vocab_size;
  cfg.dropout = dropout;
  cfg.validate();
  if (bucket_mb <= 0) throw InputError("plan: --bucket-mb must be positive");

  using namespace parallel::planner;
  if (!check_path.empty()) {
    CheckInput ci;
    ci.model = cfg;
    if (!micro_batch.empty()) {
      const auto mbs = parse_list(micro_batch, "--micro-batch");
      if (mbs.size() != 1) throw InputError("plan: --check takes the run's one --micro-batch");
      ci.micro_batch = mbs[0];
    }
    if (grad_accum < 1) throw InputError("plan: --grad-accum must be at least 1");
    ci.grad_accum = grad_accum;
    ci.bucket_mb = bucket_mb;
    const CheckResult r = check_metrics(check_path, ci);
    std::cout << format_check(r);
    return 0;
  }

  if (global_batch < 1) throw InputError("plan: --global-batch N (sequences per optimizer step) is required");
  if (devices < 1) throw InputError("plan: --devices N is required (at least 1)");
  if (precision != "fp32" && precision != "bf16")
    throw InputError("plan: unknown --precision '" + precision + "' (expected fp32 or bf16)");
  PlanInput in;
  in.model = cfg;
  in.global_batch = global_batch;
  in.devices = devices;
  in.bf16 = precision == "bf16";
  if (device.empty() && !(memory_gib > 0 && peak_tflops > 0))
    throw InputError("plan: give --device PRESET, or --memory-gib X and --peak-tflops Y");
  if (memory_gib < 0 || peak_tflops < 0) throw InputError("plan: --memory-gib and --peak-tflops must be positive");
  if (!device.empty()) {
    in.device = device_preset(device, devices);
  } else {
    in.device.name = "custom";
    in.device.intra_node_bw = 100e9;
    in.device.inter_node_bw = 25e9;
    in.device.note = "--memory-gib / --peak-tflops; links 100 GB/s in a node of 8, 25 GB/s between";
  }
  if (memory_gib > 0) in.device.memory_bytes = static_cast<int64_t>(memory_gib * double(int64_t(1) << 30));
  if (peak_tflops > 0) in.device.peak_flops_fp32 = in.device.peak_flops_bf16 = peak_tflops * 1e12;
  if (!(efficiency > 0 && efficiency <= 1)) throw InputError("plan: --efficiency must be in (0, 1]");
  in.efficiency = efficiency;
  in.bucket_mb = bucket_mb;
  if (!micro_batch.empty()) in.micro_batches = parse_list(micro_batch, "--micro-batch");
  if (top < 0) throw InputError("plan: --top must not be negative (0 = all)");
  const Plan plan = plan_layouts(in);
  std::cout << (json ? plan_json(in, plan, top) : format_plan(in, plan, top));
  if (plan.fits.empty()) {
    std::cerr << "plan: nothing fits: " << plan.reason << "\n";
    return 1;
  }
  return 0;
}

}  // namespace paratrain::cli
