// A GroupBase that runs its operations on a communication thread, in issue order: the scheduler
// of the mpi and threads backends. A small operation may start on the issuing thread (start());
// under a BlockingIssueGuard the issuing thread runs it to its end.
//
// A backend derives from QueuedGroup and implements execute(), which runs one operation on the
// communication thread (with its deadline) and either returns or throws. A CollectiveError (a
// TimeoutError among them) marks the group broken unless the backend says the group survived it. Internal to dist (not installed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/detail/collective_checks.h"
#include "dist/detail/group_base.h"

namespace tandem::dist {

// An operation started without blocking (QueuedGroup::start): progress() advances it and returns
// true once it is complete, or throws. Whichever thread owns the group's turn calls it: the issuing
// thread first, then the communication thread if the peers were not there yet.
class StartedOp {
 public:
  virtual ~StartedOp() = default;
  virtual bool progress() = 0;
};

// One operation as issued, with the caller's tensors (a backend that moves host memory only stages
// device tensors itself: detail/host_staging.h).
struct Op {
  OpKind kind = OpKind::barrier;
  uint64_t seq = 0;  // collective sequence number, or p2p number for send/recv
  ReduceOp reduce = ReduceOp::sum;
  int root = 0;      // broadcast root, send dst, recv src
  int tag = 0;
  TensorList inputs;   // allreduce*: the tensors (in place); broadcast: the tensor; ...
  TensorList outputs;  // allgather*, reduce_scatter*, all_to_all: the outputs
  std::vector<int64_t> out_splits, in_splits;  // all_to_all rows per rank (filled in for equal)
  std::vector<int> ranks;                       // new_group
  std::string fingerprint;                      // what this rank called, comparable across ranks
  Clock::time_point deadline;
  Milliseconds timeout{0};
  bool debug = false;  // the group's debug checks when it was issued (fingerprints are exchanged first)
  uint64_t record = 0;  // its id in the group's flight recorder
  WorkPtr work;
  std::unique_ptr<StartedOp> started;  // begun on the issuing thread; the communication thread finishes it
};

class QueuedGroup : public GroupBase {
 public:
  // `broken`: the group's broken state (GroupBase's), e.g. one that records breaks process-wide.
  QueuedGroup(int rank, int size, std::string name,
              std::shared_ptr<BrokenState> broken = std::make_shared<BrokenState>());
  ~QueuedGroup() override;

