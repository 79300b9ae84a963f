// The nccl backend's communicator: checked NCCL calls, the dtype and reduce-op mapping, the
// bounded waits a non-blocking communicator needs (creation, enqueueing), and NcclComm, which owns
// the communicator, its comm stream and the watchdog thread that completes the collectives in
// flight. Internal to the nccl backend (not installed); only compiled with
// TANDEM_WITH_NCCL.
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/runtime.h"
#include "dist/detail/flight_recorder.h"
#include "dist/detail/group_base.h"

namespace tandem::dist {

// ---- checked NCCL calls ----

// "[nccl] ncclAllReduce(...) failed at dist/nccl/group.cpp:412: unhandled cuda error (...)"
[[noreturn]] void throw_nccl_error(ncclResult_t rc, const char* call, const char* file, int line);

#define TANDEM_NCCL_CHECK(call)                                                   \
  do {                                                                            \
    ncclResult_t tandem_nccl_rc_ = (call);                                        \
    if (tandem_nccl_rc_ != ncclSuccess) [[unlikely]]                              \
      ::tandem::dist::throw_nccl_error(tandem_nccl_rc_, #call, __FILE__, __LINE__); \
  } while (0)

ncclDataType_t nccl_type(Dtype d);
ncclRedOp_t nccl_op(ReduceOp r, Dtype d);

// "5 s", "400 ms"
std::string duration_text(Milliseconds t);

// Tandem's communicators are non-blocking (ncclConfig_t::blocking = 0): a call may return
// ncclInProgress while NCCL finishes it in the background (creating the communicator, connecting
// to the peers before a first collective, enqueueing a group), so that a peer that never comes
// cannot hold the calling thread inside NCCL. This polls the communicator's state until that work
// is done and returns the state; ncclInProgress means the deadline passed, or `broken` was set (the
// communicator is being aborted by another thread), first. Never throws.
ncclResult_t nccl_wait_ready(ncclComm_t comm, Clock::time_point deadline, const BrokenState* broken = nullptr) noexcept;

struct NcclComm;

// The NCCL calls of one operation, made on the communicator's comm stream. A call that returns
// ncclInProgress has not necessarily put its work on the stream yet, so whatever comes next on the
// stream (a copy, the completion event) must wait until it has: every call goes through check()
// (TANDEM_NCCL_ENQUEUE), which waits for that, bounded by the operation's deadline.
struct NcclLaunch {
  const NcclComm& owner;
  ncclComm_t comm;
  cudaStream_t stream;
  const std::string& what;  // "allreduce #3 on group world (nccl, rank 0 of 2)"
  Milliseconds timeout;
  Clock::time_point deadline;

  // Returns once NCCL has enqueued the call; throws the NCCL error, a TimeoutError at the
  // deadline (naming the operation), or the broken group's error when another thread broke it.
  void check(ncclResult_t rc, const char* call, const char* file, int line) const;
};

#define TANDEM_NCCL_ENQUEUE(launch, call) (launch).check((call), #call, __FILE__, __LINE__)

// ncclGroupStart/End around several calls; the destructor closes a group left open by a throw
// (the launch then fails, and the communicator is aborted).
class NcclCallGroup {
 public:
  explicit NcclCallGroup(const NcclLaunch& launch) : launch_(launch) { TANDEM_NCCL_CHECK(ncclGroupStart()); }
  ~NcclCallGroup() {
    if (open_) (void)ncclGroupEnd();
  }
  NcclCallGroup(const NcclCallGroup&) = delete;
  NcclCallGroup& operator=(const NcclCallGroup&) = delete;
  void end() {
    open_ = false;
    TANDEM_NCCL_ENQUEUE(launch_, ncclGroupEnd());  // a non-blocking group ends in the background
  }

 private:
  const NcclLaunch& launch_;
  bool open_ = true;
};

// ncclCommInitRank of a non-blocking communicator, bounded by `timeout`: a rank that never joins
// makes it fail with "ncclCommInitRank did not complete within <timeout>" instead of hanging; the
// half-made communicator is aborted. Other NCCL errors are thrown as by TANDEM_NCCL_CHECK.
ncclComm_t init_nccl_comm(int size, const ncclUniqueId& id, int rank, Milliseconds timeout);

// ---- the communicator, its comm stream and its watchdog ----

// One collective in flight: done when `done` (recorded on the comm stream after it) has fired.
struct NcclPending {
  std::string what;  // "allreduce #3 on group world (nccl, rank 0 of 2)"
  std::string kind;  // "allreduce"
  uint64_t seq = 0;
  WorkPtr work;
  TensorList result;  // the Work's result
  TensorList keep;    // inputs and scratch: alive until the collective has finished
  std::shared_ptr<cuda::Event> done;  // shared with the Work's stream wait (Work::order_on_device)
  Milliseconds timeout{0};
  Clock::time_point deadline;
  std::shared_ptr<FlightRecorder> recorder;  // the group's (it may be destroyed while this drains)
  uint64_t record = 0;                       // the collective's id there
  int64_t record_seq = -1;                   // its collective number (-1: send/recv)
};

// What the group and its watchdog thread share (the watchdog keeps it alive while it drains).
struct NcclComm {
  NcclComm(int rank, int size, int device, std::string name);
  // Never throws; a broken communicator is aborted, not flushed.
  ~NcclComm();

  // "nccl group of 2 ranks (group world, rank 0)"
  std::string label() const;
  // The error of a collective under way when the group broke.
  std::exception_ptr broken_error(const std::string& what) const;
  // A completion event, reused once the watchdog and every Work that orders streams on it are done
  // with it.
  std::shared_ptr<cuda::Event> take_event();
  // Hands a launched collective to the watchdog, or fails it if the group broke meanwhile.
  void push(NcclPending p);
  // At most this many collectives are queued on the comm stream: a host that runs ahead of the
  // device (waits are device-ordered) then waits here, never inside a CUDA call on a full launch
  // queue while holding the handle lock.
  static constexpr size_t kMaxInFlight = 64;
  // Returns once fewer than kMaxInFlight collectives are in flight, or the group is broken or
  // stopping (the launch then fails as it would have).
  void wait_for_room();
  void start_watchdog(const std::shared_ptr<NcclComm>& self);
  // Stops the watchdog once the collectives in flight are done (or failed at their deadline).
  void stop() noexcept;
  // Marks the group broken (later calls fail at once) and aborts the communicator; the watchdog
  // then fails what is in flight. Never throws.
  void break_group(const std::string& reason) noexcept;

  const int rank, size, device;
  const std::string name;
  std::atomic<ncclComm_t> comm{nullptr};
  // How long the destructor lets ncclCommFinalize flush before it aborts instead (the group's
  // timeout, kept here because the communicator may outlive the group).
  std::atomic<int64_t> teardown_ms{300'000};
  cuda::Stream stream;  // every collective of the group runs here, in issue order
  cuda::Event ready;    // the caller's stream position, re-recorded per collective (issue lock)
  std::mutex issue_mutex;  // sequence numbers, `ready`, the order of launches
  // Every use of the raw handle `comm` holds this: a launch's NCCL calls (inside the issue lock),
  // the watchdog's error polls, the abort and the teardown, so that ncclCommAbort never frees the
  // communicator under another thread's call (PyTorch's NCCLComm keeps the same rule). It is never
  // held across anything that can wait for the device: a launch allocates before taking it, and a
  // launching thread inside NCCL polls (non-blocking communicator) and lets go once the group is
  // marked broken, so the abort's wait for it is short. Order: issue_mutex, then handle_mutex.
  std::timed_mutex handle_mutex;
  // The group's broken state (GroupBase's), which the watchdog sets too. Its peers are other
  // processes under a launcher: a break is recorded process-wide for the exit (mpi_finalize).
  const std::shared_ptr<BrokenState> broken = std::make_shared<BrokenState>(/*peers_are_processes=*/true);

 private:
  // The watchdog thread: polls the oldest collective's completion event and the communicator's
  // asynchronous error against its deadline, completes or fails its Work.
  void watch();
  // Watchdog only: fails every collective in flight, the first (the one that timed out or failed)
  // with `front_error` when given.
  void fail_pending(std::exception_ptr front_error) noexcept;
  void abort_comm() noexcept;

  std::mutex state_mutex;  // the fields below
  std::condition_variable cv;
  std::condition_variable room_cv;  // wait_for_room
  std::deque<NcclPending> pending;
  std::vector<std::shared_ptr<cuda::Event>> free_events;
  bool stopping = false;
  std::thread watchdog;
};

}  // namespace tandem::dist
