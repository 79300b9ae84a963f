// Delayed-allreduce parameters (DdpOptions::delay_all_reduce_named_params with
// param_to_hook_all_reduce): the named parameters leave DDP's buckets; their gradients live in
// one flat buffer per dtype and device (each `.grad` is a view into it, re-attached after a
// zero_grad(set_to_none)), averaged by one asynchronous allreduce per buffer on a child group of
// its own, so where it falls among the buckets' collectives cannot differ between ranks. The use
// case: a big embedding whose allreduce must not hold up an all_to_all on the main group.
//
// It reduces the backward DDP adopted (the bucket reducer's, or its own BackwardWatch's when every
// parameter is delayed), never one that merely fires its hooks first. When every delayed
// gradient is always produced (neither find_unused_parameters nor static_graph), the allreduce is
// launched as soon as the hook parameter's gradient and every delayed one are final; otherwise a
// rank may find a delayed parameter unused, and the launch waits for the end-of-backward
// callback, a point every rank reaches after the buckets' collectives (two communicators whose
// operations are ordered differently on two GPUs may deadlock). Locally unused delayed parameters
// contribute zeros (or what no_sync accumulated); those no rank used keep `.grad` as it was and are
// not stepped, as bucketed ones: a small used map on the child group tells (every iteration with
// find_unused_parameters, once under static_graph).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/hooks.h"
#include "dist/ddp/detail/backward_watch.h"
#include "dist/ddp/detail/grad_buckets.h"
#include "dist/process_group.h"
#include "dist/ddp/detail/reducer.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

struct DelayedAllreduceOptions {
  bool find_unused_parameters = false;
  bool static_graph = false;
  std::optional<Dtype> reduce_dtype;  // the buffers' dtype for floating parameters (mixed precision)
  // Mixed precision: gradients come from, and go back to, the parameters' shadows and masters
  // (then .grad is never a view into the buffer). Given here, before any view is attached.
  GradientTransforms transforms;
  // No bucket reducer adopts DDP's backward (every parameter is delayed): watch for it here.
  bool own_watch = false;
};

class DelayedAllreduce {
 public:
  struct Param {
    std::string name;
    Tensor tensor;
  };

  // `group` is the group the allreduce runs on (DDP makes a child group of its own for it).
  // `hook_param` may be one of `params` or any other parameter that requires a gradient.
  DelayedAllreduce(std::vector<Param> params, Tensor hook_param, std::string hook_name, ProcessGroupPtr group,
                   DelayedAllreduceOptions options);
  ~DelayedAllreduce();
  DelayedAllreduce(const DelayedAllreduce&) = delete;
  DelayedAllreduce& operator=(const DelayedAllreduce&) = delete;

  // After a synchronised forward in grad mode: DDP's next backward reduces (`outputs` arm the
  // own watch, when there is one).
  void prepare_for_backward(const TensorList& outputs);
  // At the start of every forward in grad mode: forwards never backwarded are forgiven, and so is
  // a backward that threw (its partial reduction is dropped).
  void prepare_for_forward();
  // After a forward in grad mode under no_sync (see Reducer::note_local_forward).
  void note_local_forward() { local_window_ = true; }
  // Throws when the last synchronised backward left a delayed gradient unreduced.
  void check_finalized() const;
  // No hook fires again, and an allreduce still in flight has finished when it returns.
  void remove_autograd_hooks();
  // Optimizer in backward: steps[p] (null for none) steps delayed parameter p once the
  // allreduce is in, at the end of backward.
  void set_in_backward_steps(std::vector<std::shared_ptr<optim::InBackwardStep>> steps) { steps_ = std::move(steps); }
  // The backward running on this thread is DDP's (the bucket reducer adopted it): the delayed
  // reduction joins it even if none of its parameters (nor the hook parameter) gets a gradient
  // on this rank, so its allreduce is still issued, with zeros.
  void join_current_backward();
  // With its own watch: called on the backward's thread when it adopts a backward, after its
  // end-of-backward callback is queued.
  void on_adopt(std::function<void()> fn) { on_adopt_ = std::move(fn); }
  // This backward's reduction is under way and its end-of-backward callback has not run yet.
  bool finalize_pending() const { return armed_ && adopted_task_ != 0; }

  int64_t launches() const { return launches_; }  // allreduces issued so far (one per buffer and iteration)
  const ProcessGroup& group() const { return *group_; }
  std::vector<std::string> names() const;

 private:
  Tensor slot_view(size_t param) const { return buckets_.slot_view(param); }
  void attach_view(size_t param);
  void wait_outstanding() noexcept { buckets_.wait_outstanding(); }
  void on_grad_ready(size_t param);
  void on_hook_param_ready();
  bool in_adopted_backward() const;
  bool backward_failed() const { return armed_ && adopted_task_ != 0; }  // outside a backward
  void check_static_graph() const;
  bool launches_early() const { return !options_.find_unused_parameters && !options_.static_graph; }
  void launch();
  void finalize();
  std::vector<bool> globally_unused();

  std::vector<Param> params_;
  Tensor hook_param_;
  std::string hook_name_;
  ProcessGroupPtr group_;
  DelayedAllreduceOptions options_;
  GradBuckets buckets_;  // one per dtype and device, parameters in registration order
  std::vector<HookHandle> hooks_;
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps_;
  std::unique_ptr<BackwardWatch> watch_;  // options_.own_watch only
  std::function<void()> on_adopt_;

  bool armed_ = false;        // a synchronised forward ran
  uint64_t adopted_task_ = 0; // the backward reducing this iteration
  bool hook_param_ready_ = false;
  bool launched_ = false;
  std::vector<bool> ready_;
  size_t ready_count_ = 0;
  std::vector<int32_t> local_used_;  // a hook fired since the last reduction (no_sync included)
  std::vector<Tensor> stash_;        // .grad of locally unused parameters before the reduction
  std::optional<std::vector<bool>> static_unused_anywhere_;  // static_graph: the first iteration's record
  std::vector<bool> static_used_here_;                       // ... and this rank's usage then
  bool local_window_ = false;  // a no_sync forward ran since the last synchronised one
  std::string unfinished_;  // why the last reduction did not finish
  int64_t launches_ = 0;
};

}  // namespace tandem::dist
