// The flight recorder's ring: every process group owns one FlightRecorder, which keeps its last
// collectives and point-to-point operations (what, how big, the caller's tag, when issued,
// started and ended, how it ended), and the process registry of recorders that a dump walks
// (dist/flight_recorder.h is the public side: tags, dumps, settings). Internal to dist.
//
// Cost: three short critical sections per operation (issue, start, end) on a mutex that only the
// group's issuing and communication threads take, and no allocation once the ring is full
// (an error text is the exception). TANDEM_FLIGHT_RECORDER_ENTRIES=0 keeps only the counters the
// timeout errors use.
#pragma once

#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "dist/detail/group_base.h"

namespace tandem::dist {

enum class FlightState : uint8_t { issued, started, completed, failed };
std::string_view flight_state_name(FlightState s);

struct FlightEntry {
  uint64_t id = 0;   // 1, 2, ... in issue order over all of the group's operations; 0: an empty slot
  uint64_t seq = 0;  // the collective's sequence number (send/recv: the point-to-point number)
  OpKind kind = OpKind::barrier;
  ReduceOp reduce = ReduceOp::sum;
  bool has_reduce = false;
  Dtype dtype = Dtype::f32;
  bool has_dtype = false;
  int64_t numel = 0;  // elements this rank contributes (its input tensors together)
  int tensors = 0;
  int peer = -1;      // broadcast root; send destination; recv source
  int tag = 0;        // send/recv tag
  char caller[48] = {};  // the CollectiveTag on the issuing thread ("ddp bucket 3"), or ""
  int64_t issued_us = 0, started_us = 0, ended_us = 0;  // system clock, microseconds; 0: not yet
  FlightState state = FlightState::issued;
  std::string error;         // how a failed one failed
  std::vector<int> missing;  // a timed-out collective: the ranks found not to have arrived

  // "allreduce sum f32[1024]" (with "root 0", "to 2 tag 5" where they apply): the part every
  // rank of a collective must agree on.
  std::string signature() const;
  // signature() and the caller: "allreduce sum f32[1024] (ddp bucket 3)"
  std::string summary() const;
};

// What a rank can say about one group's collective #seq (the answer to a peer that timed out).
struct FlightPosition {
  int64_t last_issued = -1;     // the newest collective issued on the group (-1: none yet)
  int64_t last_ended = -1;      // the newest that completed or failed
  std::optional<FlightEntry> at_seq;  // the entry of #seq, when issued and still in the ring
  std::optional<FlightEntry> last;    // the newest collective's entry
};

class FlightRecorder {
 public:
  FlightRecorder(std::string group, int rank, int size, size_t capacity);

  // Set by the backend once it knows them (before its first operation).
  void set_backend(std::string backend, std::vector<int> world_ranks);

  // Records an operation as it is issued; the returned id names it to started()/ended().
  uint64_t issued(OpKind kind, uint64_t seq, const TensorList& inputs, std::optional<ReduceOp> reduce, int peer,
                  int tag);
  void started(uint64_t id);
  // `seq`: the collective's number, or -1 for send/recv (the counters follow it even when the
  // entry is no longer in the ring, or there is none).
  void ended(uint64_t id, int64_t seq, bool ok, std::string_view error = {}, const std::vector<int>& missing = {});
  // Takes back the newest entry `id` (an operation refused at issue, which consumed no number).
  void withdraw(uint64_t id);
  // The group broke (the first reason stays).
  void set_broken(std::string_view reason);

  FlightPosition position(uint64_t seq) const;

  struct Snapshot {
    std::string group, backend, broken;
    int rank = 0, size = 0;
    std::vector<int> world_ranks;
    size_t capacity = 0;
    uint64_t recorded = 0;  // operations recorded since the group was made (the ring keeps the last `capacity`)
    std::vector<FlightEntry> entries;  // oldest first
  };
  Snapshot snapshot() const;
  const std::string& group() const { return group_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  std::string backend() const;
  std::vector<int> world_ranks() const;

 private:
  FlightEntry* slot(uint64_t id);  // mutex_ held; null once overwritten (or with no ring)

  const std::string group_;
  const int rank_, size_;
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::string backend_;
  std::vector<int> world_ranks_;
  std::string broken_;
  std::vector<FlightEntry> ring_;  // grows to capacity_, then wraps
  uint64_t next_id_ = 1;
  int64_t last_issued_ = -1, last_ended_ = -1;  // collectives
  int64_t issued_before_ = -1;  // last_issued_ before the newest entry (withdraw)
};

// How a failed operation's error reads in its entry: the message, and for a timeout the ranks it
// found missing. Never throws (`fallback` when the error is no std::exception).
struct FlightFailure {
  std::string what;
  std::vector<int> missing;
};
FlightFailure flight_failure(std::exception_ptr error, std::string fallback = "an unknown error") noexcept;

// Every recorder of the process, for dumps and for the answers to peers: the live groups' and the
// last few destroyed groups'.
std::shared_ptr<FlightRecorder> make_flight_recorder(std::string group, int rank, int size);
// A destroyed group's recorder: kept for the dumps while few others have gone since.
void retire_flight_recorder(const std::shared_ptr<FlightRecorder>& recorder);
// The live recorder of the group called `group` on `backend` in which this process is `rank` (the
// newest such group; a destroyed one never answers).
std::shared_ptr<FlightRecorder> find_flight_recorder(std::string_view group, std::string_view backend, int rank);
// The rank the dump files are named by: the MPI world rank, set once MPI is up (else the
// launcher's OMPI_COMM_WORLD_RANK / PMI_RANK, else 0).
void set_flight_process_rank(int rank);
int flight_process_rank();
// A failure (a broken group, a peer's request): with TANDEM_FLIGHT_RECORDER set, the dump thread
// writes this process's dump soon after (the caller, a communication thread, does not wait for
// the disk); the exit writes one too.
void flight_dump_on_failure(const std::string& reason);
// The same, written before it returns: for a process that is about to end (MPI_Abort).
void flight_dump_now(const std::string& reason) noexcept;
// The sentence an error appends about the dumps: where they are, or how to get them.
std::string flight_dump_hint();

}  // namespace tandem::dist
