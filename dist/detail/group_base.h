// What every process group shares, whatever its transport: rank, size, name, the timeout and
// debug settings, sequence numbers, how an operation is named in messages, the broken state,
// child groups' names and settings, and the debug fingerprints the ranks compare. A backend
// derives from GroupBase and adds its transport: the nccl group directly, the mpi and threads
// groups through QueuedGroup (detail/queued_group.h), which adds a communication thread that runs
// operations in issue order. Internal to dist (not installed).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "dist/process_group.h"

namespace tandem::dist {

enum class OpKind : uint8_t {
  allreduce,
  allreduce_coalesced,
  broadcast,
  allgather,       // list output
  allgather_into,  // flat output
  reduce_scatter,  // list input
  reduce_scatter_tensor,
  all_to_all,
  barrier,
  send,
  recv,
  new_group,
};
std::string_view op_kind_name(OpKind k);
inline bool is_p2p(OpKind k) { return k == OpKind::send || k == OpKind::recv; }

using Clock = std::chrono::steady_clock;

// An operation that failed in a way that may leave the group unusable: a transport error (the
// ranks ran different collectives, a peer went away) or a missed deadline. `group_survives` is
// true when the backend could cancel everything (e.g. a receive), so the group stays usable;
// otherwise the group is broken. `missing_ranks`: the ranks found not to have arrived, where the
// backend could tell (the flight recorder keeps them with the operation).
class CollectiveError : public Error {
 public:
  CollectiveError(std::string message, bool group_survives, std::vector<int> missing_ranks = {})
      : Error(std::move(message)), group_survives_(group_survives), missing_ranks_(std::move(missing_ranks)) {}
  bool group_survives() const { return group_survives_; }
  const std::vector<int>& missing_ranks() const { return missing_ranks_; }

 private:
  bool group_survives_;
  std::vector<int> missing_ranks_;
};

// An operation that missed its deadline.
class TimeoutError : public CollectiveError {
 public:
  using CollectiveError::CollectiveError;
};

// The process-wide defaults read from the environment.
Milliseconds default_timeout();
bool default_debug_checks();

// Whether, and why, a group is broken: set once (the first reason stays), read from any thread.
// Shared with whatever may outlive the group object (the nccl watchdog).
class BrokenState {
 public:
  // `peers_are_processes`: the group's other ranks are other processes (mpi, nccl), so once it
  // breaks one of them may be hung or gone for good; marking it then also records the reason
  // process-wide (first_process_break), for the exit path.
  explicit BrokenState(bool peers_are_processes = false) : peers_are_processes_(peers_are_processes) {}
  bool is_broken() const { return broken_.load(); }
  std::string reason() const;
  // True when this call broke it (the first reason stays).
  bool mark(const std::string& reason);
  // "[dist] cannot run <what>: the group is broken (<reason>)"
  std::string message(std::string_view what) const;
  // Throws message(what) once broken.
  void check(std::string_view what) const {
    if (is_broken()) [[unlikely]] throw Error(message(what));
  }

 private:
  mutable std::mutex mutex_;
  std::string reason_;
  std::atomic<bool> broken_{false};
  const bool peers_are_processes_;
};

// Why the first group of this process whose peers are other processes broke, or "" while none
// has (groups destroyed since count too). Read at exit by mpi_finalize: MPI_Finalize waits for
// every rank, and after such a break one may never come.
std::string first_process_break();

// While an operation of a group runs on this thread, a backend's waits for its peers also end
// when the group breaks meanwhile (another rank told this one it broke), not only at the deadline.
class WaitsEndOnBreak {
 public:
  explicit WaitsEndOnBreak(const BrokenState& state);
  ~WaitsEndOnBreak();
  WaitsEndOnBreak(const WaitsEndOnBreak&) = delete;
  WaitsEndOnBreak& operator=(const WaitsEndOnBreak&) = delete;

