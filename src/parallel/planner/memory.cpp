// The planner's memory model (planner.h, docs/plan.md): what one rank of a layout holds at
// its peak, tensor by tensor, each rounded to the caching allocator's size class.
#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <tuple>

#include "paratrain/base/error.h"
#include "paratrain/parallel/pipeline/partition.h"
#include "paratrain/parallel/planner.h"
#include "paratrain/parallel/tensor_parallel/gpt_plan.h"
#include "paratrain/tensor/allocator.h"
#include "planner_internal.h"

namespace paratrain::parallel::planner {

int64_t rounded(int64_t bytes) {
  return bytes <= 0 ? 0 : static_cast<int64_t>(CachingAllocator::size_class(static_cast<size_t>(bytes)));
}

const char* recompute_name(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Full: return "full";
    case Recompute::Selective: return "selective";
  }
  return "?";
}

Recompute parse_recompute(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "full") return Recompute::Full;
  if (s == "selective") return Recompute::Selective;
  PT_THROW(InputError, "unknown --recompute '", s, "' (expected none, full or selective)");
}

std::string Layout::str() const {
  std::string s = "dp " + std::to_string(dp) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp);
  if (pp > 1) {
    s += std::string(" ") + pipeline::schedule_name(schedule);
    if (virtual_chunks > 1) s += " v" + std::to_string(virtual_chunks);
  }
  s += " zero " + std::to_string(zero) + " recompute " + recompute_name(recompute) + " mb " +
       std::to_string(micro_batch) + " x " + std::to_string(grad_accum);
  return s;
}

namespace {
ParamTensor P(std::string name, int64_t n, bool matrix) { return ParamTensor{std::move(name), n, matrix}; }

void block_parameters(std::vector<ParamTensor>& out, const nn::GPTConfig& c, int64_t i, int tp) {
  const int64_t C = c.n_embd;
  const std::string h = "h." + std::to_string(i) + ".";
  out.push_back(P(h + "ln_1.weight", C, false));
  out.push_back(P(h + "ln_1.bias", C, false));
  out.push_back(P(h + "attn.c_attn.weight", C * 3 * C / tp, true));
  out.push_back(P(h + "attn.c_attn.bias", 3 * C / tp, true));
  out.push_back(P(h + "attn.c_proj.weight", C / tp * C, true));
  out.push_back(P(h + "attn.c_proj.bias", C, true));
  out.push_back(P(h + "ln_2.weight", C, false));
  out.push_back(P(h + "ln_2.bias", C, false));
  out.push_back(P(h + "mlp.c_fc.weight", C * 4 * C / tp, true));
  out.push_back(P(h + "mlp.c_fc.bias", 4 * C / tp, true));
  out.push_back(P(h + "mlp.c_proj.weight", 4 * C / tp * C, true));
  out.push_back(P(h + "mlp.c_proj.bias", C, true));
}

int64_t padded_vocab(const nn::GPTConfig& c, int tp) { return (c.vocab_size + tp - 1) / tp * tp; }
}  // namespace

std::vector<ParamTensor> rank_parameters(const nn::GPTConfig& c, int tp, int first_block, int end_block) {
  std::vector<ParamTensor> out;
  const int64_t C = c.n_embd;
  const bool first = first_block == 0, last = end_block == c.n_layer;
  if (first || last) out.push_back(P("wte.weight", padded_vocab(c, tp) / tp * C, true));
  if (first) out.push_back(P("wpe.weight", c.block_size * C, false));
  for (int64_t i = first_block; i < end_block; ++i) block_parameters(out, c, i, tp);
  if (last) {
    out.push_back(P("ln_f.weight", C, false));
    out.push_back(P("ln_f.bias", C, false));
  }
  return out;
}

std::vector<ParamTensor> gpt_parameters(const nn::GPTConfig& c) {
  return rank_parameters(c, 1, 0, static_cast<int>(c.n_layer));
}

int64_t parameter_count(const nn::GPTConfig& c) {
  int64_t n = 0;
  for (const auto& p : gpt_parameters(c)) n += p.numel;
  return n;
}

// ---- activations ----

