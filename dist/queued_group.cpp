#include "dist/queued_group.h"

#include <fmt/format.h>

#include <cstdlib>
#include <map>
#include <set>

#include "core/backend.h"
#include "dist/comm_thread.h"

namespace tandem::dist {

namespace {
thread_local bool tls_on_comm_thread = false;
thread_local bool tls_caller_runs_op = false;

std::string join_ranks(const std::vector<int>& ranks) { return fmt::format("{}", fmt::join(ranks, ", ")); }

void check_tensor(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.defined(), "[{}] {} is an undefined tensor", op, what);
  TANDEM_CHECK(t.is_contiguous(), "[{}] {} must be contiguous (shape {}, strides {})", op, what, t.shape(), t.strides());
}

void check_same_dtype(const Tensor& a, const Tensor& b, const char* op, const char* what_a, const char* what_b) {
  TANDEM_CHECK(a.dtype() == b.dtype(), "[{}] {} is {} but {} is {}", op, what_a, a.dtype(), what_b, b.dtype());
  TANDEM_CHECK(a.device() == b.device(), "[{}] {} is on {} but {} is on {}", op, what_a, a.device(), what_b, b.device());
}

void check_reduce(ReduceOp r, Dtype d, const char* op) {
  TANDEM_CHECK(r != ReduceOp::avg || is_floating(d), "[{}] avg needs a floating dtype, got {} (use sum)", op, d);
}

Shape row_shape(const Tensor& t) {
  Shape s;
  for (int64_t i = 1; i < t.dim(); ++i) s.push_back(t.size(i));
  return s;
}
}  // namespace

thread_local int tls_async_issue_depth = 0;

bool on_comm_thread() { return tls_on_comm_thread; }
bool caller_runs_op() { return tls_caller_runs_op; }
void set_on_comm_thread(bool on) { tls_on_comm_thread = on; }

AsyncIssueGuard::AsyncIssueGuard() { ++tls_async_issue_depth; }
AsyncIssueGuard::~AsyncIssueGuard() { --tls_async_issue_depth; }
bool inline_issue_allowed() { return tls_async_issue_depth == 0; }

thread_local int tls_blocking_issue_depth = 0;

BlockingIssueGuard::BlockingIssueGuard() { ++tls_blocking_issue_depth; }
BlockingIssueGuard::~BlockingIssueGuard() { --tls_blocking_issue_depth; }
bool blocking_issue_requested() { return tls_blocking_issue_depth > 0 && tls_async_issue_depth == 0; }

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::allreduce: return "allreduce";
    case OpKind::allreduce_coalesced: return "allreduce_coalesced";
    case OpKind::broadcast: return "broadcast";
    case OpKind::allgather: return "allgather";
    case OpKind::allgather_into: return "allgather_into";
    case OpKind::reduce_scatter: return "reduce_scatter";
    case OpKind::reduce_scatter_tensor: return "reduce_scatter_tensor";
    case OpKind::all_to_all: return "all_to_all";
    case OpKind::barrier: return "barrier";
    case OpKind::send: return "send";
    case OpKind::recv: return "recv";
    case OpKind::new_group: return "new_group";
  }
  return "?";
}

