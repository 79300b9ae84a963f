// ProcessGroup: the communication interface the rest of dist (and users) talk to, and Work, the
// handle of one asynchronous collective.
//
// Every collective is issued by the caller, gets the group's next sequence number, and runs on
// the group's communication thread in issue order (a small one may finish on the issuing thread,
// see AsyncIssueGuard; under a BlockingIssueGuard any one may; in caller-progress mode the
// threads that poll or wait advance it, see progress_mode()); the caller gets a Work at once. Tensors handed
// to a collective must not be touched until its Work completes. All ranks of a group must issue
// the same collectives in the same order with matching dtypes and shapes (TANDEM_DIST_DEBUG=detail
// checks this); a collective that does not complete within the group's timeout fails, naming the
// collective, its sequence number and the ranks that did not arrive (where the backend knows).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace tandem::dist {

using Milliseconds = std::chrono::milliseconds;

// avg divides the sum by the group size (floating dtypes only). On bool, sum/max are logical or
// and product/min logical and.
enum class ReduceOp : uint8_t { sum, avg, min, max, product };
std::string_view reduce_op_name(ReduceOp op);

class Work;
using WorkPtr = std::shared_ptr<Work>;

// An operation that advances only while some thread polls it: a group in caller-progress mode
// (ProcessGroup::progress_mode) leaves its operations to the threads that wait for them or call
// ProcessGroup::poll. Work::wait() polls the source of its operation instead of sleeping.
class WorkProgress {
 public:
  // idle: nothing this thread can advance now (the operation runs elsewhere, or is queued behind
  // one that does); busy: another thread is advancing it this moment; progressed: this call did.
  enum class Poll { idle, busy, progressed };
  virtual ~WorkProgress() = default;
  virtual Poll poll() = 0;
};

// The handle of one asynchronous operation: completes with result tensors or fails with an
// exception, which wait() rethrows. Continuations added with then() run once it completes (on the
// thread that completes it, usually the communication thread, or at once if already complete).
class Work : public std::enable_shared_from_this<Work> {
 public:
  explicit Work(std::string description);
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // A Work that is already complete with `result` (e.g. for a comm hook that skips communication).
  static WorkPtr completed(TensorList result, std::string description = "completed");

  // Blocks until complete and rethrows its error. The collective's own timeout bounds the wait. A
  // device-ordered Work (see order_on_device) orders the current stream instead of blocking.
  void wait() const;
  // As wait(), but throws "[dist] wait on <op> timed out after <t> ms" when not complete in time
  // (the operation itself keeps running).
  void wait(Milliseconds timeout) const;
  bool is_completed() const;
  bool is_success() const;  // completed without error
  std::exception_ptr exception() const;  // null while running or on success
  // The result tensors (the output tensors of the collective); waits first.
  const TensorList& result() const;
  const std::string& description() const { return description_; }

  // A Work completed with fn(*this)'s return value once this completes successfully. If this fails
  // or fn throws, the returned Work fails with that error.
  WorkPtr then(std::function<TensorList(Work&)> fn);

  // Completion, by whoever runs the operation. Exactly one of the two, once.
  void mark_completed(TensorList result);
  void mark_failed(std::exception_ptr error);

  // Device-ordered completion, for a backend whose operations run on a device stream (the nccl
  // backend's CUDA collectives, as PyTorch's WorkNCCL): the result tensors are known at launch, and
  // wait() runs `make_current_stream_wait` (the calling thread's current stream waits for the
  // operation on the device) instead of blocking the host, so a training step never stops for the
  // host to see a collective finish. wait() still rethrows an error the operation has already
  // reported; one reported later breaks the group, and the next operation on it fails. The backend
  // completes the Work on the host as usual (continuations, is_completed()). Set once, before the
  // Work is handed out.
  void order_on_device(TensorList result, std::function<void()> make_current_stream_wait);
  bool is_device_ordered() const { return static_cast<bool>(stream_wait_); }

