#include "dist/delayed_allreduce.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <tuple>

#include "autograd/engine.h"
#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::dist {

DelayedAllreduce::DelayedAllreduce(std::vector<Param> params, Tensor hook_param, std::string hook_name,
                                   ProcessGroupPtr group, bool find_unused_parameters, std::optional<Dtype> reduce_dtype)
    : params_(std::move(params)),
      hook_param_(std::move(hook_param)),
      hook_name_(std::move(hook_name)),
      group_(std::move(group)),
      find_unused_(find_unused_parameters) {
  TANDEM_CHECK(!params_.empty(), "[ddp] delay_all_reduce_named_params lists no parameter");
  TANDEM_CHECK(group_ != nullptr, "[ddp] the delayed allreduce needs a process group");
  // One flat buffer per dtype and device, parameters in registration order.
  using Key = std::tuple<int, int, int>;
  std::map<Key, size_t> buffer_of;
  slot_of_.resize(params_.size());
  for (size_t p = 0; p < params_.size(); ++p) {
    const Tensor& t = params_[p].tensor;
    Key key{static_cast<int>(t.dtype()), static_cast<int>(t.device().type), t.device().index};
    auto [it, fresh] = buffer_of.emplace(key, buffers_.size());
    if (fresh) buffers_.emplace_back();
    Buffer& b = buffers_[it->second];
    int64_t offset = b.offsets.empty() ? 0 : b.offsets.back() + params_[b.params.back()].tensor.numel();
    slot_of_[p] = {it->second, b.params.size()};
    b.params.push_back(p);
    b.offsets.push_back(offset);
  }
  NoGradGuard no_grad;
  for (Buffer& b : buffers_) {
    const Tensor& last = params_[b.params.back()].tensor;
    const int64_t total = b.offsets.back() + last.numel();
    const Dtype dtype = reduce_dtype && is_floating(last.dtype()) ? *reduce_dtype : last.dtype();
    b.flat = zeros({total}, TensorOptions(dtype, last.device()));
  }
  for (size_t p = 0; p < params_.size(); ++p) attach_view(p);
  ready_.assign(params_.size(), false);
  for (size_t p = 0; p < params_.size(); ++p)
    hooks_.push_back(register_post_accumulate_grad_hook(params_[p].tensor, [this, p](const Tensor&) { on_grad_ready(p); }));
  hooks_.push_back(register_post_accumulate_grad_hook(hook_param_, [this](const Tensor&) { on_hook_param_ready(); }));
}

DelayedAllreduce::~DelayedAllreduce() {
  remove_autograd_hooks();
  wait_outstanding();
}

void DelayedAllreduce::remove_autograd_hooks() {
  hooks_.clear();
  armed_ = false;
}

std::vector<std::string> DelayedAllreduce::names() const {
  std::vector<std::string> out;
  for (const Param& p : params_) out.push_back(p.name);
  return out;
}

Tensor DelayedAllreduce::slot_view(size_t param) const {
  const auto [b, i] = slot_of_[param];
  const Tensor& t = params_[param].tensor;
  return buffers_[b].flat.narrow(0, buffers_[b].offsets[i], t.numel()).view(t.shape());
}

// A defined .grad moves into the buffer and becomes the view; a none stays none until its
// gradient arrives.
void DelayedAllreduce::attach_view(size_t p) {
  if (transforms_.source) return;  // mixed precision: the gradients stay with the shadows and masters
  NoGradGuard no_grad;
  const Tensor& t = params_[p].tensor;
  Tensor g = t.grad();
  if (!g.defined()) return;
  Tensor slot = slot_view(p);
  if (g.data_ptr() == slot.data_ptr()) return;
  slot.copy_(g);
  t.set_grad(slot);
}

void DelayedAllreduce::wait_outstanding() noexcept {
  for (Buffer& b : buffers_) {
    if (!b.work) continue;
    try {
      b.work->wait();  // it writes into b.flat
    } catch (...) {
    }
    b.work.reset();
  }
}

