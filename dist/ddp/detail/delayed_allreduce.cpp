#include "dist/ddp/detail/delayed_allreduce.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdint>
#include <numeric>

#include "autograd/backward_seam.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::dist {

DelayedAllreduce::DelayedAllreduce(std::vector<Param> params, Tensor hook_param, std::string hook_name,
                                   ProcessGroupPtr group, DelayedAllreduceOptions options)
    : params_(std::move(params)),
      hook_param_(std::move(hook_param)),
      hook_name_(std::move(hook_name)),
      group_(std::move(group)),
      options_(std::move(options)) {
  TANDEM_CHECK(!params_.empty(), "[ddp] delay_all_reduce_named_params lists no parameter");
  TANDEM_CHECK(group_ != nullptr, "[ddp] the delayed allreduce needs a process group");
  // One flat buffer per dtype and device, parameters in registration order.
  TensorList tensors;
  for (const Param& p : params_) tensors.push_back(p.tensor);
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  buckets_ = GradBuckets(tensors, assign_buckets(tensors, order, SIZE_MAX, SIZE_MAX), options_.reduce_dtype);
  // After the transforms are known: under mixed precision an existing .grad stays the master's.
  for (size_t p = 0; p < params_.size(); ++p) attach_view(p);
  ready_.assign(params_.size(), false);
  local_used_.assign(params_.size(), 0);
  stash_.resize(params_.size());
  for (size_t p = 0; p < params_.size(); ++p)
    hooks_.push_back(register_post_accumulate_grad_hook(params_[p].tensor, [this, p](const Tensor&) { on_grad_ready(p); }));
  hooks_.push_back(register_post_accumulate_grad_hook(hook_param_, [this](const Tensor&) { on_hook_param_ready(); }));
  if (options_.own_watch) {
    watch_ = std::make_unique<BackwardWatch>(tensors, [this](const autograd::GraphTask&, size_t) {
      join_current_backward();
      if (on_adopt_) on_adopt_();
    });
  }
}

DelayedAllreduce::~DelayedAllreduce() { remove_autograd_hooks(); }

void DelayedAllreduce::remove_autograd_hooks() {
  hooks_.clear();
  if (watch_) watch_->stop();
  armed_ = false;
  wait_outstanding();  // a backward that threw may have launched one: it writes into the buffers
}

