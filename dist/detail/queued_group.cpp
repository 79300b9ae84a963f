#include "dist/detail/queued_group.h"

#include <fmt/format.h>

#include <map>
#include <optional>

#include "core/trace.h"
#include "dist/detail/comm_thread.h"
#include "dist/detail/flight_recorder.h"

namespace tandem::dist {

namespace {
thread_local bool tls_polling = false;  // this thread is inside a pending op's poll

// While it lives, polls on this thread return idle: inside a poll, and while this thread completes
// an op (a continuation that polls must not wait, in wait_for_earlier_completions, for itself).
struct NoNestedPolls {
  NoNestedPolls() : was_(tls_polling) { tls_polling = true; }
  ~NoNestedPolls() { tls_polling = was_; }
  NoNestedPolls(const NoNestedPolls&) = delete;
  NoNestedPolls& operator=(const NoNestedPolls&) = delete;

 private:
  bool was_;
};

int64_t now_ns() { return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count(); }

// Continuations of an op completed by a poll run as on the communication thread: a wait() inside
// one is reported instead of deadlocking, and what one issues is queued.
class AsCommThread {
 public:
  AsCommThread() : was_(on_comm_thread()) { set_on_comm_thread(true); }
  ~AsCommThread() { set_on_comm_thread(was_); }
  AsCommThread(const AsCommThread&) = delete;
  AsCommThread& operator=(const AsCommThread&) = delete;

 private:
  bool was_;
};
}  // namespace

// The op a caller-progress group leaves to its pollers. `mutex` is the right to advance it: a
// poll that finds it taken returns at once.
struct QueuedGroup::Pending final : WorkProgress {
  std::mutex mutex;
  QueuedGroup* group = nullptr;  // cleared (under mutex) once the group stops
  std::optional<Op> op;          // under mutex
  std::atomic<bool> active{false};  // op is set: read without the mutex
  std::atomic<int64_t> last_poll_ns{0};

  Poll poll() override {
    if (tls_polling || !active.load(std::memory_order_acquire)) return Poll::idle;
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return Poll::busy;
    if (group == nullptr || !op) return Poll::idle;
    NoNestedPolls polling;
    return group->progress_pending(*this);
  }
};

QueuedGroup::QueuedGroup(int rank, int size, std::string name, std::shared_ptr<BrokenState> broken)
    : GroupBase(rank, size, std::move(name), default_timeout(), default_debug_checks(), std::move(broken)),
      pending_(std::make_shared<Pending>()) {
  pending_->group = this;
}

QueuedGroup::~QueuedGroup() { stop_comm_thread(); }

WorkPtr QueuedGroup::issue(Op op) {
  on_issue(op);
  op.debug = debug_checks();
  // Run on this thread only where nothing could be waiting on its progress: not on a
  // communication thread (continuations), not under an AsyncIssueGuard. Blocking runs any op to
  // its end here; inline starts a small one and hands it over if the peers are late.
  const bool blocking = !on_comm_thread() && blocking_issue_requested();
  const bool may_inline = !blocking && !on_comm_thread() && inline_issue_allowed() && can_start(op);
  // Caller progress: an op that can start begins here even under an AsyncIssueGuard (one poll, no
  // spinning) and stays pending on the group.
  const bool may_pend = caller_progress_ && !blocking && !on_comm_thread() && can_start(op);
  WorkPtr work;
  bool run_here = false;
  {
    std::lock_guard issue_lock(issue_mutex_);
    uint64_t& number = next_number(op.kind);
    op.seq = number;
    op.timeout = timeout();
    std::string what = describe(op);
    op.work = std::make_shared<Work>(what);
    if (caller_progress_) op.work->set_progress(pending_);
    work = op.work;
    record_issue(op);
    {
      std::lock_guard lock(queue_mutex_);
      try {
        broken().check(what);
        TANDEM_CHECK(!stopping_, "[dist] cannot run {}: the group is shut down", what);
      } catch (...) {
        recorder().withdraw(op.record);  // refused: it consumed no number
        throw;
      }
      run_here = (blocking || may_inline || may_pend) && queue_.empty() && !busy_;
      if (run_here) {
        busy_ = true;  // the group's turn is ours: later ops queue behind this one
      } else {
        start_thread_locked();
        queue_.push_back(std::move(op));
      }
    }
    ++number;
  }
  if (!run_here) {
    queue_cv_.notify_one();
    if (blocking) wait_quietly(*work);
  } else if (blocking) {
    run_blocking(op);
  } else {
    run_inline(std::move(op), may_inline ? kInlineBudget : std::chrono::microseconds(0));
  }
  return work;
}

void QueuedGroup::record_issue(Op& op) {
  std::optional<ReduceOp> reduce;
  switch (op.kind) {
    case OpKind::allreduce:
    case OpKind::allreduce_coalesced:
    case OpKind::reduce_scatter:
    case OpKind::reduce_scatter_tensor: reduce = op.reduce; break;
    default: break;
  }
  const int peer = op.kind == OpKind::broadcast || is_p2p(op.kind) ? op.root : -1;
  op.record = recorder().issued(op.kind, op.seq, op.inputs, reduce, peer, op.tag);
}

void QueuedGroup::record_start(const Op& op) { recorder().started(op.record); }

int64_t QueuedGroup::recorded_seq(const Op& op) { return is_p2p(op.kind) ? -1 : static_cast<int64_t>(op.seq); }

void QueuedGroup::start_thread_locked() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run_loop(); });
}

