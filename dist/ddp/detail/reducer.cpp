#include "dist/ddp/detail/reducer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/detail/elementwise.h"
#include "core/trace.h"
#include "dist/flight_recorder.h"

namespace tandem::dist {

namespace {

double ms_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

Reducer::Reducer(std::vector<Param> params, ProcessGroupPtr group, ReducerOptions options)
    : params_(std::move(params)), group_(std::move(group)), options_(options) {
  TANDEM_CHECK(group_ != nullptr, "[ddp] the reducer needs a process group");
  const size_t n = params_.size();
  TANDEM_CHECK(n > 0, "[ddp] the reducer needs at least one parameter");
  control_device_ = group_->control_device(params_.front().tensor.device());
  ready_.assign(n, false);
  local_used_.assign(n, 0);
  unused_stash_.resize(n);

  // Initial layout: reverse registration order, the rough order backward makes gradients ready.
  std::vector<size_t> order(n);
  std::iota(order.rbegin(), order.rend(), size_t{0});
  TensorList tensors;
  for (const Param& p : params_) tensors.push_back(p.tensor);
  build_buckets(assign_buckets(tensors, order, options_.first_bucket_bytes, options_.bucket_bytes));

  for (size_t i = 0; i < n; ++i) {
    hooks_.push_back(register_post_accumulate_grad_hook(params_[i].tensor, [this, i](const Tensor&) { on_grad_ready(i); }));
  }
  watch_ = std::make_unique<BackwardWatch>(tensors, [this](const autograd::GraphTask& t, size_t reached) {
    adopt(t, reached);
  });
}

Reducer::~Reducer() {
  remove_autograd_hooks();
  wait_outstanding();
}

void Reducer::remove_autograd_hooks() {
  if (!attached_) return;
  attached_ = false;
  hooks_.clear();  // HookHandle removes each hook
  watch_->stop();
  expect_hooks_ = false;
  // A bucket launched by a backward that threw may still be reducing, its in-backward steps
  // chained to it: they call into what DDP gives back next (masters, optimizers).
  wait_outstanding();
}

void Reducer::build_buckets(const std::vector<std::vector<size_t>>& layout) {
  TensorList tensors;
  for (const Param& p : params_) tensors.push_back(p.tensor);
  buckets_ = GradBuckets(std::move(tensors), layout, options_.reduce_dtype);
  // Existing gradients move into the buckets, and .grad becomes the view.
  if (options_.gradient_as_bucket_view)
    for (size_t p = 0; p < params_.size(); ++p) buckets_.move_grad_into_slot(p);
}

void Reducer::wait_outstanding() noexcept {
  buckets_.wait_outstanding();
  if (used_work_) {
    try {
      used_work_->wait();
    } catch (...) {
    }
    used_work_.reset();
  }
  // What continuations already queued on the step stream (a failed backward's steps or casts)
  // is done before the buffers are written again.
  try {
    group_->join_step_stream();
  } catch (...) {
  }
}

void Reducer::reset_iteration() {
  wait_outstanding();
  expect_hooks_ = false;
  adopted_task_ = 0;
  hooks_fired_ = false;
  finalize_ran_ = false;
  std::fill(ready_.begin(), ready_.end(), false);
  buckets_.reset_pending();
  next_launch_ = 0;
  ready_order_.clear();
  graph_changed_.clear();
  events_.clear();
  for (Tensor& s : unused_stash_) s = Tensor();
}

void Reducer::prepare_for_forward(bool rebuild_now) {
  if (!failure_.empty()) fail("[ddp] the previous iteration's gradient reduction failed, so DDP cannot continue: {}", failure_);
  if (backward_failed()) {
    // A backward that threw never ran its end-of-backward callback: drop its partial reduction
    // (once its collectives are done) instead of blaming the parameters.
    reset_iteration();
    watch_->disarm();
  } else if (expect_hooks_ && hooks_fired_) {
    throw_unfinished();
  }
  watch_->forget_dropped();  // forwards never backwarded are forgiven
  if (rebuild_now && rebuild_pending_) rebuild_buckets();
}

void Reducer::prepare_for_backward(const TensorList& outputs) {
  TANDEM_CHECK(attached_, "[ddp] the autograd hooks were removed (remove_autograd_hooks): this DDP can no longer synchronise gradients");
  // A fresh iteration, unless an earlier forward's backward is already under way (then this
  // forward joins the iteration; several forwards under static_graph).
  if (!expect_hooks_ || !hooks_fired_) reset_iteration();
  expect_hooks_ = true;
  local_window_ = false;
  watch_->arm(outputs);
}

void Reducer::check_finalized() const {
  if (!failure_.empty()) fail("[ddp] the previous iteration's gradient reduction failed: {}", failure_);
  if (backward_failed()) {
    // What the next forward does too: nothing is blamed on the parameters.
    fail("[ddp] the last backward failed before it finished (it threw on rank {}), so its gradients were not "
         "reduced; the next forward drops that partial reduction and starts a fresh iteration",
         group_->rank());
  }
  if (expect_hooks_ && hooks_fired_) throw_unfinished();
}

void Reducer::throw_unfinished() const {
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p)
    if (!ready_[p]) missing.push_back(params_[p].name);
  fail("[ddp] Expected to have finished reduction in the prior iteration before starting a new one: on rank {} "
       "{} of {} parameters received no gradient in the last backward: {}. This happens when the module has "
       "parameters that were not used in producing the loss; build DDP with find_unused_parameters=true if that "
       "is intended, or make sure every output of forward takes part in the loss",
       group_->rank(), missing.size(), params_.size(), fmt::join(missing, ", "));
}

void Reducer::register_comm_hook(CommHook hook) {
  TANDEM_CHECK(static_cast<bool>(hook), "[ddp] register_comm_hook: the hook is empty");
  TANDEM_CHECK(!comm_hook_, "[ddp] register_comm_hook may only be called once; a hook is already registered");
  TANDEM_CHECK(!trained_, "[ddp] register_comm_hook must be called before the first backward");
  comm_hook_ = std::move(hook);
}

// A comm hook's result into bucket `index` (nothing to copy when it reduced the buffer in place).
void Reducer::take_result(size_t index, const TensorList& result) {
  GradBuckets::Bucket& b = buckets_[index];
  TANDEM_CHECK(!result.empty() && result[0].defined(), "[ddp] the comm hook's Work for bucket {} has no result", index);
  const Tensor& reduced = result[0];
  if (reduced.data_ptr() == b.buffer.data_ptr()) return;
  TANDEM_CHECK(reduced.numel() == b.buffer.numel(), "[ddp] the comm hook returned {} elements for bucket {} of {} elements",
               reduced.numel(), index, b.buffer.numel());
  b.buffer.copy_(reduced.reshape(b.buffer.shape()));
}

void Reducer::set_in_backward_steps(std::vector<std::shared_ptr<optim::InBackwardStep>> steps) {
  TANDEM_CHECK(steps.size() == params_.size(), "[ddp] {} in-backward steps for {} parameters", steps.size(),
               params_.size());
  TANDEM_CHECK(!trained_, "[ddp] the optimizer in backward must be set before the first backward");
  in_backward_ = std::move(steps);
}

void Reducer::set_gradient_transforms(GradientTransforms transforms) {
  TANDEM_CHECK(!trained_, "[ddp] gradient transforms must be set before the first backward");
  transforms_ = std::move(transforms);
}

bool Reducer::steps_with_bucket(size_t p) const {
  // Not under a dynamic find_unused_parameters (the used map decides first), never a parameter
  // that static_graph found unused everywhere.
  return !in_backward_.empty() && in_backward_[p] && !(options_.find_unused_parameters && !options_.static_graph) &&
         !(options_.static_graph && static_recorded_ && static_unused_anywhere_[p]);
}

bool Reducer::drops_grad_after_copy(size_t p) const {
  // The gradient is then needed from the slot only, unless the user keeps .grad or it is a view.
  return steps_with_bucket(p) && !in_backward_[p]->keep_grads() && !transforms_.sink &&
         !options_.gradient_as_bucket_view;
}

void Reducer::write_back(size_t p) {
  const Tensor& param = params_[p].tensor;
  Tensor slot = slot_view(p);
  if (transforms_.sink) {
    transforms_.sink(p, slot);
    return;
  }
  Tensor grad = param.grad();
  if (options_.gradient_as_bucket_view) {
    if (!buckets_.is_slot(p, grad)) param.set_grad(slot);
  } else if (grad.defined()) {
    grad.copy_(slot);
  } else {
    param.set_grad(slot.clone());
  }
}

// The bucket's steps run once its reduction is in: a continuation of its Work, which the end of
// backward then waits for like any other (so step() never waits on a Work itself).
void Reducer::chain_in_backward_steps(size_t index) {
  GradBuckets::Bucket& b = buckets_[index];
  if (std::none_of(b.params.begin(), b.params.end(), [this](size_t p) { return steps_with_bucket(p); })) return;
  b.work = b.work->then([this, index](Work& w) {
    TANDEM_TRACE_SCOPE("optimizer step (in backward)", "ddp");
    NoGradGuard no_grad;
    // On a device the step's kernels run on the group's step stream after the reduction; the end
    // of backward joins that stream before anything reads the stepped parameters.
    group_->run_on_step_stream([&] {
      take_result(index, w.result());
      TensorList kept;
      for (size_t p : buckets_[index].params) {
        if (!steps_with_bucket(p)) continue;
        if (transforms_.finish) {
          transforms_.finish(p, slot_view(p));
        } else if (!in_backward_[p]->keep_grads() && !options_.gradient_as_bucket_view) {
          params_[p].tensor.set_grad(slot_view(p));  // stepped from the slot itself, dropped right after
        } else {
          write_back(p);
        }
        in_backward_[p]->step();
        if (Tensor g = params_[p].tensor.grad(); g.defined()) kept.push_back(std::move(g));
      }
      return kept;
    });
    return TensorList{buckets_[index].buffer};
  });
}

void Reducer::adopt(const autograd::GraphTask& task, size_t forwards_reached) {
  // Each parameter's hook fires once per backward however many forwards used it, so several
  // forwards need nothing special; but a dynamic find_unused_parameters cannot tell which
  // parameters one forward left unused from another's.
  if (forwards_reached > 1 && options_.find_unused_parameters && !options_.static_graph) {
    reset_iteration();
    fail("[ddp] this backward reaches the outputs of {} synchronised forwards. With find_unused_parameters=true, "
         "running several forwards before one backward needs DistributedDataParallel built with static_graph=true "
         "(the set of parameters that receive a gradient must then be the same in every iteration), or "
         "find_unused_parameters=false if every parameter receives a gradient",
         forwards_reached);
  }
  adopted_task_ = task.id();
  trained_ = true;
  backward_start_ = Clock::now();
  events_.push_back({ReducerEvent::backward_started, -1});
  autograd::queue_callback([this] { finalize(); });  // once per adopted backward
  if (on_adopt_) on_adopt_();
  if (static_first_iteration()) return;  // nothing is reduced before the end of this backward
  if (options_.static_graph) {
    for (size_t p = 0; p < params_.size(); ++p)
      if (static_unused_here_[p]) mark_ready(p, /*used_here=*/false);
  } else if (options_.find_unused_parameters) {
    for (size_t p = 0; p < params_.size(); ++p)
      if (!task.reaches(params_[p].tensor)) mark_ready(p, /*used_here=*/false);
  }
}

void Reducer::on_grad_ready(size_t param) {
  // In caller-progress mode the buckets in flight advance here, between backward's kernels.
  group_->poll();
  if (!expect_hooks_) {
    local_used_[param] = 1;  // inside no_sync: used in any micro-batch counts as used
    return;
  }
  if (adopted_task_ == 0) {
    // Not a synchronised forward's backward. A no_sync micro-batch's still counts as usage, also
    // after a grad-mode forward that was never backwarded (as PyTorch's local used map); another
    // model's, between DDP's forward and its backward, does not.
    if (local_window_) local_used_[param] = 1;
    return;
  }
  if (autograd::current_graph_task_id() != adopted_task_) {
    // A second backward while this iteration's reduction is open must not feed a gradient into
    // a slot that is already reduced; one that reaches only unready parameters is not ours.
    if (ready_[param]) mark_ready(param, /*used_here=*/true);  // throws "marked ready twice"
    return;
  }
  hooks_fired_ = true;
  local_used_[param] = 1;
  if (static_first_iteration()) {
    // Recorded only; the end-of-backward callback reduces everything.
    ready_order_.push_back(param);
    last_ready_ = Clock::now();
    events_.push_back({ReducerEvent::grad_ready, static_cast<int64_t>(param)});
    return;
  }
  if (options_.static_graph && static_unused_here_[param]) {
    graph_changed_.push_back(param);  // reported at the end of this backward
    return;
  }
  mark_ready(param, /*used_here=*/true);
}

void Reducer::mark_ready(size_t param, bool used_here) {
  if (ready_[param]) {
    fail("[ddp] parameter '{}' was marked ready twice in one iteration: its gradient was produced by more than one "
         "backward after a single forward (for example a parameter used outside forward, or several backwards over "
         "parts of one output). Each parameter may receive its gradient once per synchronised iteration",
         params_[param].name);
  }
  ready_[param] = true;
  NoGradGuard no_grad;
  const Tensor& p = params_[param].tensor;
  Tensor slot = slot_view(param);
  Tensor grad = transforms_.source ? transforms_.source(param, p.grad()) : p.grad();
  // The default reduction averages: the division by the world size happens here, in the copy
  // into the slot (divide then sum, so low precision does not overflow), not as a pass of its own.
  const bool divide = folds_division();
  const double world = divisor();
  if (grad.defined()) {
    // A locally unused parameter still contributes the gradient it holds (e.g. accumulated under
    // no_sync); if no rank used it, finalize leaves .grad as it was.
    if (!buckets_.is_slot(param, grad)) {
      if (divide) {
        detail::copy_divided(slot, grad, world);
      } else {
        slot.copy_(grad);
      }
      if (options_.gradient_as_bucket_view && used_here && !transforms_.sink) p.set_grad(slot);
      // An optimizer in backward reads the gradient from the slot once reduced: autograd's
      // .grad can go now instead of living until the step (the peak memory of in-backward).
      if (drops_grad_after_copy(param)) p.set_grad(Tensor());
    } else {
      if (!used_here) unused_stash_[param] = grad.clone();  // the view itself is about to be reduced
      if (divide) slot.div_(world);  // the gradient already lives in the slot
    }
  } else {
    slot.zero_();
  }
  if (used_here) {
    ready_order_.push_back(param);
    last_ready_ = Clock::now();
    events_.push_back({ReducerEvent::grad_ready, static_cast<int64_t>(param)});
  }
  if (buckets_.fill(param)) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  // Buckets overlap with the rest of backward: never wait here for a peer that is behind.
  AsyncIssueGuard async_issue;
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    const size_t index = next_launch_++;
    GradBuckets::Bucket& b = buckets_[index];
    if (index == 0) first_launch_ = Clock::now();
    // The timeline: an async span from the launch (this thread, before the collective is issued,
    // which may start it at once) to the reduction's completion (the thread that completes it),
    // so its overlap with the rest of backward shows. Named only while recording.
    std::string span;
    uint64_t span_id = 0;
    if (trace::enabled()) {
      span = fmt::format("bucket {} ({:.2f} MiB)", index, static_cast<double>(b.buffer.nbytes()) / (1 << 20));
      span_id = trace::new_async_id();
      trace::async_begin(span, "ddp", span_id);
    }
    b.work = reduce_bucket(index);
    events_.push_back({ReducerEvent::bucket_launched, static_cast<int64_t>(index)});
    // The completion time, for the statistics (runs on whichever thread completes the work).
    b.work->then([m = completion_mutex_, last = last_completion_, span = std::move(span), span_id](Work&) {
      if (span_id) trace::async_end(span, "ddp", span_id);
      std::lock_guard<std::mutex> lock(*m);
      *last = std::max(*last, Clock::now());
      return TensorList{};
    });
    chain_in_backward_steps(index);
  }
  // Dynamic find_unused_parameters: after the last bucket, so every rank issues it at the same
  // point of its collective order.
  if (next_launch_ == buckets_.size() && options_.find_unused_parameters && !options_.static_graph) launch_used_map();
}

