// The nccl communicator and its watchdog (see comm.h). Only compiled with TANDEM_WITH_NCCL.
#ifdef TANDEM_WITH_NCCL

#include "dist/nccl/detail/comm.h"

#include <fmt/format.h>

#include <chrono>
#include <thread>

#include "dist/detail/comm_thread.h"
#include "dist/detail/peer_probe.h"

namespace tandem::dist {

std::string duration_text(Milliseconds t) {
  return t.count() % 1000 == 0 ? fmt::format("{} s", t.count() / 1000) : fmt::format("{} ms", t.count());
}

void throw_nccl_error(ncclResult_t rc, const char* call, const char* file, int line) {
  std::string_view fn(call);
  fn = fn.substr(0, fn.find('('));
  std::string_view where(file);
  if (size_t p = where.rfind("dist/"); p != std::string_view::npos) where = where.substr(p);
  const char* detail = ncclGetLastError(nullptr);
  fail("[nccl] {}(...) failed at {}:{}: {}{}", fn, where, line, ncclGetErrorString(rc),
       detail && *detail ? fmt::format(" ({})", detail) : std::string());
}

ncclDataType_t nccl_type(Dtype d) {
  switch (d) {
    case f32: return ncclFloat32;
    case f64: return ncclFloat64;
    case f16: return ncclFloat16;
    case bf16: return ncclBfloat16;
    case i32: return ncclInt32;
    case i64: return ncclInt64;
    case boolean: return ncclUint8;  // 0/1 bytes: or = max, and = min
  }
  return ncclUint8;
}

ncclRedOp_t nccl_op(ReduceOp r, Dtype d) {
  if (d == boolean) return (r == ReduceOp::sum || r == ReduceOp::max) ? ncclMax : ncclMin;
  switch (r) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::min: return ncclMin;
    case ReduceOp::max: return ncclMax;
    case ReduceOp::product: return ncclProd;
  }
  return ncclSum;
}