void QueuedGroup::run_blocking(Op& op) {
  // The op before ours may have given its turn back and still be marking its Work: ours must
  // complete after it (and no later op can start before ours ends: the turn is ours).
  wait_for_earlier_completions();
  // This thread does what the communication thread would, with its rules: continuations run
  // here, and a wait() inside one is the same error.
  struct AsCommThread {
    AsCommThread() {
      set_on_comm_thread(true);
      set_caller_runs_op(true);
    }
    ~AsCommThread() {
      set_on_comm_thread(false);
      set_caller_runs_op(false);
    }
  } as_comm_thread;
  run_one(op);
}

void QueuedGroup::wait_quietly(const Work& work) {
  // Queued behind a running op: the communication thread runs ours next. Its error, if any, stays
  // in the Work for the caller's wait(); this call only promises it has finished.
  try {
    work.wait();
  } catch (...) {
  }
}

void QueuedGroup::run_inline(Op op, std::chrono::microseconds budget) {
  // On the issuing thread's track: the start and the polls (the communication thread's track
  // shows the rest when the peers are late).
  TANDEM_TRACE_SCOPE(op_kind_name(op.kind).data(), "comm");
  op.deadline = Clock::now() + op.timeout;
  bool pend = false;
  try {
    record_start(op);
    std::unique_ptr<StartedOp> started = start(op);
    const auto budget_end = std::min(Clock::now() + budget, op.deadline);
    bool done = started->progress();
    // The clock is read every 16 polls: reading it costs about as much as one poll.
    for (uint32_t polls = 1; !done && budget.count() > 0; ++polls) {
      if ((polls & 15) == 0 && Clock::now() >= budget_end) break;
      done = started->progress();
    }
    if (!done && caller_progress_) {
      op.started = std::move(started);
      pend = true;  // the pollers finish it: made pending below, outside this try
    } else if (!done) {
      op.started = std::move(started);
      // The peers are not there yet: the communication thread finishes it (ahead of anything
      // queued meanwhile, which was issued later) and this call returns.
      {
        std::lock_guard lock(queue_mutex_);
        TANDEM_CHECK(!stopping_, "[dist] {} was abandoned: the group was shut down while it ran",
                     op.work->description());
        if (!thread_.joinable()) thread_ = std::thread([this] { run_loop(); });
        queue_.push_front(std::move(op));
        busy_ = false;
      }
      queue_cv_.notify_one();
      return;
    } else {
      wait_for_earlier_completions();
      complete(op);
    }
  } catch (...) {
    wait_for_earlier_completions();
    fail_op(op, std::current_exception());
  }
  if (pend) return make_pending(std::move(op));
  bool queued = false;
  {
    std::lock_guard lock(queue_mutex_);
    busy_ = false;
    queued = !queue_.empty();
  }
  if (queued) queue_cv_.notify_one();
}