  // What advances the operation when nobody else does (see WorkProgress): set by the backend once,
  // before the Work is handed out; then() passes it on to the Works it makes.
  void set_progress(std::shared_ptr<WorkProgress> progress) { progress_ = std::move(progress); }

 private:
  void finish(TensorList result, std::exception_ptr error);
  // Blocks until done or `until`; false at `until`. Polls the progress source while it can.
  bool block(std::unique_lock<std::mutex>& lock, const std::chrono::steady_clock::time_point* until) const;

  std::string description_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  TensorList result_;  // for a device-ordered Work: set at launch, never changed
  std::vector<std::function<void()>> continuations_;
  std::function<void()> stream_wait_;  // order_on_device
  std::shared_ptr<WorkProgress> progress_;  // immutable once handed out
};

struct AllToAllSplits {
  std::vector<int64_t> output;  // rows (dim 0) received from each rank; empty = equal split
  std::vector<int64_t> input;   // rows sent to each rank; empty = equal split
};

// The communication interface. Issue methods validate their arguments at once (throwing
// "[allreduce] ..." etc. without consuming a sequence number) and return a Work.
class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;  // "threads", "mpi"
  virtual std::string name() const = 0;           // "world", "world/1", ...

  // The time a collective may take before it fails (and, where it cannot be cancelled, breaks the
  // group). Default 300 s, or TANDEM_DIST_TIMEOUT (seconds) at group creation.
  virtual void set_timeout(Milliseconds timeout) = 0;
  virtual Milliseconds timeout() const = 0;
  // Cross-rank fingerprint checks of every collective (op, sequence number, dtype, shapes);
  // on by default when TANDEM_DIST_DEBUG=detail. Must be set the same way on every rank.
  virtual void set_debug_checks(bool on) = 0;
  virtual bool debug_checks() const = 0;
  // A broken group (after a collective timed out and could not be cancelled) fails every later
  // operation at once with the reason.
  virtual bool is_broken() const = 0;

  // ---- what callers adapt to, instead of asking for the backend's name ----
  // Where small control tensors (DDP's used map, its bucket order) live for this group: the
  // parameters' device where the backend communicates device memory only (nccl), else the CPU.
  virtual Device control_device(Device params_device) const { return kCPU; }
  // Runs fn, from a Work continuation (after a collective completed), with the group's step stream
  // current on its device, so the device work fn queues (DDP's optimizer step in backward, a
  // compress hook's cast back) follows the reduction on the device with no host round trip and
  // never touches the communication stream (a non-blocking NCCL call may still be enqueueing
  // there). fn returns the tensors it used that others read or free later (kept gradients, the
  // buffers it read): the allocator does not reuse them before the step stream, and the stream of
  // the next join_step_stream, are done with them. A group without device streams just calls fn.
  virtual void run_on_step_stream(const std::function<TensorList()>& fn) { fn(); }
  // The calling thread's current stream waits, on the device and without blocking the host, for
  // everything queued on the step stream so far (what run_on_step_stream queued). DDP calls it at
  // the end of every backward.
  virtual void join_step_stream() {}
  // Whether, under a BlockingIssueGuard, a collective on tensors of `device` has finished when
  // its call returns. False for the nccl group's CUDA tensors: they are ordered on the device.
  virtual bool supports_blocking_issue(Device device) const { return true; }
  // How operations advance while the caller computes. "thread": a communication thread runs them.
  // "caller": they advance only when a thread polls them (poll(), Work::wait()), with the
  // communication thread polling once a millisecond when nobody does; the mpi groups use it where
  // the rank has no core to spare for a communication thread (TANDEM_DIST_PROGRESS, README).
  virtual std::string_view progress_mode() const { return "thread"; }
  // Advances this group's operations by a step without blocking (a few microseconds; nothing to do
  // in "thread" mode). DDP calls it from every gradient hook; a loop that issues its own collectives
  // and computes before waiting may call it between its steps.
  virtual void poll() {}

  // In place: every rank ends with the reduction of all ranks' tensors.
  virtual WorkPtr allreduce(const Tensor& tensor, ReduceOp op = ReduceOp::sum) = 0;
  // In place on each tensor of the list (one dtype), as one operation.
  virtual WorkPtr allreduce_coalesced(const TensorList& tensors, ReduceOp op = ReduceOp::sum) = 0;
  // In place: every rank ends with root's tensor.
  virtual WorkPtr broadcast(const Tensor& tensor, int root = 0) = 0;
  // outputs[i] (one per rank, each shaped like input) gets rank i's input.
  virtual WorkPtr allgather(const TensorList& outputs, const Tensor& input) = 0;
  // output (size() * input.numel() elements) gets the inputs concatenated in rank order.
  virtual WorkPtr allgather_into(const Tensor& output, const Tensor& input) = 0;
  // output gets the reduction over ranks of inputs[rank()] (one input per rank, shaped like output).
  virtual WorkPtr reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op = ReduceOp::sum) = 0;
  // output gets the reduction of chunk rank() of input (size() * output.numel() elements).
  virtual WorkPtr reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op = ReduceOp::sum) = 0;
  // Splits input along dim 0 and sends part i to rank i; output receives rank i's part at
  // position i. Equal splits need dim 0 divisible by size(); uneven ones list rows per rank.
  virtual WorkPtr all_to_all(const Tensor& output, const Tensor& input, const AllToAllSplits& splits = {}) = 0;
  virtual WorkPtr barrier() = 0;
  // Point to point (in issue order with the collectives; not fingerprinted). The receiver's
  // tensor must match the sender's dtype and element count.
  virtual WorkPtr send(const Tensor& tensor, int dst, int tag = 0) = 0;
  virtual WorkPtr recv(const Tensor& tensor, int src, int tag = 0) = 0;

  // A sub-group of the listed ranks of this group (in that order: ranks[i] becomes rank i).
  // Collective over this group: every rank calls it with the same list; ranks not in the list get
  // nullptr. Blocks until the group exists.
  virtual std::shared_ptr<ProcessGroup> new_group(const std::vector<int>& ranks) = 0;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