WorkPtr Reducer::reduce_bucket(size_t index) {
  GradBuckets::Bucket& b = buckets_[index];
  GradBucket gb;
  gb.index = static_cast<int>(index);
  gb.is_last = index + 1 == buckets_.size();
  gb.buffer = b.buffer;
  for (size_t p : b.params) gb.parameters.push_back(params_[p].tensor);
  gb.offsets = b.offsets;
  gb.lengths = b.lengths;
  gb.group = group_.get();
  // Without a hook the slots were divided on the way in: a plain sum averages.
  CollectiveTag tag("ddp bucket", static_cast<int64_t>(index));  // what a comm hook issues too
  WorkPtr work;
  if (comm_hook_) {
    work = comm_hook_(gb);
  } else {
    work = folds_division() ? group_->allreduce(b.buffer, ReduceOp::sum) : hooks::allreduce(gb);
  }
  TANDEM_CHECK(work != nullptr, "[ddp] the comm hook returned no Work for bucket {}", index);
  return work;
}

void Reducer::shadow_reduction(bool static_first) {
  TANDEM_TRACE_SCOPE("ddp join shadow", "ddp");
  TANDEM_CHECK(attached_, "[ddp] the autograd hooks were removed (remove_autograd_hooks): this DDP can no longer "
                          "take part in the others' reductions under Join");
  NoGradGuard no_grad;
  reset_iteration();
  trained_ = true;
  std::fill(local_used_.begin(), local_used_.end(), 0);  // this rank used nothing
  try {
    if (static_first) {
      launch_used_map();
      used_work_->wait();
      // This rank ran no forward; its graph is taken to be the others' (used here = used anywhere).
      const std::vector<int32_t> anywhere = used_map_.to(kCPU).to_vector<int32_t>();
      std::vector<bool> used(params_.size());
      for (size_t p = 0; p < params_.size(); ++p) used[p] = anywhere[p] != 0;
      record_static_graph(used);
      used_work_.reset();
    }
    {
      AsyncIssueGuard async_issue;
      for (size_t i = 0; i < buckets_.size(); ++i) {
        buckets_[i].buffer.zero_();
        buckets_[i].work = reduce_bucket(i);
      }
      if (options_.find_unused_parameters && !options_.static_graph) launch_used_map();
    }
    for (size_t i = 0; i < buckets_.size(); ++i) take_result(i, buckets_[i].work->result());
    if (used_work_) used_work_->wait();
  } catch (const std::exception& e) {
    failure_ = e.what();
    wait_outstanding();
    throw;
  }
  std::vector<int32_t> used_everywhere;
  if (options_.find_unused_parameters && !options_.static_graph) used_everywhere = used_map_.to(kCPU).to_vector<int32_t>();
  // As a training rank's end of backward: every average into .grad (under mixed precision the
  // sink upcasts it into the f32 master's), globally unused parameters left alone.
  for (size_t p = 0; p < params_.size(); ++p) {
    const bool unused_everywhere =
        options_.static_graph ? static_unused_anywhere_[p] : !used_everywhere.empty() && used_everywhere[p] == 0;
    if (!unused_everywhere) write_back(p);
  }
  for (GradBuckets::Bucket& b : buckets_) b.work.reset();
  used_work_.reset();
  expect_hooks_ = false;
}