void QueuedGroup::make_pending(Op op) {
  {
    std::lock_guard lock(pending_->mutex);
    pending_->op.emplace(std::move(op));
    pending_->last_poll_ns.store(now_ns());
    pending_->active.store(true, std::memory_order_release);
  }
  bool stopping = false;
  {
    std::lock_guard lock(queue_mutex_);
    stopping = stopping_;
    if (!stopping) start_thread_locked();  // it polls when the callers do not
  }
  queue_cv_.notify_one();
  // Shut down meanwhile, with no thread left to poll: this thread finishes it (or it times out).
  if (stopping)
    while (pending_->poll() != WorkProgress::Poll::idle) std::this_thread::yield();
}

WorkProgress::Poll QueuedGroup::progress_pending(Pending& p) {
  while (p.op) {
    p.last_poll_ns.store(now_ns(), std::memory_order_relaxed);
    bool done = false;
    std::exception_ptr error;
    try {
      done = p.op->started->progress();
      if (!done && (Clock::now() >= p.op->deadline || broken().is_broken())) pending_timeout(*p.op);
    } catch (...) {
      error = std::current_exception();
    }
    if (!done && !error) return WorkProgress::Poll::progressed;
    Op finished = std::move(*p.op);
    p.op.reset();
    finished.started.reset();  // frees what a failed op left posted
    wait_for_earlier_completions();
    settle(finished, error);
    // The turn passes to the next queued op if it can start here, else back to the group.
    for (;;) {
      bool queued = false;
      {
        std::lock_guard lock(queue_mutex_);
        if (!queue_.empty() && !broken().is_broken() && !queue_.front().started && can_start(queue_.front())) {
          p.op.emplace(std::move(queue_.front()));
          queue_.pop_front();
        } else {
          busy_ = false;
          p.active.store(false, std::memory_order_release);
          queued = !queue_.empty();
        }
      }
      if (!p.op) {
        if (queued) queue_cv_.notify_one();
        return WorkProgress::Poll::progressed;
      }
      p.op->deadline = Clock::now() + p.op->timeout;
      try {
        record_start(*p.op);
        p.op->started = start(*p.op);
        break;  // progressed by the loop above
      } catch (...) {
        Op failed = std::move(*p.op);
        p.op.reset();
        settle(failed, std::current_exception());
      }
    }
  }
  return WorkProgress::Poll::idle;
}

void QueuedGroup::settle(Op& op, std::exception_ptr error) noexcept {
  // Never throws: the turn must be handed on whatever a completion does.
  AsCommThread as_comm_thread;
  try {
    if (!error) {
      try {
        complete(op);
        return;
      } catch (...) {
        error = std::current_exception();
      }
    }
    fail_op(op, error);
  } catch (...) {
  }
}

void QueuedGroup::poll() {
  if (caller_progress_) pending_->poll();
}

void QueuedGroup::pending_timeout(const Op& op) {
  if (broken().is_broken()) throw CollectiveError(stopped_by_break(op), false);
  throw TimeoutError(fmt::format("[dist] {} timed out after {} ms; the group is broken.{}", describe(op),
                                 op.timeout.count(), compare_hint()),
                     false);
}

std::string QueuedGroup::stopped_by_break(const Op& op) const {
  return fmt::format("[dist] {} stopped: the group broke while it ran ({})", describe(op), broken().reason());
}

void QueuedGroup::wait_for_earlier_completions() const {
  // The op before this one gave its turn back and is marking its Work (finish_queued), which
  // includes running its continuations: usually a moment.
  while (unmarked_.load() != 0) std::this_thread::yield();
}

void QueuedGroup::stop_comm_thread() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (thread_.joinable() && std::this_thread::get_id() != thread_.get_id()) thread_.join();
  // Nothing is pending any more (the thread finished it): the Works' polls end here.
  std::lock_guard lock(pending_->mutex);
  if (!pending_->op) pending_->group = nullptr;
}