std::vector<std::string> DelayedAllreduce::names() const {
  std::vector<std::string> out;
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

// A defined .grad moves into the buffer and becomes the view; a none stays none until its
// gradient arrives.
void DelayedAllreduce::attach_view(size_t p) {
  if (options_.transforms.source) return;  // mixed precision: the gradients stay with the shadows and masters
  buckets_.move_grad_into_slot(p);
}

void DelayedAllreduce::prepare_for_forward() {
  if (!unfinished_.empty()) fail("{}", unfinished_);
  if (backward_failed()) {
    wait_outstanding();
    armed_ = false;
    adopted_task_ = 0;
    if (watch_) watch_->disarm();
  }
  if (watch_) watch_->forget_dropped();  // forwards never backwarded are forgiven
}

void DelayedAllreduce::prepare_for_backward(const TensorList& outputs) {
  wait_outstanding();  // a backward that threw may have launched one
  armed_ = !hooks_.empty();
  adopted_task_ = 0;
  hook_param_ready_ = false;
  launched_ = false;
  ready_count_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  unfinished_.clear();
  local_window_ = false;
  if (watch_ && armed_) watch_->arm(outputs);
}

void DelayedAllreduce::check_finalized() const {
  if (!unfinished_.empty()) fail("{}", unfinished_);
  if (backward_failed()) {
    // Adopted, but the end-of-backward callback never ran: the backward threw.
    fail("[ddp] the last backward failed before it finished (it threw on rank {}), so the delayed-allreduce "
         "parameters were not reduced; the next forward starts a fresh iteration",
         group_->rank());
  }
}

void DelayedAllreduce::join_current_backward() {
  if (!armed_ || adopted_task_ != 0) return;
  adopted_task_ = autograd::current_graph_task_id();
  autograd::queue_callback([this] { finalize(); });
}

bool DelayedAllreduce::in_adopted_backward() const {
  return armed_ && adopted_task_ != 0 && autograd::current_graph_task_id() == adopted_task_;
}

void DelayedAllreduce::on_grad_ready(size_t param) {
  // Outside DDP's backward (no_sync, another model's backward) the gradient accumulates in place
  // in its view; a .grad allocated afresh (after set_to_none) moves into the buffer now. Usage
  // counts in DDP's backward and in no_sync micro-batches (as the reducer's).
  if (!in_adopted_backward()) {
    if (!armed_ || (adopted_task_ == 0 && local_window_)) local_used_[param] = 1;
    attach_view(param);
    return;
  }
  local_used_[param] = 1;
  if (ready_[param]) return;
  ready_[param] = true;
  ++ready_count_;
  if (options_.transforms.source) {
    NoGradGuard no_grad;
    Tensor g = options_.transforms.source(param, params_[param].tensor.grad());
    Tensor slot = slot_view(param);
    if (g.defined()) {
      slot.copy_(g);
    } else {
      slot.zero_();
    }
  } else {
    attach_view(param);
  }
  if (launches_early() && hook_param_ready_ && ready_count_ == params_.size()) launch();
}

void DelayedAllreduce::on_hook_param_ready() {
  if (!in_adopted_backward()) return;
  hook_param_ready_ = true;
  if (launches_early() && ready_count_ == params_.size()) launch();
}

void DelayedAllreduce::launch() {
  if (launched_) return;
  launched_ = true;
  NoGradGuard no_grad;
  AsyncIssueGuard async_issue;  // overlaps with the rest of backward
  for (GradBuckets::Bucket& b : buckets_) {
    if (group_->size() > 1) b.buffer.div_(group_->size());  // divide first: low precision must not overflow
    b.work = group_->allreduce(b.buffer, ReduceOp::sum);
    ++launches_;
  }
}

// Which delayed parameters no rank used since the last reduction: a used map on the child group
// (issued after the buffers, on every rank), every iteration under find_unused_parameters, once
// under static_graph.
std::vector<bool> DelayedAllreduce::globally_unused() {
  std::vector<bool> out(params_.size(), false);
  if (launches_early()) return out;
  if (options_.static_graph && static_unused_anywhere_) return *static_unused_anywhere_;
  const Device control = group_->control_device(params_.front().tensor.device());
  Tensor map = from_vector<int32_t>(local_used_, {static_cast<int64_t>(local_used_.size())}).to(control);
  group_->allreduce(map, ReduceOp::max)->wait();
  const std::vector<int32_t> anywhere = map.to(kCPU).to_vector<int32_t>();
  for (size_t p = 0; p < params_.size(); ++p) out[p] = anywhere[p] == 0;
  if (options_.static_graph) static_unused_anywhere_ = out;
  return out;
}

void DelayedAllreduce::finalize() {
  if (!armed_) return;
  armed_ = false;
  NoGradGuard no_grad;
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p) {
    stash_[p] = Tensor();
    if (ready_[p]) continue;
    if (launches_early()) {
      missing.push_back(params_[p].name);
      continue;
    }
    // Locally unused: contributes what .grad holds (accumulated under no_sync), else zeros; kept
    // aside in case no rank used it (then .grad stays as it was).
    Tensor g = params_[p].tensor.grad();
    Tensor slot = slot_view(p);
    if (options_.transforms.source) g = options_.transforms.source(p, g);
    if (!g.defined()) {
      slot.zero_();
    } else if (g.data_ptr() != slot.data_ptr()) {
      slot.copy_(g);
    } else {
      stash_[p] = g.clone();  // the view itself is about to be reduced
    }
  }
  if (!missing.empty()) {
    // Not launched: the peers' allreduce times out rather than reduce a partial buffer.
    unfinished_ = fmt::format(
        "[ddp] Expected to have finished reduction in the prior iteration before starting a new one: on rank {} the "
        "delayed-allreduce parameters {} received no gradient in the last backward; build DDP with "
        "find_unused_parameters=true if that is intended",
        group_->rank(), fmt::join(missing, ", "));
    return;
  }
  if (options_.static_graph && static_unused_anywhere_) {
    try {
      check_static_graph();
    } catch (const std::exception& e) {
      unfinished_ = e.what();  // not launched: every forward reports it; the peers time out
      throw;
    }
  }
  launch();  // at the latest here (the hook parameter may not have been reached)
  if (options_.static_graph && !static_unused_anywhere_) static_used_here_ = ready_;
  const std::vector<bool> unused = globally_unused();
  for (GradBuckets::Bucket& b : buckets_) {
    WorkPtr w = std::exchange(b.work, nullptr);
    w->wait();  // the optimizer step after backward must never race it
  }
  std::fill(local_used_.begin(), local_used_.end(), 0);
  for (size_t p = 0; p < params_.size(); ++p) {
    Tensor slot = slot_view(p);
    if (unused[p]) {
      // No rank used it: .grad stays as it was (none stays none), and it is not stepped.
      if (stash_[p].defined()) slot.copy_(stash_[p]);
      stash_[p] = Tensor();
      continue;
    }
    const bool step = p < steps_.size() && steps_[p];
    if (options_.transforms.sink) {
      if (step) {
        options_.transforms.finish(p, slot);  // the master, with its upcast gradient, before its step
      } else {
        options_.transforms.sink(p, slot);
      }
    } else {
      const Tensor grad = params_[p].tensor.grad();
      if (!grad.defined() || grad.data_ptr() != slot.data_ptr()) params_[p].tensor.set_grad(slot);
    }
    if (step) steps_[p]->step();
  }
  for (Tensor& t : stash_) t = Tensor();  // no gradient-sized copy lives between iterations
}

// static_graph: the delayed parameters that receive a gradient are the first iteration's.
void DelayedAllreduce::check_static_graph() const {
  for (size_t p = 0; p < params_.size(); ++p) {
    if (ready_[p] == static_used_here_[p]) continue;
    fail("[ddp] the training graph changed in this iteration (delayed-allreduce parameter '{}' {} on rank {}), which "
         "static_graph does not allow: the set of parameters that receive a gradient must be the one of the first "
         "iteration. Build DDP without static_graph (with find_unused_parameters=true if some parameters are unused)",
         params_[p].name,
         ready_[p] ? "received a gradient but did not in the first iteration"
                   : "received no gradient but did in the first iteration",
         group_->rank());
  }
}

}  // namespace tandem::dist