Milliseconds default_timeout() {
  if (const char* env = std::getenv("TANDEM_DIST_TIMEOUT")) {
    char* end = nullptr;
    double s = std::strtod(env, &end);
    TANDEM_CHECK(end != env && s > 0, "[dist] TANDEM_DIST_TIMEOUT must be a positive number of seconds, got '{}'", env);
    return Milliseconds(static_cast<int64_t>(s * 1000.0));
  }
  return Milliseconds(300'000);
}

bool default_debug_checks() {
  const char* env = std::getenv("TANDEM_DIST_DEBUG");
  return env && std::string_view(env) == "detail";
}

std::vector<int64_t> equal_splits(int64_t rows, int size, const char* what) {
  TANDEM_CHECK(rows % size == 0, "[all_to_all] equal split of the {} needs dim 0 ({}) divisible by the group size {}",
               what, rows, size);
  return std::vector<int64_t>(size, rows / size);
}

// ---- Argument checks and fingerprints, shared with the nccl group (queued_group.h) ----

std::string check_allreduce(const Tensor& tensor, ReduceOp reduce, bool fingerprint) {
  check_tensor(tensor, "allreduce", "tensor");
  check_reduce(reduce, tensor.dtype(), "allreduce");
  if (!fingerprint) return {};
  return fmt::format("allreduce({}) {} {}", reduce_op_name(reduce), tensor.dtype(), tensor.shape());
}

std::string check_allreduce_coalesced(const TensorList& tensors, ReduceOp reduce) {
  TANDEM_CHECK(!tensors.empty(), "[allreduce_coalesced] needs at least one tensor");
  std::string shapes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    auto what = fmt::format("tensor {}", i);
    check_tensor(tensors[i], "allreduce_coalesced", what.c_str());
    check_same_dtype(tensors[i], tensors[0], "allreduce_coalesced", what.c_str(), "tensor 0");
    shapes += (i ? ", " : "") + fmt::format("{}", tensors[i].shape());
  }
  check_reduce(reduce, tensors[0].dtype(), "allreduce_coalesced");
  return fmt::format("allreduce_coalesced({}) {} {} tensors {}", reduce_op_name(reduce), tensors[0].dtype(),
                     tensors.size(), shapes);
}

std::string check_broadcast(const ProcessGroup& g, const Tensor& tensor, int root) {
  check_tensor(tensor, "broadcast", "tensor");
  TANDEM_CHECK(root >= 0 && root < g.size(), "[broadcast] root {} is not a rank of group {} (size {})", root, g.name(),
               g.size());
  return fmt::format("broadcast(root {}) {} {}", root, tensor.dtype(), tensor.shape());
}

std::string check_allgather(const ProcessGroup& g, const TensorList& outputs, const Tensor& input) {
  check_tensor(input, "allgather", "input");
  TANDEM_CHECK(static_cast<int>(outputs.size()) == g.size(), "[allgather] needs one output per rank ({}), got {}",
               g.size(), outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto what = fmt::format("output {}", i);
    check_tensor(outputs[i], "allgather", what.c_str());
    check_same_dtype(outputs[i], input, "allgather", what.c_str(), "input");
    TANDEM_CHECK(outputs[i].shape() == input.shape(), "[allgather] {} has shape {} but input has shape {}", what,
                 outputs[i].shape(), input.shape());
  }
  return fmt::format("allgather {} {}", input.dtype(), input.shape());
}

std::string check_allgather_into(const ProcessGroup& g, const Tensor& output, const Tensor& input) {
  check_tensor(input, "allgather_into", "input");
  check_tensor(output, "allgather_into", "output");
  check_same_dtype(output, input, "allgather_into", "output", "input");
  const int size = g.size();
  TANDEM_CHECK(output.numel() == input.numel() * size,
               "[allgather_into] output has {} elements (shape {}), expected {} x input {} = {}", output.numel(),
               output.shape(), size, input.shape(), input.numel() * size);
  return fmt::format("allgather_into {} {}", input.dtype(), input.shape());
}

std::string check_reduce_scatter(const ProcessGroup& g, const Tensor& output, const TensorList& inputs,
                                 ReduceOp reduce) {
  check_tensor(output, "reduce_scatter", "output");
  check_reduce(reduce, output.dtype(), "reduce_scatter");
  TANDEM_CHECK(static_cast<int>(inputs.size()) == g.size(), "[reduce_scatter] needs one input per rank ({}), got {}",
               g.size(), inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    auto what = fmt::format("input {}", i);
    check_tensor(inputs[i], "reduce_scatter", what.c_str());
    check_same_dtype(inputs[i], output, "reduce_scatter", what.c_str(), "output");
    TANDEM_CHECK(inputs[i].shape() == output.shape(), "[reduce_scatter] {} has shape {} but output has shape {}", what,
                 inputs[i].shape(), output.shape());
  }
  return fmt::format("reduce_scatter({}) {} {}", reduce_op_name(reduce), output.dtype(), output.shape());
}