// Small collectives issued while their group is idle may run on the issuing thread for a few tens
// of microseconds (the mpi backend does this for a CPU allreduce of up to 32 KiB): when the peers
// are in step the Work is already complete when allreduce() returns, with no hand-off to the
// communication thread and back; otherwise the communication thread takes it over and the call
// returns. While an AsyncIssueGuard lives, collectives issued on this thread always go to the
// communication thread at once, so a late peer never holds up the caller. DDP's reducer holds one
// while it launches buckets, which must overlap with backward.
class AsyncIssueGuard {
 public:
  AsyncIssueGuard();
  ~AsyncIssueGuard();
  AsyncIssueGuard(const AsyncIssueGuard&) = delete;
  AsyncIssueGuard& operator=(const AsyncIssueGuard&) = delete;
};
// False on this thread while an AsyncIssueGuard lives.
bool inline_issue_allowed();

// PyTorch's async_op=False: while a BlockingIssueGuard lives, a collective (or send/recv) issued
// on this thread has finished, successfully or not, when the call returns; its Work's wait()
// rethrows any error as usual. While the group is idle the issuing thread runs it itself, from
// start to end, saving the hand-off to the communication thread and back (two thread wake-ups);
// while the group is busy the call queues it and waits.
// Use it where each result is needed before the next step (a loss averaged for logging, a
// parameter broadcast). An AsyncIssueGuard on the same thread takes precedence, and continuations
// keep running where the op completes (here, on the issuing thread). The nccl group ignores it for
// CUDA tensors (ProcessGroup::supports_blocking_issue): they are stream-ordered, not waited on by
// the host.
class BlockingIssueGuard {
 public:
  BlockingIssueGuard();
  ~BlockingIssueGuard();
  BlockingIssueGuard(const BlockingIssueGuard&) = delete;
  BlockingIssueGuard& operator=(const BlockingIssueGuard&) = delete;
};
// True on this thread while a BlockingIssueGuard lives and no AsyncIssueGuard does.
bool blocking_issue_requested();

}  // namespace tandem::dist