 private:
  const BrokenState* previous_;
};
// Whether the group of the operation this thread runs has broken (a wait should end).
bool wait_abandoned();

class FlightRecorder;

class GroupBase : public ProcessGroup {
 public:
  // `broken`: a state shared with helpers that may outlive the group (the nccl watchdog).
  GroupBase(int rank, int size, std::string name, Milliseconds timeout = default_timeout(),
            bool debug_checks = default_debug_checks(),
            std::shared_ptr<BrokenState> broken = std::make_shared<BrokenState>());

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }
  void set_timeout(Milliseconds timeout) override;
  Milliseconds timeout() const override { return Milliseconds(timeout_ms_.load()); }
  void set_debug_checks(bool on) override { debug_.store(on); }
  bool debug_checks() const override { return debug_.load(); }
  bool is_broken() const override { return broken_->is_broken(); }
  ~GroupBase() override;

  // This group's flight recorder (detail/flight_recorder.h): its last operations, for dumps and
  // for the answers to peers that timed out.
  FlightRecorder& recorder() const { return *recorder_; }
  const std::shared_ptr<FlightRecorder>& recorder_ptr() const { return recorder_; }

  // "allreduce #3 on group world (threads, rank 1 of 4)"; send and recv name their peer and tag.
  std::string describe(OpKind kind, uint64_t seq, int peer = 0, int tag = 0) const;
  // The error every rank raises when the fingerprints of collective #seq differ
  // (fingerprints[i] = rank i's): which ranks called what.
  [[noreturn]] void fail_mismatch(uint64_t seq, const std::vector<std::string>& fingerprints) const;
  // What a timeout error adds while the debug checks are off: the setting that compares every
  // collective across the ranks before it runs (measured: bench_ddp fingerprint_check_np2), so that
  // a rank that called another one is named at that collective ("" when they are on).
  std::string compare_hint() const;
  // "[all_to_all] split mismatch at #<seq> on group <name>: rank <src> sends <n> rows to rank
  // <dst>, which expects <m>"
  std::string split_mismatch(uint64_t seq, int src, int64_t sends, int dst, int64_t expects) const;

 protected:
  // The number the next operation of `kind` gets: collectives and point-to-point operations count
  // apart. Read and advanced under the backend's issue lock, once the operation is accepted.
  uint64_t& next_number(OpKind kind) { return is_p2p(kind) ? next_p2p_ : next_seq_; }

  BrokenState& broken() const { return *broken_; }
  const std::shared_ptr<BrokenState>& broken_ptr() const { return broken_; }

  // "<name>/<k>", k counting this group's new_group calls: every rank makes the same calls in
  // the same order, so the names agree (non-members count too).
  std::string next_child_name() { return name_ + "/" + std::to_string(children_++); }
  // A child group starts with this group's timeout and debug settings.
  void configure_child(ProcessGroup& child) const;

  // ---- debug fingerprints (TANDEM_DIST_DEBUG=detail) ----
  // What a rank tells the others before a collective, as int64 words: its fingerprint text (cut
  // to fit, ending in a hash of the whole), then for all_to_all the rows it sends to each rank and
  // the rows it expects from each (else -1). fingerprint_words() per rank.
  int64_t fingerprint_words() const { return kFingerprintWords + 2 * static_cast<int64_t>(size_); }
  std::vector<int64_t> pack_fingerprint(const std::string& fingerprint, OpKind kind,
                                        const std::vector<int64_t>& in_splits,
                                        const std::vector<int64_t>& out_splits) const;
  // `table` holds every rank's packed fingerprint in rank order. Throws the mismatch, or for
  // all_to_all the first split a sender and its receiver disagree on. Every rank sees the same
  // table, so every rank throws the same error.
  void check_fingerprints(uint64_t seq, OpKind kind, const int64_t* table) const;

 private:
  static constexpr size_t kFingerprintBytes = 256;
  static constexpr int64_t kFingerprintWords = kFingerprintBytes / 8;

  const int rank_;
  const int size_;
  const std::string name_;
  mutable std::once_flag where_once_;
  mutable std::string where_;  // "group world (mpi, rank 1 of 2)", for describe()
  std::atomic<int64_t> timeout_ms_;
  std::atomic<bool> debug_;
  uint64_t next_seq_ = 0;  // the backend's issue lock
  uint64_t next_p2p_ = 0;
  int children_ = 0;
  const std::shared_ptr<BrokenState> broken_;
  const std::shared_ptr<FlightRecorder> recorder_;
};

}  // namespace tandem::dist