void QueuedGroup::run_loop() {
  set_on_comm_thread(true);
  trace::set_thread_name(fmt::format("rank {} comm {}", rank(), name()));
  for (;;) {
    Op op;
    bool broken_group = false;
    bool pend = false;
    {
      std::unique_lock lock(queue_mutex_);
      // busy_: an issuing thread is running an op inline, or an op is pending (caller progress);
      // what is queued comes after it.
      for (;;) {
        if (!queue_.empty() && !busy_) break;
        if (stopping_ && !busy_) return;  // stopping and drained
        if (!pending_->active.load(std::memory_order_acquire)) {
          queue_cv_.wait(lock);
          continue;
        }
        // Caller progress: poll for the callers once they have not for kStallPoll (at once when
        // stopping: the op must end, by its deadline at the latest).
        const auto interval = stopping_ ? std::chrono::microseconds(50) : kStallPoll;
        queue_cv_.wait_for(lock, interval);
        const int64_t idle_ns = now_ns() - pending_->last_poll_ns.load(std::memory_order_relaxed);
        if (stopping_ || idle_ns >= std::chrono::nanoseconds(interval).count()) {
          lock.unlock();
          pending_->poll();
          lock.lock();
        }
      }
      op = std::move(queue_.front());
      queue_.pop_front();
      broken_group = broken().is_broken();
      pend = caller_progress_ && !broken_group && !op.started && can_start(op);
      busy_ = true;
    }
    if (broken_group) {
      finish_queued(op, std::make_exception_ptr(Error(broken().message(op.work->description()))));
    } else if (pend) {
      // Caller progress: started here, advanced by whoever polls.
      op.deadline = Clock::now() + op.timeout;
      bool done = false;
      try {
        record_start(op);
        op.started = start(op);
        done = op.started->progress();  // its first step, before the pollers take it
      } catch (...) {
        finish_queued(op, std::current_exception());
        continue;
      }
      if (done) {
        finish_queued(op, nullptr);
      } else {
        make_pending(std::move(op));
      }
    } else {
      run_one(op);
    }
  }
}

void QueuedGroup::run_one(Op& op) {
  // The op's whole turn, its completion and continuations included (a bucket's reduction ends
  // inside it). op_kind_name's views are of literals: null-terminated.
  TANDEM_TRACE_SCOPE(op_kind_name(op.kind).data(), "comm");
  try {
    if (!op.started) {
      op.deadline = Clock::now() + op.timeout;  // a started op keeps its deadline
      record_start(op);
    }
    execute(op);
  } catch (...) {
    return finish_queued(op, std::current_exception());
  }
  finish_queued(op, nullptr);
}

void QueuedGroup::finish_queued(Op& op, std::exception_ptr error) {
  // Give the group's turn back before completing the Work: a caller woken by the completion and
  // issuing its next small op at once then finds the group idle and runs it inline, instead of
  // queueing it behind a turn that is about to end (and so on, never getting back inline).
  // unmarked_ keeps completions in issue order: an inline op completes only after this one.
  bool queued = false;
  {
    std::lock_guard lock(queue_mutex_);
    busy_ = false;
    unmarked_.fetch_add(1);
    queued = !queue_.empty();
  }
  if (queued) queue_cv_.notify_one();
  {
    // A continuation that polls here must not advance (and so wait in
    // wait_for_earlier_completions for) an op that completes after this one.
    NoNestedPolls no_polls;
    if (error) {
      fail_op(op, std::move(error));
    } else {
      try {
        complete(op);
      } catch (...) {
        fail_op(op, std::current_exception());
      }
    }
  }
  unmarked_.fetch_sub(1);
}

void QueuedGroup::complete(Op& op) {
  TensorList result;
  switch (op.kind) {
    case OpKind::allreduce:
    case OpKind::allreduce_coalesced:
    case OpKind::broadcast:
    case OpKind::send:
    case OpKind::recv:
      result = op.inputs;
      break;
    case OpKind::allgather:
    case OpKind::allgather_into:
    case OpKind::reduce_scatter:
    case OpKind::reduce_scatter_tensor:
    case OpKind::all_to_all:
      result = op.outputs;
      break;
    case OpKind::barrier:
    case OpKind::new_group: break;
  }
  recorder().ended(op.record, recorded_seq(op), true);  // before the continuations, which may issue more
  op.work->mark_completed(std::move(result));
}