void Reducer::launch_used_map() {
  used_map_ = from_vector<int32_t>(local_used_, {static_cast<int64_t>(local_used_.size())}).to(control_device_);
  CollectiveTag tag("ddp used map");
  used_work_ = group_->allreduce(used_map_, ReduceOp::max);
}

void Reducer::finalize() {
  finalize_ran_ = true;
  if (!expect_hooks_) return;
  TANDEM_TRACE_SCOPE("ddp finalize", "ddp");
  try {
    if (static_first_iteration()) {
      finalize_static_first_iteration();
    } else {
      if (options_.static_graph) check_static_graph();
      if (options_.find_unused_parameters && !options_.static_graph) {
        // Reached, but no gradient arrived (a custom Function returned none, a branch got none):
        // unused too, never left pending.
        for (size_t p = 0; p < params_.size(); ++p)
          if (!ready_[p]) mark_ready(p, /*used_here=*/false);
      }
    }
  } catch (const std::exception& e) {
    failure_ = e.what();
    wait_outstanding();
    throw;
  }
  if (next_launch_ < buckets_.size()) return;  // unfinished: reported at the next forward
  wait_and_write_back();
}

void Reducer::finalize_static_first_iteration() {
  // One used-map allreduce in the whole run: which parameters any rank used.
  std::vector<bool> used_here(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) used_here[p] = ready_order_.end() != std::find(ready_order_.begin(), ready_order_.end(), p);
  launch_used_map();
  used_work_->wait();
  events_.push_back({ReducerEvent::used_map_reduced, -1});
  record_static_graph(used_here);
  // Every bucket, in index order, now that every slot can be filled.
  const std::vector<size_t> order = std::move(ready_order_);
  ready_order_.clear();
  for (size_t p : order) mark_ready(p, /*used_here=*/true);
  for (size_t p = 0; p < params_.size(); ++p)
    if (!ready_[p]) mark_ready(p, /*used_here=*/false);
}