// One micro-batch's tensors saved for backward by one block (planner.h). The op by op list
// (autograd ops: layer_norm saves its input and mean/rstd, linear its input, attention qkv,
// its output and the log-sum-exp, gelu its input, the residual adds nothing):
//   ln_1 mean, rstd [B T] f32; ln_1 out [B T C] (the linear's input, in the compute type);
//   qkv [B T 3C/tp]; attention out [B T C/tp] and lse [B H/tp T] f32; x1 = x + attn [B T C]
//   f32 (ln_2's input); ln_2 mean, rstd, out; c_fc out [B T 4C/tp] (gelu's input); gelu out
//   [B T 4C/tp] (c_proj's input); the block output [B T C] f32 (the next block's input);
//   with dropout the two u8 masks.
// Full recomputation keeps only the block's output (its checkpoint's input is the previous
// block's output); selective recomputes the attention core, whose fused kernel then keeps
// only its row log-sum-exp less (its output stays: c_proj needs it; qkv is c_attn's output).
int64_t block_activation_bytes(const nn::GPTConfig& c, int64_t B, int tp, Recompute r, bool bf16, bool sp) {
  const int64_t T = c.block_size, C = c.n_embd, H = c.n_head;
  const int64_t a = bf16 ? 2 : 4;
  const int64_t BT = B * T, BTC = BT * C;
  const int64_t seq = sp ? tp : 1;  // sequence parallelism: LayerNorms and the residual on T/tp
  if (r == Recompute::Full) return rounded(4 * BTC / seq);
  int64_t s = 0;
  s += 4 * rounded(4 * BT / seq);             // ln_1, ln_2 mean and rstd
  s += 2 * rounded(a * BTC);                  // ln_1 out, ln_2 out (the column-parallel linears' inputs)
  s += rounded(a * 3 * BTC / tp);             // qkv
  s += rounded(a * BTC / tp);                 // attention out (c_proj's input)
  if (r != Recompute::Selective) s += rounded(4 * BT * (H / tp));  // lse: selective recomputes it
  s += 2 * rounded(4 * BTC / seq);            // x1, the block's output
  s += 2 * rounded(a * 4 * BTC / tp);         // c_fc out, gelu out
  if (c.dropout > 0) s += 2 * rounded(BTC / seq);  // dropout masks
  return s;
}

namespace detail {

const pipeline::ScheduleCheck& schedule_check(pipeline::ScheduleKind kind, int p, int m, int v) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int>, pipeline::ScheduleCheck> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(static_cast<int>(kind), p, m, v);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  pipeline::ScheduleCheck c = pipeline::check_schedule(pipeline::build_schedule({kind, p, m, v}));
  if (!c.ok) PT_THROW(Error, "planner: the schedule does not check: ", c.problem);
  return cache.emplace(key, std::move(c)).first->second;
}

std::vector<pipeline::StageRange> stage_ranges(const nn::GPTConfig& c, int stages) {
  const double C = static_cast<double>(c.n_embd), V = static_cast<double>(c.vocab_size);
  std::vector<double> cost(static_cast<size_t>(c.n_layer), 12.0 * C * C + 13.0 * C);
  // Compute per token: a block 12 C^2 multiply-adds (its parameters), the head V C, the
  // embedding lookup next to nothing.
  return pipeline::balance_stages(cost, 0.0, V * C, stages);
}

struct Bucket {
  std::vector<int> params;  // indexes into the parameter list
  int64_t total = 0;        // elements (ZeRO: padded to a multiple of the dp size)
  int64_t shard_len = 0;
};

// DistributedDataParallel's buckets: parameters in reverse registration order, the first
// bucket at most min(bucket, 1 MiB), the others `bucket_bytes`.
std::vector<Bucket> ddp_buckets(const std::vector<ParamTensor>& params, double bucket_mb, int world, bool zero) {
  const int64_t bucket_bytes = static_cast<int64_t>(bucket_mb * (1 << 20));
  int64_t cap = std::min<int64_t>(bucket_bytes, int64_t(1) << 20);
  std::vector<Bucket> out;
  Bucket cur;
  int64_t cur_bytes = 0;
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    const int64_t bytes = params[static_cast<size_t>(i)].numel * 4;
    if (!cur.params.empty() && cur_bytes + bytes > cap) {
      out.push_back(cur);
      cur = Bucket();
      cur_bytes = 0;
      cap = bucket_bytes;
    }
    cur.params.push_back(i);
    cur_bytes += bytes;
  }
  if (!cur.params.empty()) out.push_back(cur);
  for (auto& b : out) {
    for (int i : b.params) b.total += params[static_cast<size_t>(i)].numel;
    if (zero) {
      b.shard_len = (b.total + world - 1) / world;
      b.total = b.shard_len * world;
    }
  }
  return out;
}