void QueuedGroup::fail_op(Op& op, std::exception_ptr error) {
  try {
    error = translate_failure(op, error);
  } catch (...) {  // the failure as it was, rather than another
  }
  bool broke = false;
  try {
    std::rethrow_exception(error);
  } catch (const CollectiveError& e) {
    if (!e.group_survives()) {
      broke = true;
      try {
        keep_buffers_of_broken(op);
      } catch (...) {
      }
      // This rank found it first (not told by a peer, not a later op of a broken group): the
      // others, maybe waiting in a collective that can no longer finish, are told at once.
      if (broken().mark(e.what())) {
        try {
          on_break(op, e.what());
        } catch (...) {
        }
      }
    }
  } catch (...) {
  }
  // The flight recorder's part never stops the failure from reaching its Work (nothing here may
  // throw past this point: the turn and the completion order depend on it).
  try {
    const FlightFailure f = flight_failure(error);
    recorder().ended(op.record, recorded_seq(op), false, f.what, f.missing);
    if (broke) {
      recorder().set_broken(f.what);
      flight_dump_on_failure(f.what);  // TANDEM_FLIGHT_RECORDER: written by the dump thread
    }
  } catch (...) {
  }
  op.work->mark_failed(std::move(error));
}

// ---- Issue: validation, fingerprint, queue ----

WorkPtr QueuedGroup::allreduce(const Tensor& tensor, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_allreduce(tensor, reduce, debug_checks() || always_fingerprints());
  op.kind = OpKind::allreduce;
  op.reduce = reduce;
  op.inputs = {tensor};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::allreduce_coalesced(const TensorList& tensors, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_allreduce_coalesced(tensors, reduce);
  op.kind = OpKind::allreduce_coalesced;
  op.reduce = reduce;
  op.inputs = tensors;
  return issue(std::move(op));
}

WorkPtr QueuedGroup::broadcast(const Tensor& tensor, int root) {
  Op op;
  op.fingerprint = check_broadcast(*this, tensor, root);
  op.kind = OpKind::broadcast;
  op.root = root;
  op.inputs = {tensor};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::allgather(const TensorList& outputs, const Tensor& input) {
  Op op;
  op.fingerprint = check_allgather(*this, outputs, input);
  op.kind = OpKind::allgather;
  op.inputs = {input};
  op.outputs = outputs;
  return issue(std::move(op));
}

WorkPtr QueuedGroup::allgather_into(const Tensor& output, const Tensor& input) {
  Op op;
  op.fingerprint = check_allgather_into(*this, output, input);
  op.kind = OpKind::allgather_into;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_reduce_scatter(*this, output, inputs, reduce);
  op.kind = OpKind::reduce_scatter;
  op.reduce = reduce;
  op.inputs = inputs;
  op.outputs = {output};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_reduce_scatter_tensor(*this, output, input, reduce);
  op.kind = OpKind::reduce_scatter_tensor;
  op.reduce = reduce;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::all_to_all(const Tensor& output, const Tensor& input, const AllToAllSplits& splits) {
  Op op;
  op.fingerprint = check_all_to_all(*this, output, input, splits, op.in_splits, op.out_splits);
  op.kind = OpKind::all_to_all;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::barrier() {
  Op op;
  op.kind = OpKind::barrier;
  op.fingerprint = "barrier";
  return issue(std::move(op));
}

// send and recv share their checks and their op: `peer` is the destination or the source.
WorkPtr QueuedGroup::issue_p2p(OpKind kind, const char* what, const char* peer_name, const Tensor& tensor, int peer,
                               int tag) {
  check_p2p(*this, what, peer_name, tensor, peer, tag);
  Op op;
  op.kind = kind;
  op.root = peer;
  op.tag = tag;
  op.inputs = {tensor};
  return issue(std::move(op));
}

WorkPtr QueuedGroup::send(const Tensor& tensor, int dst, int tag) {
  return issue_p2p(OpKind::send, "send", "dst", tensor, dst, tag);
}

WorkPtr QueuedGroup::recv(const Tensor& tensor, int src, int tag) {
  return issue_p2p(OpKind::recv, "recv", "src", tensor, src, tag);
}

ProcessGroupPtr QueuedGroup::new_group(const std::vector<int>& ranks) {
  Op op;
  op.fingerprint = check_new_group(*this, ranks);
  op.kind = OpKind::new_group;
  op.ranks = ranks;
  WorkPtr work = issue(std::move(op));
  work->wait();
  std::lock_guard lock(queue_mutex_);
  auto it = created_.find(work.get());
  ProcessGroupPtr group = it == created_.end() ? nullptr : it->second;
  if (it != created_.end()) created_.erase(it);
  return group;
}

void QueuedGroup::publish_created(const Op& op, ProcessGroupPtr group) {
  std::lock_guard lock(queue_mutex_);
  created_[op.work.get()] = std::move(group);
}

}  // namespace tandem::dist