std::string check_reduce_scatter_tensor(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                                        ReduceOp reduce) {
  check_tensor(output, "reduce_scatter_tensor", "output");
  check_tensor(input, "reduce_scatter_tensor", "input");
  check_same_dtype(output, input, "reduce_scatter_tensor", "output", "input");
  check_reduce(reduce, output.dtype(), "reduce_scatter_tensor");
  const int size = g.size();
  TANDEM_CHECK(input.numel() == output.numel() * size,
               "[reduce_scatter_tensor] input has {} elements (shape {}), expected {} x output {} = {}", input.numel(),
               input.shape(), size, output.shape(), output.numel() * size);
  return fmt::format("reduce_scatter_tensor({}) {} {}", reduce_op_name(reduce), output.dtype(), output.shape());
}

std::string check_all_to_all(const ProcessGroup& g, const Tensor& output, const Tensor& input,
                             const AllToAllSplits& splits, std::vector<int64_t>& in_splits,
                             std::vector<int64_t>& out_splits) {
  check_tensor(output, "all_to_all", "output");
  check_tensor(input, "all_to_all", "input");
  check_same_dtype(output, input, "all_to_all", "output", "input");
  TANDEM_CHECK(input.dim() >= 1 && output.dim() >= 1, "[all_to_all] input {} and output {} need at least one dim",
               input.shape(), output.shape());
  TANDEM_CHECK(row_shape(input) == row_shape(output),
               "[all_to_all] input {} and output {} must agree beyond dim 0", input.shape(), output.shape());
  const int size = g.size();
  auto check_splits = [&](const std::vector<int64_t>& s, const Tensor& t, const char* what) {
    if (s.empty()) return equal_splits(t.size(0), size, what);
    TANDEM_CHECK(static_cast<int>(s.size()) == size, "[all_to_all] {} splits need one entry per rank ({}), got {}",
                 what, size, s.size());
    int64_t total = 0;
    for (int64_t v : s) {
      TANDEM_CHECK(v >= 0, "[all_to_all] {} splits must be non-negative, got [{}]", what, fmt::join(s, ", "));
      TANDEM_CHECK(!__builtin_add_overflow(total, v, &total),
                   "[all_to_all] {} splits [{}] sum past int64 but the {} has {} rows (shape {})", what,
                   fmt::join(s, ", "), what, t.size(0), t.shape());
    }
    TANDEM_CHECK(total == t.size(0), "[all_to_all] {} splits [{}] sum to {} but the {} has {} rows (shape {})", what,
                 fmt::join(s, ", "), total, what, t.size(0), t.shape());
    return s;
  };
  in_splits = check_splits(splits.input, input, "input");
  out_splits = check_splits(splits.output, output, "output");
  return fmt::format("all_to_all {} rows of {}", input.dtype(), row_shape(input));
}

void check_p2p(const ProcessGroup& g, const char* what, const char* peer_name, const Tensor& tensor, int peer,
               int tag) {
  check_tensor(tensor, what, "tensor");
  TANDEM_CHECK(peer >= 0 && peer < g.size() && peer != g.rank(),
               "[{}] {} {} must be another rank of group {} (size {}, this is rank {})", what, peer_name, peer,
               g.name(), g.size(), g.rank());
  TANDEM_CHECK(tag >= 0 && tag < (1 << 15), "[{}] tag {} must be in [0, 32768)", what, tag);
}

QueuedGroup::QueuedGroup(int rank, int size, std::string name)
    : rank_(rank), size_(size), name_(std::move(name)), timeout_ms_(default_timeout().count()),
      debug_(default_debug_checks()) {}

QueuedGroup::~QueuedGroup() { stop_comm_thread(); }

void QueuedGroup::set_timeout(Milliseconds timeout) {
  TANDEM_CHECK(timeout.count() > 0, "[dist] timeout must be positive, got {} ms", timeout.count());
  timeout_ms_.store(timeout.count());
}

bool QueuedGroup::is_broken() const {
  std::lock_guard lock(queue_mutex_);
  return !broken_reason_.empty();
}