void Reducer::record_static_graph(const std::vector<bool>& used_here) {
  const std::vector<int32_t> anywhere = used_map_.to(kCPU).to_vector<int32_t>();
  static_unused_here_.assign(params_.size(), false);
  static_unused_anywhere_.assign(params_.size(), false);
  for (size_t p = 0; p < params_.size(); ++p) {
    static_unused_here_[p] = !used_here[p];
    static_unused_anywhere_[p] = anywhere[p] == 0;
  }
  static_recorded_ = true;
}

void Reducer::check_static_graph() const {
  auto changed = [&](size_t p, const char* what) {
    fail("[ddp] the training graph changed in this iteration (parameter '{}' {} on rank {}), which static_graph does "
         "not allow: the set of parameters that receive a gradient must be the one of the first iteration. Build DDP "
         "without static_graph (with find_unused_parameters=true if some parameters are unused)",
         params_[p].name, what, group_->rank());
  };
  if (!graph_changed_.empty()) changed(graph_changed_.front(), "received a gradient but did not in the first iteration");
  for (size_t p = 0; p < params_.size(); ++p)
    if (!ready_[p]) changed(p, "received no gradient but did in the first iteration");
}

void Reducer::wait_and_write_back() {
  expect_hooks_ = false;
  NoGradGuard no_grad;
  const auto wait_start = Clock::now();
  bool waited = false;  // some bucket was still in flight: its completion time is about wait_end
  for (const GradBuckets::Bucket& b : buckets_) waited = waited || !b.work->is_completed();
  try {
    TANDEM_TRACE_SCOPE("ddp wait for buckets", "ddp");  // the communication backward did not hide
    for (size_t i = 0; i < buckets_.size(); ++i) {
      take_result(i, buckets_[i].work->result());  // waits; rethrows a failed collective
      events_.push_back({ReducerEvent::bucket_reduced, static_cast<int64_t>(i)});
    }
    if (used_work_) used_work_->wait();
  } catch (const std::exception& e) {
    failure_ = e.what();
    wait_outstanding();
    throw;
  }
  // What continuations queued on the group's step stream (optimizer steps in backward, a compress
  // hook's cast back) is ordered before the caller's stream reads the gradients and parameters.
  group_->join_step_stream();
  const auto wait_end = Clock::now();

  std::vector<std::string> unused;
  std::vector<int32_t> used_everywhere;
  if (options_.find_unused_parameters && !options_.static_graph && used_map_.defined() && used_work_)
    used_everywhere = used_map_.to(kCPU).to_vector<int32_t>();
  for (size_t p = 0; p < params_.size(); ++p) {
    Tensor slot = slot_view(p);
    const bool unused_everywhere = options_.static_graph
                                       ? static_unused_anywhere_[p]
                                       : !used_everywhere.empty() && used_everywhere[p] == 0;
    if (unused_everywhere) {
      // No rank used it: .grad stays as it was (none stays none).
      unused.push_back(params_[p].name);
      if (unused_stash_[p].defined()) slot.copy_(unused_stash_[p]);
      continue;
    }
    if (steps_with_bucket(p)) continue;  // written and stepped by its bucket's continuation
    const bool step = !in_backward_.empty() && in_backward_[p];  // deferred until the used map was known
    if (step && transforms_.finish) {
      transforms_.finish(p, slot);
    } else {
      write_back(p);
    }
    if (step) in_backward_[p]->step();
  }
  for (GradBuckets::Bucket& b : buckets_) b.work.reset();
  used_work_.reset();
  std::fill(local_used_.begin(), local_used_.end(), 0);
  for (Tensor& s : unused_stash_) s = Tensor();

  // Statistics of this iteration.
  ++iterations_;
  last_unused_names_ = std::move(unused);
  last_ready_names_.clear();
  for (size_t p : ready_order_) last_ready_names_.push_back(params_[p].name);
  backward_compute_ms_ = ms_between(backward_start_, last_ready_);
  comm_wait_ms_ = ms_between(wait_start, wait_end);
  {
    std::lock_guard<std::mutex> lock(*completion_mutex_);
    Clock::time_point end = std::max(*last_completion_, first_launch_);
    if (waited) end = std::max(end, wait_end);
    comm_ms_ = ms_between(first_launch_, end);
  }
  events_.push_back({ReducerEvent::finalized, -1});

  // One rebuild, in the order the first synchronised backward made gradients ready; with a
  // dynamic find_unused_parameters that order may change, with static_graph it cannot.
  if (!rebuilt_ && (options_.static_graph || !options_.find_unused_parameters) && first_ready_order_.empty()) {
    first_ready_order_ = ready_order_;
    rebuild_pending_ = true;
  }
}