  WorkPtr allreduce(const Tensor& tensor, ReduceOp op) override;
  WorkPtr allreduce_coalesced(const TensorList& tensors, ReduceOp op) override;
  WorkPtr broadcast(const Tensor& tensor, int root) override;
  WorkPtr allgather(const TensorList& outputs, const Tensor& input) override;
  WorkPtr allgather_into(const Tensor& output, const Tensor& input) override;
  WorkPtr reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp op) override;
  WorkPtr reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op) override;
  WorkPtr all_to_all(const Tensor& output, const Tensor& input, const AllToAllSplits& splits) override;
  WorkPtr barrier() override;
  WorkPtr send(const Tensor& tensor, int dst, int tag) override;
  WorkPtr recv(const Tensor& tensor, int src, int tag) override;
  ProcessGroupPtr new_group(const std::vector<int>& ranks) override;

  using GroupBase::describe;
  std::string describe(const Op& op) const { return describe(op.kind, op.seq, op.root, op.tag); }

  std::string_view progress_mode() const override { return caller_progress_ ? "caller" : "thread"; }
  void poll() override;

 protected:
  // Runs `op` on the communication thread; returns when done or throws. An op with `started` set
  // was begun by start() and only needs finishing.
  virtual void execute(Op& op) = 0;
  // Runs on the issuing thread before op is numbered and queued (mpi and threads wait for the
  // caller's device work on op's tensors here: see detail/host_staging.h).
  virtual void on_issue(const Op& op) {}
  // The issuing thread's fast path. When the group is idle (nothing queued or running) and
  // can_start(op), the issuing thread calls start(op), which begins it without blocking, and polls
  // progress() for up to kInlineBudget: peers in step finish it before the call returns, saving the
  // two thread hand-offs; otherwise the communication thread takes the started op over. Backends
  // that cannot (threads) keep the defaults.
  virtual bool can_start(const Op&) const { return false; }
  virtual std::unique_ptr<StartedOp> start(Op&) { return nullptr; }
  static constexpr std::chrono::microseconds kInlineBudget{25};
  // Whether execute() compares fingerprints even without debug checks (threads: they are free).
  virtual bool always_fingerprints() const { return false; }
  // Caller-progress mode (set before the first operation): an op that can_start() and does not
  // finish at once stays with the group, holding its turn, and advances when a thread polls it
  // (poll(), or Work::wait() on it or on a then() of it); the communication thread polls it only
  // when nobody has for kStallPoll, and still runs the ops that cannot start. For ranks whose cores
  // are all computing: a communication thread there shares a core with the compute thread and
  // runs only when the scheduler lets it. A pending op past its deadline fails with
  // pending_timeout(op).
  void set_caller_progress(bool on) { caller_progress_ = on; }
  bool caller_progress() const { return caller_progress_; }
  static constexpr std::chrono::microseconds kStallPoll{1000};
  [[noreturn]] virtual void pending_timeout(const Op& op);
  // An op's failure as the user reads it: a backend turns a transport's raw error into one that
  // names the op, the group and what the peers did (a CollectiveError). The default keeps it.
  virtual std::exception_ptr translate_failure(const Op&, std::exception_ptr error) { return error; }
  // The group just broke on this rank, at `op`, for `reason`: a backend that can reach its peers
  // outside the group tells them, so that they stop waiting for it.
  virtual void on_break(const Op&, const std::string& reason) {}
  // An op whose failure broke the group (a timeout, a transport error): the transport may still
  // write into its buffers (a late peer), so a backend keeps them alive.
  virtual void keep_buffers_of_broken(const Op&) {}
  // The error of an op whose wait ended because the group broke meanwhile.
  std::string stopped_by_break(const Op& op) const;
  // Backends call this first in their destructor so the thread stops before their state dies
  // (a pending op is finished, or fails at its deadline, first).
  void stop_comm_thread();
  // new_group: execute() hands the new group (nullptr on non-members) back to the caller.
  void publish_created(const Op& op, ProcessGroupPtr group);

 private:
  WorkPtr issue(Op op);
  WorkPtr issue_p2p(OpKind kind, const char* what, const char* peer_name, const Tensor& tensor, int peer, int tag);
  void run_loop();
  void run_one(Op& op);
  // Starts op and polls it for `budget`; if the peers are late, the communication thread (or in
  // caller-progress mode the pollers) finish it.
  void run_inline(Op op, std::chrono::microseconds budget);
  // Under a BlockingIssueGuard: the issuing thread runs op from start to end (the group's turn
  // is already its own), or waits for the queued op to finish.
  void run_blocking(Op& op);
  static void wait_quietly(const Work& work);
  // Completes op's Work with its result tensors, or fails it (a CollectiveError may break the group).
  void complete(Op& op);
  void fail_op(Op& op, std::exception_ptr error);
  // The communication thread's end of an op: gives the turn back, then completes or fails it.
  void finish_queued(Op& op, std::exception_ptr error);
  void wait_for_earlier_completions() const;
  // Caller progress (see set_caller_progress).
  struct Pending;
  void make_pending(Op op);  // the turn is ours; op is started
  void settle(Op& op, std::exception_ptr error) noexcept;  // completes or fails op, as on the comm thread
  WorkProgress::Poll progress_pending(Pending& p);  // p.mutex held
  void start_thread_locked();  // queue_mutex_ held
  void record_issue(Op& op);    // issue_mutex_ held, op numbered
  void record_start(const Op& op);
  static int64_t recorded_seq(const Op& op);  // the recorder's counters: -1 for send/recv

  std::mutex issue_mutex_;  // sequence numbers follow queue order

  mutable std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;
  bool stopping_ = false;
  bool busy_ = false;  // an op is running (on the communication thread or inline on an issuing thread)
  std::atomic<int> unmarked_{0};  // ops whose turn ended but whose Work is not yet marked
  std::thread thread_;
  std::map<const Work*, ProcessGroupPtr> created_;
  bool caller_progress_ = false;
  std::shared_ptr<Pending> pending_;  // shared with the Works (their WorkProgress)
};

}  // namespace tandem::dist
