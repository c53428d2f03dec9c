// Gradient compression for DistributedDataParallel: what goes on the wire in place of the
// f32 gradient buckets (`--compress none|fp16|bf16|powersgd`, docs/ddp.md "Compression").
// PyTorch's DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks) are the
// reference:
//
//  - fp16 / bf16 (fp16_compress_hook, bf16_compress_hook): the bucket is divided by the world
//    size, cast to 16 bits on the launching thread (the grad-ready hook, so the all-reduce
//    still overlaps backward), all-reduced as 16-bit values (the comm layer adds in f32) and
//    cast back. Half the bytes.
//  - powersgd (powerSGD_hook; Vogels, Karimireddy, Jaggi, "PowerSGD: Practical Low-Rank
//    Gradient Compression for Distributed Optimization", NeurIPS 2019): per bucket, 1-D
//    gradients (biases, LayerNorm) and matrices that would not shrink (r(n+m) >= nm) are
//    all-reduced as they are; each other gradient, viewed as M (n x m) = shape[0] x rest,
//    gets its error feedback (M += e) and is sent as two rank-r factors:
//        P = M Q; all-reduce P; orthogonalise P (Gram-Schmidt);
//        Q = M^T P; e = M - P Q^T (this rank's residual); all-reduce Q; M = P Q^T / world.
//    Q is warm-started from the previous step (initially N(0,1) from a generator seeded
//    identically on every rank). The first `powersgd_start_iter` steps are plain f32
//    all-reduces (no error feedback), as PyTorch's start_powerSGD_iter.
//
// The collectives are issued in bucket order on every rank: at launch (fp16/bf16: the 16-bit
// bucket; powersgd: [uncompressed | P] in one call) and, for powersgd, [Q] in finish() after
// backward (the second all-reduce depends on the first, so only the first one overlaps
// backward; the Q all-reduce of bucket b overlaps the work on bucket b+1).
//
// Devices: the buckets may be on the CPU or on a GPU (with the nccl group); PowerSGD's factors,
// error feedback and warm start then live on that GPU and every step of it is a dispatch-table
// kernel there (orthogonalize_columns included), so nothing waits on the host.
//
// Thread-safety: a GradCompressor is driven by its DDP's thread only. Every wait has the
// deadline given at construction (0 = the group's per-call deadline).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/nn/module.h"
#include "paratrain/tensor/tensor.h"

namespace paratrain::parallel {

enum class CompressKind { None, F16, BF16, PowerSGD };

struct CompressOptions {
  CompressKind kind = CompressKind::None;
  // r: an n x m gradient travels as P (n x r) and Q (m x r). PyTorch's default is 1; 4 keeps
  // gpt-nano within 2% of the uncompressed loss and still sends 10x fewer bytes.
  int64_t powersgd_rank = 4;
  // Plain f32 all-reduce for the first steps (the gradient changes fastest at the start;
  // PyTorch: start_powerSGD_iter, default 1000 there, "about 10% of training" recommended).
  int64_t powersgd_start_iter = 10;
  uint64_t seed = 0;  // Q's initial values (must be the same on every rank)
};

// "none" | "fp16" | "bf16" | "powersgd" (also "f16"); InputError naming the choices otherwise.
CompressKind parse_compress(const std::string& s);
const char* compress_name(CompressKind k);
// InputError unless rank >= 1 and start_iter >= 0.
void validate_compress(const CompressOptions& o);
// The options from command-line values (`kind` as parse_compress), validated; InputError also
// for compression together with deterministic mode (DDP rejects that combination).
CompressOptions compress_options(const std::string& kind, int64_t powersgd_rank, int64_t powersgd_start_iter,
                                 uint64_t seed = 0, bool deterministic = false);

// True when PowerSGD sends a gradient of this shape as factors: at least 2-D and
// r * (n + m) < n * m with n = shape[0], m = the product of the rest.
bool powersgd_compresses(const std::vector<int64_t>& shape, int64_t rank);

// Bytes one synchronised step passes to all-reduce for gradients of these shapes (f32
// gradients): `uncompressed` = 4 x elements; `compressed` = what `o.kind` sends once
// compression is on (fp16/bf16: 2 x elements; powersgd: 4 x (elements of uncompressed
// tensors + r(n+m) per compressed matrix)).
struct CompressBytes {
  int64_t uncompressed = 0;
  int64_t compressed = 0;
  int64_t matrices = 0;  // powersgd: tensors sent as factors
  int64_t tensors = 0;
};
CompressBytes compress_bytes(const std::vector<std::vector<int64_t>>& shapes, const CompressOptions& o);
// "compress powersgd rank 4: 0.45 MiB -> 0.05 MiB per step (8.9x less; 10 f32 steps first)".
std::string compress_summary(const std::vector<std::vector<int64_t>>& shapes, const CompressOptions& o);
// The same for the parameters of `module` that require gradients (what DDP buckets).
std::string compress_summary(const nn::Module& module, const CompressOptions& o);

// Gram-Schmidt on the columns of P (n x r, row-major), in double precision with one
// re-orthogonalisation pass. A column that is exactly zero after projection stays zero
// (PyTorch's epsilon for vanishing gradients, without biasing the non-zero columns).
void orthogonalize_columns(float* P, int64_t n, int64_t r);

// One parameter's gradient within a bucket: `grad` is a view of the bucket's flat buffer;
// `id` names the parameter (stable across bucket rebuilds) for the PowerSGD state.
struct GradSlot {
  int id;
  Tensor grad;
};

// The engine a DistributedDataParallel drives when its CompressOptions kind is not None.
class GradCompressor {
 public:
  GradCompressor(const CompressOptions& o, std::shared_ptr<comm::ProcessGroup> pg, double timeout_s);
  ~GradCompressor();  // waits (quietly) for calls still using its buffers
  GradCompressor(const GradCompressor&) = delete;
  GradCompressor& operator=(const GradCompressor&) = delete;

  // Starts the reduction of the next bucket (buckets are launched in the same order on every
  // rank): `flat` (f32, contiguous) holds this rank's gradient, `slots` its parameters.
  void launch(Tensor& flat, const std::vector<GradSlot>& slots);
  // After every bucket of the step was launched: completes them (deadline) and leaves the
  // mean over ranks in every flat buffer. Counts one step.
  void finish();
  // Waits for outstanding calls, ignoring failures (error paths, destruction).
  void wait_quietly();

  int64_t bytes_sent() const { return bytes_; }              // of the last finish()
  int64_t bytes_uncompressed() const { return bytes_f32_; }  // 4 x gradient elements
  int64_t steps() const { return steps_; }
  const CompressOptions& options() const { return opts_; }

  struct State;

 private:
  CompressOptions opts_;
  std::shared_ptr<comm::ProcessGroup> pg_;
  double timeout_s_;
  int64_t steps_ = 0;
  int64_t bytes_ = 0, bytes_f32_ = 0;
  std::unique_ptr<State> st_;
};

}  // namespace paratrain::parallel