std::string QueuedGroup::describe(const Op& op) const {
  // The group part never changes (formatted once: describe runs for every op issued).
  std::call_once(where_once_, [&] { where_ = fmt::format("group {} ({}, rank {} of {})", name_, backend(), rank_, size_); });
  const std::string& where = where_;
  switch (op.kind) {
    case OpKind::send: return fmt::format("send #{} to rank {} (tag {}) on {}", op.seq, op.root, op.tag, where);
    case OpKind::recv: return fmt::format("recv #{} from rank {} (tag {}) on {}", op.seq, op.root, op.tag, where);
    default: return fmt::format("{} #{} on {}", op_kind_name(op.kind), op.seq, where);
  }
}

void fail_fingerprint_mismatch(const ProcessGroup& g, uint64_t seq, const std::vector<std::string>& fingerprints) {
  // Group ranks that called the same thing, in order of first appearance.
  std::vector<std::pair<std::string, std::vector<int>>> calls;
  for (int r = 0; r < static_cast<int>(fingerprints.size()); ++r) {
    auto it = std::find_if(calls.begin(), calls.end(), [&](auto& c) { return c.first == fingerprints[r]; });
    if (it == calls.end()) {
      calls.push_back({fingerprints[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string parts;
  for (auto& [fp, ranks] : calls) {
    if (!parts.empty()) parts += "; ";
    parts += fmt::format("{} {} called {}", ranks.size() == 1 ? "rank" : "ranks", join_ranks(ranks), fp);
  }
  fail("[dist] collective mismatch at #{} on group {} ({}, {} ranks): {}", seq, g.name(), g.backend(), g.size(), parts);
}

void QueuedGroup::fail_mismatch(const Op& op, const std::vector<std::string>& fingerprints) const {
  fail_fingerprint_mismatch(*this, op.seq, fingerprints);
}

WorkPtr QueuedGroup::issue(Op op, bool collective) {
  // Device tensors are staged through host memory on the communication thread, whose current
  // stream is not the caller's: wait here for the caller's queued work on them (this slow path
  // blocks the caller; the nccl backend orders streams with events instead).
  for (const TensorList* list : {&op.inputs, &op.outputs}) {
    for (const Tensor& t : *list)
      if (!t.is_cpu()) backend_for(t.device(), "dist").synchronize(t.device());
  }
  op.debug = debug_checks();
  // Run on this thread only where nothing could be waiting on its progress: not on a
  // communication thread (continuations), not under an AsyncIssueGuard. Blocking runs any op to
  // its end here; inline starts a small one and hands it over if the peers are late.
  const bool blocking = !on_comm_thread() && blocking_issue_requested();
  const bool may_inline = !blocking && !on_comm_thread() && inline_issue_allowed() && can_start(op);
  WorkPtr work;
  bool run_here = false;
  {
    std::lock_guard issue_lock(issue_mutex_);
    op.seq = collective ? next_seq_ : next_p2p_;
    op.timeout = timeout();
    std::string what = describe(op);
    op.work = std::make_shared<Work>(what);
    work = op.work;
    {
      std::lock_guard lock(queue_mutex_);
      TANDEM_CHECK(broken_reason_.empty(), "[dist] cannot run {}: the group is broken ({})", what, broken_reason_);
      TANDEM_CHECK(!stopping_, "[dist] cannot run {}: the group is shut down", what);
      run_here = (blocking || may_inline) && queue_.empty() && !busy_;
      if (run_here) {
        busy_ = true;  // the group's turn is ours: later ops queue behind this one
      } else {
        if (!thread_.joinable()) thread_ = std::thread([this] { run_loop(); });
        queue_.push_back(std::move(op));
      }
    }
    (collective ? next_seq_ : next_p2p_)++;
  }
  if (!run_here) {
    queue_cv_.notify_one();
    if (blocking) wait_quietly(*work);
  } else if (blocking) {
    run_blocking(op);
  } else {
    run_inline(std::move(op));
  }
  return work;
}

void QueuedGroup::run_blocking(Op& op) {
  // The op before ours may have given its turn back and still be marking its Work: ours must
  // complete after it (and no later op can start before ours ends: the turn is ours).
  wait_for_earlier_completions();
  // This thread does what the communication thread would, with its rules: continuations run
  // here, and a wait() inside one is the same error.
  struct AsCommThread {
    AsCommThread() { tls_on_comm_thread = tls_caller_runs_op = true; }
    ~AsCommThread() { tls_on_comm_thread = tls_caller_runs_op = false; }
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

void QueuedGroup::run_inline(Op op) {
  op.deadline = Clock::now() + op.timeout;
  try {
    std::unique_ptr<StartedOp> started = start(op);
    const auto budget_end = std::min(Clock::now() + kInlineBudget, op.deadline);
    bool done = started->progress();
    // The clock is read every 16 polls: reading it costs about as much as one poll.
    for (uint32_t polls = 1; !done; ++polls) {
      if ((polls & 15) == 0 && Clock::now() >= budget_end) break;
      done = started->progress();
    }
    if (!done) {
      // The peers are not there yet: the communication thread finishes it (ahead of anything
      // queued meanwhile, which was issued later) and this call returns.
      op.started = std::move(started);
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
    }
    wait_for_earlier_completions();
    complete(op, {});
  } catch (...) {
    wait_for_earlier_completions();
    fail_op(op, std::current_exception());
  }
  bool queued = false;
  {
    std::lock_guard lock(queue_mutex_);
    busy_ = false;
    queued = !queue_.empty();
  }
  if (queued) queue_cv_.notify_one();
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
}

void QueuedGroup::run_loop() {
  set_on_comm_thread(true);
  for (;;) {
    Op op;
    std::string broken;
    {
      std::unique_lock lock(queue_mutex_);
      // busy_: an issuing thread is running an op inline; what is queued comes after it.
      queue_cv_.wait(lock, [&] { return (stopping_ && !busy_) || (!queue_.empty() && !busy_); });
      if (queue_.empty()) return;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
      broken = broken_reason_;
      busy_ = true;
    }
    if (!broken.empty()) {
      finish_queued(op, std::make_exception_ptr(Error(
                            fmt::format("[dist] cannot run {}: the group is broken ({})", op.work->description(), broken))));
    } else {
      run_one(op);
    }
  }
}

void QueuedGroup::run_one(Op& op) {
  std::vector<std::pair<Tensor, Tensor>> staged;  // (device tensor, host copy)
  try {
    // Device tensors go through host copies (pinned memory where the backend has it): the
    // collectives below work on CPU memory.
    TensorList* lists[] = {&op.inputs, &op.outputs};
    for (TensorList* list : lists) {
      for (Tensor& t : *list) {
        if (t.is_cpu()) continue;
        Backend& backend = backend_for(t.device(), "dist");
        Tensor host = backend.host_staging(t);  // pinned for CUDA tensors
        backend.copy_bytes(host.data_ptr(), kCPU, t.data_ptr(), t.device(), t.nbytes());
        staged.emplace_back(t, host);
        t = host;
      }
    }
    if (!op.started) op.deadline = Clock::now() + op.timeout;  // a started op keeps its deadline
    execute(op);
    for (auto& [dev, host] : staged) {
      backend_for(dev.device(), "dist").copy_bytes(dev.data_ptr(), dev.device(), host.data_ptr(), kCPU, host.nbytes());
    }
  } catch (...) {
    return finish_queued(op, std::current_exception());
  }
  finish_queued(op, nullptr, staged);
}

void QueuedGroup::finish_queued(Op& op, std::exception_ptr error, const std::vector<std::pair<Tensor, Tensor>>& staged) {
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
  if (error) {
    fail_op(op, std::move(error));
  } else {
    try {
      complete(op, staged);
    } catch (...) {
      fail_op(op, std::current_exception());
    }
  }
  unmarked_.fetch_sub(1);
}

void QueuedGroup::complete(Op& op, const std::vector<std::pair<Tensor, Tensor>>& staged) {
  auto original = [&](const Tensor& t) {
    for (auto& [dev, host] : staged)
      if (host.is_same(t)) return dev;
    return t;
  };
  TensorList result;
  switch (op.kind) {
    case OpKind::allreduce:
    case OpKind::allreduce_coalesced:
    case OpKind::broadcast:
    case OpKind::send:
    case OpKind::recv:
      for (auto& t : op.inputs) result.push_back(original(t));
      break;
    case OpKind::allgather:
    case OpKind::allgather_into:
    case OpKind::reduce_scatter:
    case OpKind::reduce_scatter_tensor:
    case OpKind::all_to_all:
      for (auto& t : op.outputs) result.push_back(original(t));
      break;
    case OpKind::barrier:
    case OpKind::new_group: break;
  }
  op.work->mark_completed(std::move(result));
}

void QueuedGroup::fail_op(Op& op, std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const TimeoutError& e) {
    if (!e.group_survives()) {
      std::lock_guard lock(queue_mutex_);
      if (broken_reason_.empty()) broken_reason_ = e.what();
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
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::allreduce_coalesced(const TensorList& tensors, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_allreduce_coalesced(tensors, reduce);
  op.kind = OpKind::allreduce_coalesced;
  op.reduce = reduce;
  op.inputs = tensors;
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::broadcast(const Tensor& tensor, int root) {
  Op op;
  op.fingerprint = check_broadcast(*this, tensor, root);
  op.kind = OpKind::broadcast;
  op.root = root;
  op.inputs = {tensor};
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::allgather(const TensorList& outputs, const Tensor& input) {
  Op op;
  op.fingerprint = check_allgather(*this, outputs, input);
  op.kind = OpKind::allgather;
  op.inputs = {input};
  op.outputs = outputs;
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::allgather_into(const Tensor& output, const Tensor& input) {
  Op op;
  op.fingerprint = check_allgather_into(*this, output, input);
  op.kind = OpKind::allgather_into;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::reduce_scatter(const Tensor& output, const TensorList& inputs, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_reduce_scatter(*this, output, inputs, reduce);
  op.kind = OpKind::reduce_scatter;
  op.reduce = reduce;
  op.inputs = inputs;
  op.outputs = {output};
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp reduce) {
  Op op;
  op.fingerprint = check_reduce_scatter_tensor(*this, output, input, reduce);
  op.kind = OpKind::reduce_scatter_tensor;
  op.reduce = reduce;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::all_to_all(const Tensor& output, const Tensor& input, const AllToAllSplits& splits) {
  Op op;
  op.fingerprint = check_all_to_all(*this, output, input, splits, op.in_splits, op.out_splits);
  op.kind = OpKind::all_to_all;
  op.inputs = {input};
  op.outputs = {output};
  return issue(std::move(op), true);
}

WorkPtr QueuedGroup::barrier() {
  Op op;
  op.kind = OpKind::barrier;
  op.fingerprint = "barrier";
  return issue(std::move(op), true);
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
  return issue(std::move(op), false);
}

WorkPtr QueuedGroup::send(const Tensor& tensor, int dst, int tag) {
  return issue_p2p(OpKind::send, "send", "dst", tensor, dst, tag);
}

WorkPtr QueuedGroup::recv(const Tensor& tensor, int src, int tag) {
  return issue_p2p(OpKind::recv, "recv", "src", tensor, src, tag);
}

ProcessGroupPtr QueuedGroup::new_group(const std::vector<int>& ranks) {
  TANDEM_CHECK(!ranks.empty(), "[new_group] needs at least one rank");
  std::set<int> seen;
  for (int r : ranks) {
    TANDEM_CHECK(r >= 0 && r < size_, "[new_group] rank {} is not in group {} (size {})", r, name_, size_);
    TANDEM_CHECK(seen.insert(r).second, "[new_group] rank {} is listed twice in [{}]", r, join_ranks(ranks));
  }
  Op op;
  op.kind = OpKind::new_group;
  op.ranks = ranks;
  op.fingerprint = fmt::format("new_group [{}]", join_ranks(ranks));
  WorkPtr work = issue(std::move(op), true);
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
