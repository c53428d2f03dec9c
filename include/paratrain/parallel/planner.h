// The layout planner (`paratrain plan`, docs/plan.md): for a GPT, a global batch and a number
// of devices of a kind, every dp x tp x pp layout (with its pipeline schedule, ZeRO stage,
// recomputation and micro-batch size) with the memory each rank would hold, split into
// weights, gradients, optimizer state, activations and buffers, an estimated step time and
// the communication volume; the layouts that do not fit are dropped (counted by reason) and
// the fastest that fits is recommended.
//
// The memory model follows what paratrain itself allocates (the autograd ops' saved tensors,
// DistributedDataParallel's flat buckets, ZeRO's shards and pieces, the caching allocator's
// size classes: tensor/allocator.h), so on the CPU build its per-rank peak is comparable
// with a run's `mem_peak_bytes` (estimate_rank_memory(), `paratrain plan --check`). The step
// time is a model, not a measurement: compute at a fixed fraction of the device's peak,
// the pipeline bubble of the real schedule (pipeline/schedule.h's check_schedule), and ring
// collectives over a per-device-kind bandwidth.
//
// Thread-safety: plain values and pure functions (cpu_device() reads /proc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/nn/gpt.h"
#include "paratrain/parallel/pipeline/schedule.h"

namespace paratrain::parallel::planner {

// ---- devices ----
struct DeviceModel {
  std::string name;            // "h100-80g", "cpu", "custom"
  int64_t memory_bytes = 0;    // per device
  int64_t reserved_bytes = 0;  // not for tensors: CUDA context, library workspaces (0 on the CPU)
  double peak_flops_fp32 = 0;  // per device, dense
  double peak_flops_bf16 = 0;  // per device, dense, f32 accumulation
  double intra_node_bw = 0;    // bytes/s per device and direction inside a node (NVLink, PCIe, shared memory)
  double inter_node_bw = 0;    // bytes/s per device and direction between nodes (InfiniBand, Ethernet)
  int devices_per_node = 8;
  std::string note;            // where the figures come from
  int64_t usable_bytes() const { return memory_bytes - reserved_bytes; }
  double peak_flops(bool bf16) const { return bf16 ? peak_flops_bf16 : peak_flops_fp32; }
};

// The names device_preset() knows: cpu, h100-80g, h200-141g, a100-40g, a100-80g, v100-16g, rtx4090-24g.
std::vector<std::string> device_preset_names();
// A preset by name; "cpu" is cpu_device(ranks). InputError naming the choices otherwise.
DeviceModel device_preset(const std::string& name, int ranks = 1);
// This machine shared by `ranks` processes: memory MemTotal of /proc/meminfo / ranks; peak
// FLOP/s = cores (hardware threads / 2 when the CPU has SMT siblings) x clock (cpu MHz of
// /proc/cpuinfo) x f32 FLOPs per cycle (2 FMA units x lanes: 16 with avx512f, 8 with avx2,
// 4 otherwise, x 2 for the multiply-add) / ranks; bandwidth: shared memory, 10 GB/s.
DeviceModel cpu_device(int ranks = 1);

// ---- layouts ----
enum class Recompute { None, Full, Selective };
const char* recompute_name(Recompute r);
Recompute parse_recompute(const std::string& s);  // InputError for other names

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::OneFOneB;  // pp > 1 only
  int virtual_chunks = 1;  // interleaved: 2
  int zero = 0;            // 0..3 (3 only with pp 1)
  Recompute recompute = Recompute::None;
  int64_t micro_batch = 1;  // sequences per micro-batch per data-parallel rank
  int64_t grad_accum = 1;   // micro-batches per step (the pipeline's m with pp > 1)
  std::string str() const;  // "dp 2 tp 1 pp 1 zero 1 recompute none mb 4 x 2"
};

// What the memory model needs besides the model and the layout.
struct MemoryOptions {
  bool bf16 = false;              // --precision bf16: matrix products and attention in bf16, half copies of weights
  double bucket_mb = 25;          // DDP bucket size (train's --bucket-mb)
  bool sequence_parallel = false;
  int zero3_prefetch = 1;
};

// Per rank, bytes (each tensor rounded to the caching allocator's size class).
struct MemoryEstimate {
  int64_t weights = 0;      // parameters (ZeRO 3: this rank's shard) and bf16 half copies
  int64_t gradients = 0;    // .grad or DDP's flat buckets, ZeRO's gradient shards
  int64_t optimizer = 0;    // AdamW m and v, f32 (ZeRO: this rank's pieces)
  int64_t activations = 0;  // saved for backward, times the micro-batches the schedule holds
  int64_t buffers = 0;      // logits and their gradient, backward temporaries, ZeRO 3 gathered units, p2p
  int64_t total() const { return weights + gradients + optimizer + activations + buffers; }
};

