// FlightRecorder: a per-process record of the recent collectives and point-to-point calls
// of every process group (like PyTorch's NCCL flight recorder), for hang and failure reports.
//
// Every call a group makes is one FlightRecord in a bounded ring (PARATRAIN_FR_BUFFER
// entries, default 2000; 0 turns the recorder off): the group, the call's sequence number
// (as in error messages: "allreduce #12"), its ordinal among the group's collectives, op,
// dtype, count, bytes, peer/root, tag, state (scheduled -> started -> completed | failed)
// and the steady-clock times of each step. The hot path is a few stores under one short
// mutex (no allocation, no formatting): record() at the call, started() when the group's
// engine begins it, finished() from Work::finish().
//
// Dumps: dump_json() renders everything as JSON (format "paratrain-flight-recorder/1",
// docs/observability.md): rank, pid, host, the reason, the groups with their last completed
// and pending calls, and the records oldest first. With a dump directory (the launcher sets
// PARATRAIN_FR_DUMP_DIR) the process-wide recorder writes DIR/rank_<R>.fr.json atomically
// on the first failure of a call (TimeoutError: reason "timeout", else "failure") and on
// SIGUSR1 (its handler only writes a byte to a pipe; the recorder's thread writes the file;
// the rank keeps running). The handler is installed only where SIGUSR1 had its default
// action. It also keeps DIR/rank_<R>.fr.progress, a small shared file (FlightProgress) with
// counters and the last issued and finished call, which the launcher reads to see whether
// collectives advance, also from a rank that cannot answer (stopped, dead).
//
// Tracing (base/trace.h, `--trace DIR`): while the trace sink is on, each call that finishes
// is also a complete event "<op>" (cat "comm") from its start to its finish on the track
// "comm <group name>", with args bytes, count, dtype, seq, peer (send/recv, broadcast, reduce),
// algbw_gbps and busbw_gbps (nccl-tests' formulas) and the caller's call tag (DDP: "bucket").
//
// Thread-safety: every method may be called from any thread. Lifetime: instance() is never
// destroyed (Works may finish during exit); a recorder made by hand (tests) must outlive the
// Works that point at it.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "paratrain/comm/types.h"
#include "paratrain/tensor/dtype.h"