void Reducer::rebuild_buckets() {
  TANDEM_TRACE_SCOPE("ddp rebuild buckets", "ddp");
  rebuild_pending_ = false;
  rebuilt_ = true;
  const size_t n = params_.size();
  // Rank 0's observed order decides, so every rank builds the same buckets.
  std::vector<int64_t> order(first_ready_order_.begin(), first_ready_order_.end());
  std::vector<bool> seen(n, false);
  for (size_t p : first_ready_order_) seen[p] = true;
  for (size_t p = n; p-- > 0;)
    if (!seen[p]) order.push_back(static_cast<int64_t>(p));
  Tensor shared = from_vector<int64_t>(order, {static_cast<int64_t>(n)}).to(control_device_);
  CollectiveTag tag("ddp bucket order");
  if (group_->size() > 1) group_->broadcast(shared, 0)->wait();
  shared = shared.to(kCPU);
  std::vector<size_t> agreed(n);
  std::vector<bool> check(n, false);
  const int64_t* data = static_cast<const int64_t*>(shared.data_ptr());
  for (size_t i = 0; i < n; ++i) {
    TANDEM_CHECK(data[i] >= 0 && static_cast<size_t>(data[i]) < n && !check[data[i]],
                 "[ddp] rank 0's bucket order is not a permutation of this rank's {} parameters (entry {} is {}): the "
                 "ranks hold different models",
                 n, i, data[i]);
    check[data[i]] = true;
    agreed[i] = static_cast<size_t>(data[i]);
  }
  TensorList tensors;
  for (const Param& p : params_) tensors.push_back(p.tensor);
  auto layout = assign_buckets(tensors, agreed, options_.first_bucket_bytes, options_.bucket_bytes);
  if (layout != buckets_.layout()) build_buckets(layout);
  rebuilt_bucket_bytes_.clear();
  for (const GradBuckets::Bucket& b : buckets_) rebuilt_bucket_bytes_.push_back(static_cast<int64_t>(b.buffer.nbytes()));
}

ReducerStats Reducer::stats() const {
  ReducerStats s;
  s.iterations = iterations_;
  for (const GradBuckets::Bucket& b : buckets_) {
    s.bucket_bytes.push_back(static_cast<int64_t>(b.buffer.nbytes()));
    std::vector<std::string> names;
    for (size_t p : b.params) names.push_back(params_[p].name);
    s.bucket_parameters.push_back(std::move(names));
  }
  s.rebuilt_bucket_bytes = rebuilt_bucket_bytes_;
  s.grad_ready_order = last_ready_names_;
  s.unused_parameters = last_unused_names_;
  s.backward_compute_ms = backward_compute_ms_;
  s.comm_ms = comm_ms_;
  s.comm_wait_ms = comm_wait_ms_;
  s.overlap_ms = std::max(0.0, comm_ms_ - comm_wait_ms_);
  return s;
}

}  // namespace tandem::dist