// A parameter tensor as one rank holds it.
struct ParamTensor {
  std::string name;
  int64_t numel = 0;
  bool matrix = false;  // a weight cast to the half type under bf16 (linear weights and biases, wte)
};
// The parameters of the whole GPT in registration order (the model's named_parameters()).
std::vector<ParamTensor> gpt_parameters(const nn::GPTConfig& cfg);
// The parameters one rank holds: blocks [first_block, end_block), wte/wpe on the first stage,
// ln_f and the tied wte on the last; with tp > 1 the tensor-parallel cuts (vocabulary padded
// to a multiple of tp).
std::vector<ParamTensor> rank_parameters(const nn::GPTConfig& cfg, int tp, int first_block, int end_block);
int64_t parameter_count(const nn::GPTConfig& cfg);  // = nn::GPT(cfg).num_parameters()

// Bytes the activations of one micro-batch of `micro_batch` sequences leave saved for
// backward in one block on one rank (tp: its shard), each tensor rounded.
int64_t block_activation_bytes(const nn::GPTConfig& cfg, int64_t micro_batch, int tp, Recompute r, bool bf16,
                               bool sequence_parallel = false);

// The estimate for the rank of world rank `rank` (its pp stage and dp index: ZeRO's pieces
// differ by rank). InputError when the layout is not valid for the model.
MemoryEstimate estimate_rank_memory(const nn::GPTConfig& cfg, const Layout& layout, const MemoryOptions& opt,
                                    int rank);

// ---- time and communication ----
struct TimeEstimate {
  double compute_s = 0;          // model FLOPs (6N + 12LCT per token) / (devices x peak x efficiency)
  double recompute_s = 0;        // the forward recomputed (full: a whole forward; selective: attention's)
  double bubble_fraction = 0;    // of the pipelined step (simulated schedule)
  double bubble_s = 0;
  double dp_comm_s = 0, tp_comm_s = 0, pp_comm_s = 0;  // total time on the wire
  double exposed_comm_s = 0;     // the part not hidden behind compute
  double step_s = 0;             // (compute + recompute) / (1 - bubble) + exposed communication
  double dp_bytes = 0, tp_bytes = 0, pp_bytes = 0;  // sent per rank per step
};

// ---- the plan ----
struct PlanInput {
  nn::GPTConfig model;
  int64_t global_batch = 8;   // sequences per optimizer step
  int devices = 1;
  DeviceModel device;
  bool bf16 = false;
  std::vector<int64_t> micro_batches;  // choices; empty = 1, 2, 4, ... up to global / dp
  double efficiency = 0.5;    // the fraction of peak FLOP/s the matrix products reach
  double bucket_mb = 25;
};

struct Candidate {
  Layout layout;
  MemoryEstimate memory;  // the rank that holds the most
  int worst_rank = 0;
  TimeEstimate time;
  double tokens_per_s = 0;
};

struct Plan {
  std::vector<Candidate> fits;          // sorted by estimated step time, ties by less memory
  int64_t considered = 0;               // layouts enumerated
  std::map<std::string, int64_t> dropped;  // reason -> count (memory over the device's, ...)
  std::optional<size_t> recommended;    // index into fits
  std::string reason;                   // one sentence
};

// Enumerates every layout: dp x tp x pp = devices, tp dividing n_head and n_embd
// (check_tensor_parallel_layout), pp <= n_layer, schedules gpipe | 1f1b | interleaved (v = 2,
// m a multiple of pp, 2 pp <= n_layer) | zb1p for pp > 1, ZeRO 0..3 (1..3 only with dp > 1,
// 3 only with pp 1), recompute none | full | selective, micro-batch sizes dividing
// global / dp. InputError when the input itself is bad (no layout can exist: devices < 1,
// global batch not a multiple of any dp, ...).
Plan plan_layouts(const PlanInput& in);
TimeEstimate estimate_time(const PlanInput& in, const Layout& layout);

// The table and the recommendation as text (top rows; 0 = all).
std::string format_plan(const PlanInput& in, const Plan& plan, int top);
// The same as JSON text.
std::string plan_json(const PlanInput& in, const Plan& plan, int top);

// ---- estimate against a run (`paratrain plan --check METRICS.jsonl`) ----
struct CheckInput {
  nn::GPTConfig model;            // the run's model when the metrics do not record it ("model")
  std::optional<int64_t> micro_batch;  // overrides the metrics' "micro_batch"
  int64_t grad_accum = 1;
  double bucket_mb = 25;
};
struct RankCheck {
  int rank = 0;
  int64_t estimate = 0, measured = 0;
  double rel_error = 0;  // (estimate - measured) / measured
  MemoryEstimate split;
};
struct CheckResult {
  Layout layout;
  MemoryOptions options;
  std::vector<RankCheck> ranks;
  // Measured next to estimated, per rank where the metrics have them.
  std::vector<int64_t> measured_params, measured_grads, measured_optimizer;
  int64_t measured_activations = -1;  // rank 0's
};
// Reads the last step line of a `paratrain train --metrics` file (layout, zero, recompute,
// precision, mem_peak_bytes per rank, ...). InputError when the file is missing or lacks them.
CheckResult check_metrics(const std::string& metrics_path, const CheckInput& in);
std::string format_check(const CheckResult& r);

}  // namespace paratrain::parallel::planner