namespace paratrain::comm {

enum class RecordState : uint8_t { kScheduled, kStarted, kCompleted, kFailed };
const char* record_state_name(RecordState s);

struct FlightRecord {
  uint64_t id = 0;        // process-wide call number of the recorder (1, 2, ...)
  int32_t group = -1;     // FlightGroup::id
  uint64_t seq = 0;       // the group's call number ("allreduce #seq")
  int64_t coll = -1;      // ordinal among the group's collectives (0, 1, ...); -1 for send/recv
  OpType op = OpType::kBarrier;
  DType dtype = DType::F32;
  ReduceOp reduce_op = ReduceOp::kSum;
  RecordState state = RecordState::kScheduled;
  uint64_t count = 0;
  uint64_t bytes = 0;
  int32_t peer = -1;      // root (broadcast, reduce), destination (send), source (recv); -1 none
  int32_t tag = 0;        // send/recv
  int64_t enqueued_ns = 0, started_ns = 0, finished_ns = 0;  // steady clock; 0 = not yet
  const char* trace_tag = nullptr;  // the caller's trace::CallTag when tracing ("bucket"), else null
  int64_t trace_tag_value = 0;
};

// What a group's completed calls moved, summed since the group was added: the source of the
// achieved bus bandwidth of a training step (the difference of two snapshots). Calls whose
// record the ring overwrote before they finished are not counted.
struct GroupTraffic {
  uint64_t calls = 0;     // completed calls
  uint64_t bytes = 0;     // their FlightRecord::bytes
  double bus_bytes = 0;   // comm::bus_bytes of each (nccl-tests)
  int64_t busy_ns = 0;    // their started -> finished times, summed
  // busbw in GB/s (bus bytes per ns) of what happened between `before` and this; 0 when idle.
  double busbw_gbps_since(const GroupTraffic& before) const;
};

struct FlightGroup {
  int id = 0;
  std::string name;       // "world", "world/0", ...
  std::string backend;    // "shm", "tcp", "shm+tcp", "mpi"
  int rank = 0;           // this process's rank in the group
  int size = 1;
  std::vector<int> ranks; // the group's ranks in the job (global ranks)
};

// The layout of DIR/rank_<R>.fr.progress (host byte order; readers on the same host).
// `version` is odd while the writer updates the rest (a seqlock).
struct FlightProgressCall {
  uint64_t seq = 0;
  int64_t coll = -1;
  uint64_t count = 0;
  int64_t t_unix_us = 0;  // when it was issued (last_issued) or finished (last_finished)
  int32_t group_size = 0;
  uint8_t op = 0, dtype = 0, state = 0, valid = 0;
  char group[32] = {};
};
struct FlightProgress {
  static constexpr uint64_t kMagic = 0x5054465250524f47ull;  // "PTFRPROG"
  uint64_t magic = 0;
  int64_t pid = 0;
  int32_t rank = 0;
  int32_t pad = 0;
  std::atomic<uint64_t> version{0};
  uint64_t issued = 0;    // calls recorded
  uint64_t finished = 0;  // calls completed or failed
  uint64_t dumps = 0;     // dump files written
  FlightProgressCall last_issued, last_finished;
};
// A consistent copy of a progress file, or nullopt (missing, foreign, torn for too long).
struct FlightProgressSnapshot {
  int64_t pid = 0;
  int rank = 0;
  uint64_t issued = 0, finished = 0, dumps = 0;
  FlightProgressCall last_issued, last_finished;
};
std::optional<FlightProgressSnapshot> read_flight_progress(const std::string& path);

// DIR/rank_<R>.fr.json and DIR/rank_<R>.fr.progress.
std::string flight_dump_path(const std::string& dir, int rank);
std::string flight_progress_path(const std::string& dir, int rank);

class FlightRecorder {
 public:
  // The process-wide recorder: PARATRAIN_FR_BUFFER entries, dumps to PARATRAIN_FR_DUMP_DIR.
  static FlightRecorder& instance();
  // A recorder of `capacity` entries (0 = off); `dump_dir` "" = no files; `rank` < 0: the
  // rank of the first group added (RANK when set, for instance()).
  explicit FlightRecorder(size_t capacity, std::string dump_dir = "", int rank = -1);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  bool enabled() const { return capacity_ > 0; }
  size_t capacity() const { return capacity_; }
  // Registers a group; returns its id (-1 when disabled). `global_ranks` empty = 0..size-1.
  // `name` "" = "world" for the first group without a parent, "pg<id>" after.
  int add_group(std::string name, const std::string& backend, int rank, int size, std::vector<int> global_ranks);
  const FlightGroup* group(int id) const;

  // A new call of group `group` (state scheduled); returns its id, 0 when disabled.
  uint64_t record(int group, uint64_t seq, OpType op, DType dtype, uint64_t count, ReduceOp reduce_op, int peer,
                  int tag);
  void started(uint64_t id);
  // The call finished; a failure (`error` set) also triggers a dump (reason "timeout" for a
  // TimeoutError, else "failure"; at most one per second).
  void finished(uint64_t id, const std::exception_ptr& error = nullptr);

  // The records still in the ring, oldest first.
  std::vector<FlightRecord> snapshot() const;
  // Group `group`'s traffic so far (zeros for an unknown group or a disabled recorder).
  GroupTraffic traffic(int group) const;
  std::string dump_json(const std::string& reason) const;
  // Writes DIR/rank_<R>.fr.json atomically; returns its path ("" without a directory).
  std::string dump(const std::string& reason);
  const std::string& dump_dir() const { return dump_dir_; }

 private:
  void open_progress();  // mu_ held
  void publish(const FlightRecord& r, bool issued);  // mu_ held
  void signal_thread();

  size_t capacity_;
  std::string dump_dir_;
  int rank_;
  mutable std::mutex mu_;
  std::vector<FlightRecord> ring_;
  uint64_t next_id_ = 1;
  std::vector<std::unique_ptr<FlightGroup>> groups_;
  std::vector<int64_t> colls_;  // per group: collectives recorded so far
  std::vector<GroupTraffic> traffic_;  // per group
  std::vector<uint32_t> trace_tracks_;  // per group: its trace track (base/trace.h), 0 = not made yet
  int top_level_groups_ = 0;
  FlightProgress* progress_ = nullptr;  // mapped DIR/rank_<R>.fr.progress
  int64_t last_failure_dump_ns_ = 0;
  std::string first_failure_;
  std::mutex dump_mu_;  // one dump at a time
};

}  // namespace paratrain::comm
