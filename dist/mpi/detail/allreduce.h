// The mpi backend's allreduce algorithms, and how its threads wait for MPI requests (Backoff,
// poll_until: the backend's one deadline loop). Internal to the mpi backend (not installed).
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "dist/detail/comm_thread.h"
#include "dist/detail/queued_group.h"
#include "dist/mpi/detail/runtime.h"

namespace tandem::dist {

// How a thread waits for MPI requests. Peers in step complete within a few polls, so it spins
// first (latency); then it yields, which also covers a large transfer in flight; once a peer is
// clearly late (> 1 ms: DDP launches buckets long before slower ranks reach them) it sleeps in
// growing steps up to 100 us, so a waiting comm thread does not keep taking the core from the
// compute threads of its own or another rank. When there is no compute to make room for (a caller
// running a blocking op itself, or a comm thread while some thread of the process is blocked in
// Work::wait) it is patient for as long as the op's `bytes` take at 1 GB/s before sleeping: a rank
// asleep when its peer finishes a large transfer loses up to a sleep of it at every step. During
// compute it is not that patient: a comm thread spinning that long takes the compute threads'
// cores and slows the DDP step down more than it speeds the transfer up.
class Backoff {
 public:
  explicit Backoff(size_t bytes = 0) : transfer_time_(static_cast<int64_t>(bytes)) {}

  void pause() {
    ++polls_;
    if (polls_ < 128) return;
    if (polls_ == 128) start_ = std::chrono::steady_clock::now();
    if (!sleeping_) {
      // The clock is read every 16th pause: a read costs about as much as a poll.
      if ((polls_ & 15) != 0 || patient(std::chrono::steady_clock::now() - start_)) {
        std::this_thread::yield();
        return;
      }
      sleeping_ = true;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(100));
  }

 private:
  bool patient(std::chrono::nanoseconds waited) const {
    if (waited < std::chrono::milliseconds(1)) return true;
    return waited < transfer_time_ && (caller_runs_op() || threads_waiting_on_work() > 0);
  }