void DelayedAllreduce::prepare_for_backward() {
  wait_outstanding();  // a backward that threw may have launched one
  armed_ = !hooks_.empty();
  adopted_task_ = 0;
  hook_param_ready_ = false;
  launched_ = false;
  ready_count_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  unfinished_.clear();
}

void DelayedAllreduce::check_finalized() const {
  if (!unfinished_.empty()) fail("{}", unfinished_);
}

void DelayedAllreduce::begin_iteration_backward() {
  if (adopted_task_ != 0) return;
  adopted_task_ = autograd::current_graph_task_id();
  autograd::queue_callback([this] { finalize(); });
}

void DelayedAllreduce::join_current_backward() {
  if (armed_) begin_iteration_backward();
}

void DelayedAllreduce::on_grad_ready(size_t param) {
  // Outside a synchronised iteration (no_sync) the gradient accumulates in place in its view;
  // a .grad allocated afresh (after set_to_none) moves into the buffer now.
  if (!armed_) {
    attach_view(param);
    return;
  }
  begin_iteration_backward();
  if (autograd::current_graph_task_id() != adopted_task_ || ready_[param]) return;
  ready_[param] = true;
  ++ready_count_;
  if (transforms_.source) {
    NoGradGuard no_grad;
    Tensor g = transforms_.source(param, params_[param].tensor.grad());
    Tensor slot = slot_view(param);
    if (g.defined()) {
      slot.copy_(g);
    } else {
      slot.zero_();
    }
  } else {
    attach_view(param);
  }
  if (hook_param_ready_ && ready_count_ == params_.size()) launch();
}

void DelayedAllreduce::on_hook_param_ready() {
  if (!armed_) return;
  begin_iteration_backward();
  if (autograd::current_graph_task_id() != adopted_task_) return;
  hook_param_ready_ = true;
  if (ready_count_ == params_.size()) launch();
}

void DelayedAllreduce::launch() {
  if (launched_) return;
  launched_ = true;
  NoGradGuard no_grad;
  AsyncIssueGuard async_issue;  // overlaps with the rest of backward
  for (Buffer& b : buffers_) {
    if (group_->size() > 1) b.flat.div_(group_->size());  // divide first: low precision must not overflow
    b.work = group_->allreduce(b.flat, ReduceOp::sum);
    ++launches_;
  }
}

void DelayedAllreduce::finalize() {
  if (!armed_) return;
  armed_ = false;
  NoGradGuard no_grad;
  std::vector<std::string> missing;
  for (size_t p = 0; p < params_.size(); ++p) {
    if (ready_[p]) continue;
    if (!find_unused_) {
      missing.push_back(params_[p].name);
      continue;
    }
    // Locally unused: contributes what .grad holds (accumulated under no_sync), else zeros.
    Tensor g = params_[p].tensor.grad();
    if (transforms_.source) g = transforms_.source(p, g);
    Tensor slot = slot_view(p);
    if (!g.defined()) {
      slot.zero_();
    } else if (g.data_ptr() != slot.data_ptr()) {
      slot.copy_(g);
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
  launch();  // at the latest here (the hook parameter may not have been reached)
  for (Buffer& b : buffers_) {
    WorkPtr w = std::exchange(b.work, nullptr);
    w->wait();  // the optimizer step after backward must never race it
  }
  for (size_t p = 0; p < params_.size(); ++p) {
    Tensor slot = slot_view(p);
    const bool step = p < steps_.size() && steps_[p];
    if (transforms_.sink) {
      if (step) {
        transforms_.finish(p, slot);  // the master, with its upcast gradient, before its step
      } else {
        transforms_.sink(p, slot);
      }
    } else {
      const Tensor grad = params_[p].tensor.grad();
      if (!grad.defined() || grad.data_ptr() != slot.data_ptr()) params_[p].tensor.set_grad(slot);
    }
    if (step) steps_[p]->step();
  }
}

}  // namespace tandem::dist