ncclResult_t nccl_wait_ready(ncclComm_t comm, Clock::time_point deadline, const BrokenState* broken) noexcept {
  // Enqueueing usually finishes within microseconds: spin on it first; connecting to the peers or
  // creating the communicator takes longer: then poll gently.
  for (uint64_t spin = 0;; ++spin) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if ((spin & 15) == 15 && (Clock::now() >= deadline || (broken && broken->is_broken()))) return ncclInProgress;
    if (spin < 1000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

void NcclLaunch::check(ncclResult_t rc, const char* call, const char* file, int line) const {
  if (rc == ncclInProgress) rc = nccl_wait_ready(comm, deadline, owner.broken.get());
  if (rc == ncclSuccess) [[likely]] return;
  if (rc != ncclInProgress) throw_nccl_error(rc, call, file, line);
  // Still in progress: another thread broke the group (and is aborting the communicator), or the
  // deadline passed with NCCL waiting for a peer.
  if (owner.broken->is_broken()) throw Error(owner.broken->message(what));
  std::string_view fn(call);
  fn = fn.substr(0, fn.find('('));
  throw TimeoutError(fmt::format("[dist] {} timed out after {}: NCCL did not finish setting up {} (a rank that never "
                                 "connects); the communicator was aborted and the group is broken",
                                 what, duration_text(timeout), fn),
                     false);
}

ncclComm_t init_nccl_comm(int size, const ncclUniqueId& id, int rank, Milliseconds timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see nccl_wait_ready: every call on this communicator may return ncclInProgress
  ncclComm_t c = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&c, size, id, rank, &config);
  if (rc == ncclInProgress) rc = nccl_wait_ready(c, Clock::now() + timeout);
  if (rc == ncclSuccess) return c;
  // The error text first: aborting may replace NCCL's last error.
  std::string detail;
  if (const char* last = ncclGetLastError(c); last && *last) detail = fmt::format(" ({})", last);
  if (c != nullptr) (void)ncclCommAbort(c);  // the failure is reported below; nothing to add
  if (rc == ncclInProgress) {
    fail("ncclCommInitRank did not complete within {}: a rank did not join (each rank of the group must create it; "
         "TANDEM_DIST_TIMEOUT sets the limit); the communicator was aborted",
         duration_text(timeout));
  }
  fail("ncclCommInitRankConfig(...) failed: {}{}", ncclGetErrorString(rc), detail);
}

NcclComm::NcclComm(int rank_, int size_, int device_, std::string name_)
    : rank(rank_), size(size_), device(device_), name(std::move(name_)) {
  cuda::DeviceGuard guard(device);
  stream = cuda::Stream::create(device, -1);  // high priority: gradients leave as soon as ready
}

NcclComm::~NcclComm() {
  std::lock_guard handle(handle_mutex);  // no other user is left; kept for the rule's sake
  ncclComm_t c = comm.exchange(nullptr);
  if (c == nullptr) return;
  // Never throws. Once the CUDA runtime is shutting down (a group destroyed at exit) NCCL cannot
  // be torn down safely: the process is ending anyway. A broken communicator is aborted, not flushed.
  if (cudaSetDevice(device) != cudaSuccess) return;
  if (!broken->is_broken()) {
    // A non-blocking communicator is flushed in the background (ncclCommFinalize returns
    // ncclInProgress); a flush that does not end within the timeout is abandoned for an abort.
    ncclResult_t rc = ncclCommFinalize(c);
    if (rc == ncclInProgress) rc = nccl_wait_ready(c, Clock::now() + Milliseconds(teardown_ms.load()));
    if (rc == ncclSuccess) {
      (void)ncclCommDestroy(c);  // after a finalize only frees local resources; nothing to report to
      return;
    }
  }
  (void)ncclCommAbort(c);
}

std::string NcclComm::label() const {
  return fmt::format("nccl group of {} rank{} (group {}, rank {})", size, size == 1 ? "" : "s", name, rank);
}

std::exception_ptr NcclComm::broken_error(const std::string& what) const {
  return std::make_exception_ptr(
      Error(fmt::format("[dist] {} failed: the group is broken ({})", what, broken->reason())));
}

std::shared_ptr<cuda::Event> NcclComm::take_event() {
  std::lock_guard lock(state_mutex);
  // An event still shared with a Work that may order a stream on it must not be re-recorded.
  for (size_t i = free_events.size(); i-- > 0;) {
    if (free_events[i].use_count() != 1) continue;
    std::shared_ptr<cuda::Event> e = std::move(free_events[i]);
    free_events.erase(free_events.begin() + static_cast<std::ptrdiff_t>(i));
    return e;
  }
  return std::make_shared<cuda::Event>(false);
}

void NcclComm::push(NcclPending p) {
  bool pushed = false;
  {
    std::lock_guard lock(state_mutex);
    if (!broken->is_broken()) {
      pending.push_back(std::move(p));
      pushed = true;
    }
  }
  if (pushed) {
    cv.notify_one();
    return;
  }
  if (p.recorder) p.recorder->ended(p.record, p.record_seq, false, broken->reason());
  p.work->mark_failed(broken_error(p.what));
}

void NcclComm::wait_for_room() {
  std::unique_lock lock(state_mutex);
  room_cv.wait(lock, [&] { return pending.size() < kMaxInFlight || stopping || broken->is_broken(); });
}

void NcclComm::start_watchdog(const std::shared_ptr<NcclComm>& self) {
  watchdog = std::thread([self] { self->watch(); });
}

void NcclComm::stop() noexcept {
  {
    std::lock_guard lock(state_mutex);
    stopping = true;
  }
  cv.notify_all();
  if (!watchdog.joinable()) return;
  if (std::this_thread::get_id() == watchdog.get_id()) {
    watchdog.detach();  // the last reference went away in a continuation: the thread finishes alone
  } else {
    watchdog.join();
  }
}

void NcclComm::break_group(const std::string& reason) noexcept {
  try {
    broken->mark(reason);  // first: a launching thread polling inside NCCL sees it and lets go
  } catch (...) {
  }
  abort_comm();
  cv.notify_all();
  room_cv.notify_all();
}

void NcclComm::fail_pending(std::exception_ptr front_error) noexcept {
  std::deque<NcclPending> failed;
  {
    std::lock_guard lock(state_mutex);
    failed.swap(pending);
  }
  room_cv.notify_all();
  bool first = true;
  for (NcclPending& p : failed) {
    try {
      std::exception_ptr error = first && front_error ? front_error : broken_error(p.what);
      if (p.recorder) {
        const FlightFailure f = flight_failure(error, broken->reason());
        p.recorder->ended(p.record, p.record_seq, false, f.what, f.missing);
        if (first) p.recorder->set_broken(broken->reason());
      }
      p.work->mark_failed(error);
    } catch (...) {
    }
    first = false;
  }
  if (!failed.empty()) flight_dump_on_failure(broken->reason());
}

void NcclComm::abort_comm() noexcept {
  // The handle lock (see comm.h): no other thread is inside an NCCL call with this communicator
  // while it is aborted and freed, and none starts one after (they find `comm` null). Its holders
  // only make non-blocking NCCL calls and let go once the group is marked broken, so it comes
  // within milliseconds; should a holder ever be stuck for good (a CUDA call that waits for the
  // device this abort would release), aborting without it is the lesser evil than a hang.
  std::unique_lock handle(handle_mutex, std::defer_lock);
  (void)handle.try_lock_for(std::chrono::seconds(5));
  ncclComm_t c = comm.exchange(nullptr);
  if (c != nullptr) {
    (void)cudaSetDevice(device);
    (void)ncclCommAbort(c);
  }
}

void NcclComm::watch() {
  set_on_comm_thread(true);  // continuations run here: a blocking wait inside one is reported
  (void)cudaSetDevice(device);
  for (;;) {
    NcclPending* front = nullptr;
    {
      std::unique_lock lock(state_mutex);
      cv.wait(lock, [&] { return stopping || !pending.empty(); });
      if (pending.empty()) return;  // stopping and drained
      front = &pending.front();  // only this thread pops; push_back keeps references valid
    }
    if (broken->is_broken()) {  // broken by an issuing thread (a launch that failed half-way)
      fail_pending(nullptr);
      continue;
    }
    // The collectives complete in order on the comm stream: only the oldest needs polling, and
    // its deadline is the earliest.
    std::string failure;
    std::vector<int> missing;  // a timeout's, where the peers could be asked
    bool timed_out = false, done = false;
    uint64_t busy_polls = 0;  // polls that found a launch holding the handle lock
    const Clock::time_point polling_since = Clock::now();
    for (uint64_t spin = 0;; ++spin) {
      try {
        done = front->done->query();
      } catch (const std::exception& e) {
        failure = fmt::format("[dist] {} failed on {}: {}; the communicator was aborted and the group is broken",
                              front->what, label(), e.what());
        break;
      }
      if (done) break;
      if ((spin & 15) == 15) {
        if (broken->is_broken()) break;  // failure stays empty: fail_pending below gives the reason
        // Under the handle lock (comm.h).
        ncclResult_t async = ncclSuccess, rc = ncclSuccess;
        std::string detail;
        // A launch holds the lock only for its NCCL calls: skip a busy round, but not forever (an
        // asynchronous error must not wait for the collective's timeout).
        std::unique_lock handle(handle_mutex, std::defer_lock);
        if (handle.try_lock() || ++busy_polls % 64 == 0) {
          if (!handle.owns_lock()) handle.lock();
          ncclComm_t c = comm.load();
          rc = c ? ncclCommGetAsyncError(c, &async) : ncclInvalidUsage;
          if (rc != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
            if (const char* last = c ? ncclGetLastError(c) : nullptr; last && *last) detail = fmt::format(" ({})", last);
          }
        }
        if (rc != ncclSuccess || (async != ncclSuccess && async != ncclInProgress)) {
          ncclResult_t shown = rc != ncclSuccess ? rc : async;
          failure = fmt::format(
              "[dist] {} #{} failed on {}: NCCL reported an asynchronous error: {}{} (a peer failed or left); the "
              "communicator was aborted and the group is broken",
              front->kind, front->seq, label(), ncclGetErrorString(shown), detail);
          break;
        }
        if (Clock::now() > front->deadline) {
          timed_out = true;  // described below, outside the handle lock
          break;
        }
      }
      // Spin briefly for small collectives' latency, then poll gently, then lazily (a collective
      // queued behind a long stretch of the caller's compute).
      if (spin < 2000) {
        std::this_thread::yield();
      } else if (Clock::now() - polling_since < std::chrono::milliseconds(100)) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(500));
      }
    }
    if (timed_out) {
      // NCCL cannot say who is missing: the ranks are asked over MPI where they are, when
      // launched by mpirun (detail/peer_probe.h).
      std::optional<PeerReport> peers = front->recorder ? probe_peers(*front->recorder, front->seq) : std::nullopt;
      if (peers) missing = peers->missing;
      failure = fmt::format(
          "[dist] {} #{} timed out after {} on {}; {}; the communicator was aborted and the group is broken. {}",
          front->kind, front->seq, duration_text(front->timeout), label(),
          peers ? peers->text : "NCCL cannot tell which ranks did not arrive (TANDEM_DIST_DEBUG=detail checks "
                                "that every rank called it)",
          flight_dump_hint());
    }
    if (!failure.empty()) {
      std::exception_ptr e = timed_out ? std::make_exception_ptr(TimeoutError(failure, false, missing))
                                       : std::make_exception_ptr(Error(failure));
      break_group(failure);
      fail_pending(e);
      continue;
    }
    if (!done) {  // broken meanwhile by an issuing thread
      fail_pending(nullptr);
      continue;
    }
    NcclPending p;
    {
      std::lock_guard lock(state_mutex);
      p = std::move(pending.front());
      pending.pop_front();
      room_cv.notify_all();
      if (free_events.size() < 64) free_events.push_back(std::move(p.done));
    }
    if (p.recorder) p.recorder->ended(p.record, p.record_seq, true);
    try {
      p.work->mark_completed(std::move(p.result));  // runs the continuations, on this thread
    } catch (...) {
    }
  }
}

}  // namespace tandem::dist

#endif  // TANDEM_WITH_NCCL
