// Delayed-allreduce parameters (DdpOptions::delay_all_reduce_named_params with
// param_to_hook_all_reduce): the named parameters leave DDP's buckets; their gradients live in
// one flat buffer per dtype and device (each `.grad` is a view into it, re-attached after a
// zero_grad(set_to_none)), averaged by one asynchronous allreduce per buffer, launched when the
// hook parameter's gradient is final and every delayed gradient is final, at the latest in the
// end-of-backward callback, which waits for it. The allreduce runs on a child group of its own,
// so where it falls among the buckets' collectives cannot differ between ranks. The use case: a
// big embedding whose allreduce must not hold up an all_to_all on the main group.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "autograd/hooks.h"
#include "dist/process_group.h"
#include "dist/reducer.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

class DelayedAllreduce {
 public:
  struct Param {
    std::string name;
    Tensor tensor;
  };

  // `group` is the group the allreduce runs on (DDP makes a child group of its own for it).
  // `hook_param` may be one of `params` or any other parameter that requires a gradient.
  // `reduce_dtype`: the buffers' dtype for floating parameters (mixed precision), else theirs.
  DelayedAllreduce(std::vector<Param> params, Tensor hook_param, std::string hook_name, ProcessGroupPtr group,
                   bool find_unused_parameters, std::optional<Dtype> reduce_dtype = std::nullopt);
  ~DelayedAllreduce();
  DelayedAllreduce(const DelayedAllreduce&) = delete;
  DelayedAllreduce& operator=(const DelayedAllreduce&) = delete;

  // After a synchronised forward in grad mode: the next backward that fires our hooks reduces.
  void prepare_for_backward();
  // Throws when the last synchronised backward left a delayed gradient unreduced.
  void check_finalized() const;
  void remove_autograd_hooks();
  // Optimizer in backward: steps[p] (null for none) steps delayed parameter p once the
  // allreduce is in, at the end of backward.
  void set_in_backward_steps(std::vector<std::shared_ptr<optim::InBackwardStep>> steps) { steps_ = std::move(steps); }
  // Mixed precision: gradients come from, and go back to, the parameters' shadows and masters
  // (then .grad is never a view into the buffer).
  void set_gradient_transforms(GradientTransforms transforms) { transforms_ = std::move(transforms); }
  // The bucket reducer adopted the backward running on this thread as the iteration's: the
  // delayed reduction joins it even if none of its parameters (nor the hook parameter) gets a
  // gradient on this rank, so its allreduce is still issued, with zeros.
  void join_current_backward();
  // This backward's reduction is under way and its end-of-backward callback has not run yet.
  bool finalize_pending() const { return armed_ && adopted_task_ != 0; }

  int64_t launches() const { return launches_; }  // allreduces issued so far (one per buffer and iteration)
  const ProcessGroup& group() const { return *group_; }
  std::vector<std::string> names() const;

 private:
  struct Buffer {
    Tensor flat;
    std::vector<size_t> params;
    std::vector<int64_t> offsets;
    WorkPtr work;
  };

  Tensor slot_view(size_t param) const;
  void attach_view(size_t param);
  void wait_outstanding() noexcept;
  void on_grad_ready(size_t param);
  void on_hook_param_ready();
  void begin_iteration_backward();
  void launch();
  void finalize();

  std::vector<Param> params_;
  Tensor hook_param_;
  std::string hook_name_;
  ProcessGroupPtr group_;
  bool find_unused_ = false;
  std::vector<Buffer> buffers_;
  std::vector<std::pair<size_t, size_t>> slot_of_;  // param -> (buffer, index)
  std::vector<HookHandle> hooks_;
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps_;
  GradientTransforms transforms_;

  bool armed_ = false;        // a synchronised forward ran
  uint64_t adopted_task_ = 0; // the backward reducing this iteration
  bool hook_param_ready_ = false;
  bool launched_ = false;
  std::vector<bool> ready_;
  size_t ready_count_ = 0;
  std::string unfinished_;  // why the last reduction did not finish
  int64_t launches_ = 0;
};

}  // namespace tandem::dist