  std::chrono::nanoseconds transfer_time_;
  uint64_t polls_ = 0;
  bool sleeping_ = false;
  std::chrono::steady_clock::time_point start_{};
  std::chrono::microseconds sleep_{5};
};


// Calls done() until it returns true, pacing the polls with a Backoff for `bytes` in flight;
// false once `deadline` has passed, or once the running op's group broke meanwhile (a peer said
// so: wait_abandoned). The clock and the flag are read every 64th poll.
template <class Done>
bool poll_until(Clock::time_point deadline, size_t bytes, Done&& done) {
  Backoff backoff(bytes);
  for (uint64_t spin = 0;; ++spin) {
    if (done()) return true;
    if ((spin & 63) == 63 && (Clock::now() > deadline || wait_abandoned())) return false;
    backoff.pause();
  }
}

// Waits for the requests, which move `bytes` in all; false at the deadline.
bool wait_requests(MPI_Request* reqs, int n, Clock::time_point deadline, size_t bytes = 0);

// A group's collective communicator as the algorithms use it: the group's rank and size in it,
// and two scratch areas owned by the thread that runs the group's operations.
class CollectiveComm {
 public:
  CollectiveComm(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  // After an operation failed (its group broken), MPI may still write into the scratch areas (a
  // receive freed with a late peer's message on its way): they are then never freed.
  ~CollectiveComm() {
    if (abandoned_)
      keep_forever(std::make_shared<std::pair<std::vector<char>, std::vector<char>>>(std::move(scratch_[0]),
                                                                                    std::move(scratch_[1])));
  }
  CollectiveComm(const CollectiveComm&) = delete;
  CollectiveComm& operator=(const CollectiveComm&) = delete;
  void abandon() { abandoned_ = true; }
  MPI_Comm comm() const { return comm_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  char* scratch(int which, size_t bytes) {
    auto& s = scratch_[which];
    if (s.size() < bytes) s.resize(bytes);
    return s.data();
  }

 private:
  MPI_Comm comm_;
  int rank_;
  int size_;
  std::vector<char> scratch_[2];  // [0] for the group's packing, [1] for the algorithms
  bool abandoned_ = false;
};

// In place over the group, run to its end on the calling thread (start_allreduce polled with a
// Backoff). False when the deadline passed first (the group is then broken: requests stay posted).
bool allreduce_buffer(CollectiveComm& c, char* data, int64_t count, Dtype dt, ReduceOp reduce, Clock::time_point deadline);
// Begins an in-place allreduce without blocking: the ring for large buffers (from 64 KiB, and
// 32 KiB a rank), else SmallAllreduce. avg divides at the end.
std::unique_ptr<StartedOp> start_allreduce(CollectiveComm& c, char* data, int64_t count, Dtype dt, ReduceOp reduce);

// Ring reduce-scatter then ring allgather, as a StartedOp: each rank sends 2 (n-1)/n of the buffer
// in 2 (n-1) steps. Each progress() tests the step's messages and, once they are in, adds the
// received chunk (reduce-scatter) and posts the next step, so any thread that polls it advances
// it: the communication thread, or in caller-progress mode the compute thread at DDP's gradient
// hooks (QueuedGroup::poll). Needs count >= group size.
class RingAllreduce final : public StartedOp {
 public:
  RingAllreduce(CollectiveComm& c, ReduceOp reduce, char* data, int64_t count, Dtype dt);
  ~RingAllreduce() override;
  bool progress() override;
  int step() const { return step_; }  // the step in flight

 private:
  void post_step();
  void chunks(int& send, int& recv) const;  // the chunks step_ sends and receives
  int64_t lo(int k) const { return count_ * k / c_.size(); }
  int64_t len(int k) const { return lo(k + 1) - lo(k); }

  CollectiveComm& c_;
  ReduceOp reduce_;
  char* data_;
  char* tmp_;  // the received chunk during the reduce-scatter
  int64_t count_;
  Dtype dt_;
  size_t item_;
  int tag_;        // the messages' tag: the allreduce's size (allreduce.cpp)
  uint32_t polls_ = 0;
  int step_ = 0;  // 0 .. n-2 reduce-scatter, n-1 .. 2n-3 allgather
  bool done_ = false;
  std::vector<MPI_Request> reqs_;  // the step's receives, then its sends
  std::vector<MPI_Status> statuses_;
  std::vector<int> recv_bytes_;  // what each receive expects
};

// An allreduce too small for the ring, as a StartedOp, so the issuing thread can begin it and the
// communication thread finish it. With a power-of-two group, recursive doubling: log2(n) rounds,
// each exchanging the whole buffer with rank ^ 2^k and combining in the same order on both
// partners (lower rank's data first), so every rank ends with identical bits. Otherwise one
// MPI_Iallreduce.
class SmallAllreduce final : public StartedOp {
 public:
  SmallAllreduce(CollectiveComm& c, ReduceOp reduce, char* data, int64_t count, Dtype dt);
  ~SmallAllreduce() override;
  bool progress() override;

 private:
  void post_round();

  static constexpr size_t kPieceBytes = 4000;
  static constexpr int kMaxPieces = 8;  // up to 32,000 bytes in pieces; above, whole messages

  CollectiveComm& c_;
  ReduceOp reduce_;
  char* data_;
  char* tmp_ = nullptr;  // set for recursive doubling
  int64_t count_;
  Dtype dt_;
  size_t bytes_;
  int tag_;  // the messages' tag: the allreduce's size (allreduce.cpp)
  uint32_t polls_ = 0;
  int mask_ = 1;
  bool done_ = false;
  MPI_Request reqs_[2 * kMaxPieces] = {};  // the round's receives, then its sends
  MPI_Status statuses_[2 * kMaxPieces] = {};
  int recv_bytes_[kMaxPieces] = {};  // what each receive of the round expects
  int nrecv_ = 0;
  int nreq_ = 0;
};

// The largest allreduce the issuing thread starts itself (QueuedGroup::start): with the peers in
// step it finishes well inside QueuedGroup::kInlineBudget.
constexpr size_t kInlineAllreduceBytes = 32 * 1024;

// acc = op(acc, src) elementwise; p /= divisor (avg after a sum; floating dtypes).
void reduce_local(char* acc, const char* src, int64_t count, Dtype dt, ReduceOp r);
void divide_buffer(void* p, int64_t n, Dtype dt, int divisor);

}  // namespace tandem::dist