// Bytes of AdamW state (m and v, f32) for the pieces of [offset, offset + n) elements of each
// parameter laid out consecutively that fall in [lo, hi).
int64_t piece_state_bytes(const std::vector<int64_t>& sizes, int64_t lo, int64_t hi) {
  int64_t s = 0, off = 0;
  for (int64_t n : sizes) {
    const int64_t a = std::max(off, lo), b = std::min(off + n, hi);
    if (b > a) s += 2 * rounded(4 * (b - a));
    off += n;
  }
  return s;
}

}  // namespace detail

using namespace detail;

MemoryEstimate estimate_rank_memory(const nn::GPTConfig& c, const Layout& L, const MemoryOptions& opt, int rank) {
  c.validate();
  const int world = L.dp * L.tp * L.pp;
  if (rank < 0 || rank >= world) PT_THROW(InputError, "rank ", rank, " outside the layout's ", world, " ranks");
  if (L.tp > 1) check_tensor_parallel_layout(c, L.tp, opt.sequence_parallel);
  if (L.zero == 3 && L.pp > 1) PT_THROW(InputError, "--zero 3 cannot be combined with --pp ", L.pp);
  if (L.micro_batch < 1 || L.grad_accum < 1) PT_THROW(InputError, "micro-batch and grad-accum must be at least 1");
  const int pp_idx = rank / (L.tp * L.dp), dp_idx = (rank / L.tp) % L.dp;
  const int v = L.pp > 1 ? L.virtual_chunks : 1;
  const auto stages = stage_ranges(c, L.pp * v);  // InputError when more stages than blocks
  std::vector<pipeline::StageRange> mine;
  for (int k = 0; k < v; ++k) mine.push_back(stages[static_cast<size_t>(k * L.pp + pp_idx)]);

  std::vector<ParamTensor> params;
  bool first = false, last = false;
  int64_t blocks = 0, max_chunk_blocks = 0;
  for (const auto& s : mine) {
    auto part = rank_parameters(c, L.tp, s.first_block, s.end_block);
    // wte only once when a rank holds both the first and the last stage (it is one tensor).
    for (auto& p : part)
      if (p.name != "wte.weight" || std::none_of(params.begin(), params.end(), [](const ParamTensor& q) {
            return q.name == "wte.weight";
          }))
        params.push_back(p);
    first = first || s.first_block == 0;
    last = last || s.end_block == c.n_layer;
    blocks += s.end_block - s.first_block;
    max_chunk_blocks = std::max<int64_t>(max_chunk_blocks, s.end_block - s.first_block);
  }

  const bool bf16 = opt.bf16;
  const int64_t a = bf16 ? 2 : 4;
  const int64_t B = L.micro_batch, T = c.block_size, C = c.n_embd;
  const int64_t BT = B * T, BTC = BT * C;
  const int64_t Vl = (c.vocab_size + L.tp - 1) / L.tp;  // this rank's vocabulary rows
  const int W = L.dp;
  const bool ddp = W > 1 || L.zero > 0;  // flat buckets (the trainer builds DDP then)

  MemoryEstimate m;
  int64_t half = 0;
  for (const auto& p : params)
    if (bf16 && p.matrix) half += rounded(2 * p.numel);

  int64_t zero3_buffers = 0;
  if (L.zero == 3) {
    // FullyShardedDataParallel: the blocks are units, the rest (wte, wpe, ln_f) the root;
    // each unit one flat f32 buffer padded to W blocks, of which the rank keeps one.
    std::vector<int64_t> unit_total;
    std::vector<std::vector<int64_t>> unit_sizes;
    std::vector<int64_t> root_sizes;
    for (const auto& p : params) {
      if (p.name.rfind("h.", 0) == 0) {
        const int64_t blk = std::stoll(p.name.substr(2, p.name.find('.', 2) - 2));
        const size_t u = static_cast<size_t>(blk - mine[0].first_block);
        if (unit_sizes.size() <= u) unit_sizes.resize(u + 1);
        unit_sizes[u].push_back(p.numel);
      } else {
        root_sizes.push_back(p.numel);
      }
    }
    unit_sizes.insert(unit_sizes.begin(), root_sizes);  // unit 0: the root
    int64_t biggest_block = 0, root_padded = 0;
    for (size_t u = 0; u < unit_sizes.size(); ++u) {
      const int64_t total = std::accumulate(unit_sizes[u].begin(), unit_sizes[u].end(), int64_t(0));
      const int64_t shard = (total + W - 1) / W;
      m.weights += rounded(4 * shard);
      m.gradients += rounded(4 * shard);
      m.optimizer += piece_state_bytes(unit_sizes[u], dp_idx * shard, (dp_idx + 1) * shard);
      if (u == 0)
        root_padded = shard * W;
      else
        biggest_block = std::max(biggest_block, shard * W);
    }
    // At the peak (backward): the root whole with its gradient buffer, the computing unit and
    // the prefetched ones whole, the computing unit's gradient buffer and the one being
    // reduce-scattered; half copies of what is gathered.
    const int64_t gathered = 1 + std::max(opt.zero3_prefetch, 0);
    zero3_buffers = 2 * rounded(4 * root_padded) + gathered * rounded(4 * biggest_block) +
                    2 * rounded(4 * biggest_block);
    if (bf16) half = rounded(2 * root_padded) + gathered * rounded(2 * biggest_block);
    m.weights += half;
  } else {
    for (const auto& p : params) m.weights += rounded(4 * p.numel);
    m.weights += half;
    if (ddp) {
      const auto buckets = ddp_buckets(params, opt.bucket_mb, W, L.zero > 0);
      for (const auto& b : buckets) {
        m.gradients += rounded(4 * b.total) + (L.zero > 0 ? rounded(4 * b.shard_len) : 0);
        if (L.zero > 0) {
          std::vector<int64_t> sizes;
          for (int i : b.params) sizes.push_back(params[static_cast<size_t>(i)].numel);
          m.optimizer += piece_state_bytes(sizes, dp_idx * b.shard_len, (dp_idx + 1) * b.shard_len);
        }
      }
    } else {
      for (const auto& p : params) m.gradients += rounded(4 * p.numel);
    }
    if (L.zero == 0)
      for (const auto& p : params) m.optimizer += 2 * rounded(4 * p.numel);
  }

  // ---- activations: per micro-batch, times what the schedule holds ----
  const int64_t per_block = block_activation_bytes(c, B, L.tp, L.recompute, bf16, opt.sequence_parallel);
  int64_t held = 1;  // micro-batch chunks held at the peak
  if (L.pp > 1) held = schedule_check(L.schedule, L.pp, static_cast<int>(L.grad_accum), v).peak_activations[static_cast<size_t>(pp_idx)];
  // One chunk's micro-batch: its blocks, its input ([B T C] f32: the embedding's output or
  // the received activation); the last stage also ln_f's statistics and output.
  const int64_t chunk_blocks = v > 1 ? max_chunk_blocks : blocks;
  int64_t per_mb = chunk_blocks * per_block + rounded(4 * BTC) + 2 * rounded(4 * BT);  // + the batch's ids
  if (last) per_mb += 2 * rounded(4 * BT) + rounded(a * BTC) + rounded(4 * BT);  // ln_f, cross-entropy lse
  m.activations = held * per_mb;

  // ---- buffers: what is alive besides, at the peak ----
  int64_t buf = 0;
  if (last) buf += 2 * rounded(a * BT * Vl);  // logits (saved by the loss) and their gradient
  // The backward's temporaries: the head's weight gradient and the embedding's, a few
  // activation gradients in flight; with recomputation one block's activations rebuilt.
  if (last) buf += rounded(a * Vl * C);
  if (first) buf += rounded(4 * Vl * C) + rounded(4 * T * C);
  buf += 3 * rounded(4 * BTC);
  if (L.recompute == Recompute::Full)
    buf += block_activation_bytes(c, B, L.tp, Recompute::None, bf16, opt.sequence_parallel) + 2 * rounded(a * 4 * BTC / L.tp);
  if (L.pp > 1) buf += 2 * rounded(4 * BTC);  // receive buffers of an activation and a gradient
  if (L.zero == 1) {
    // A full-size staging copy of the biggest bucket (a reduce-scatter in flight, or the
    // parameters' all-gather after the step) next to the buckets, which ZeRO 1 keeps; ZeRO 2
    // releases the buckets at finish() and measures one bucket less (docs/plan.md).
    const auto buckets = ddp_buckets(params, opt.bucket_mb, W, true);
    int64_t biggest = 0;
    for (const auto& b : buckets) biggest = std::max(biggest, rounded(4 * b.total));
    // A pipeline reduces every bucket at finish(), after the backward freed the activations:
    // the staging copy then only raises the peak where it outgrows what the backward held.
    buf += L.pp > 1 ? std::max<int64_t>(0, biggest - (m.activations + buf)) : biggest;
  }
  buf += zero3_buffers;
  m.buffers = buf;
  return m;
}

}  // namespace paratrain::parallel::planner
