// Optimizer in backward (PyTorch's torch.distributed.optim._apply_optimizer_in_backward): every
// parameter gets an optimizer of its own, stepped in the parameter's post-accumulate-grad hook
// the moment its gradient is final, so the step overlaps the rest of backward and each gradient
// can be dropped as soon as it has been used (`.grad` is set to none after the step unless
// `keep_grads`, PyTorch's DDP_OVERLAPPED_OPTIM_SET_GRADS_TO_NONE=0).
//
//   auto in_backward = optim::apply_optimizer_in_backward(optim::AdamWOptions{.lr = 1e-3},
//                                                         model.parameters());
//   loss.backward();   // every parameter the loss reaches is stepped, once, during backward
//
// The returned object owns the hooks: keep it alive as long as the parameters should be
// stepped (destroying it, or remove(), stops stepping).
//
// A gradient synchroniser (DDP) must step a parameter only after its gradient has been
// reduced. It takes the parameter's step over (take_over_in_backward_step): the local hook then
// leaves that parameter alone and the synchroniser calls InBackwardStep::step() itself, on any
// thread. claim_gradient marks parameters whose gradients it manages, so that an optimizer
// applied to them afterwards, which the synchroniser would never step, is an error instead.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "autograd/hooks.h"
#include "nn/optim.h"

namespace tandem::optim {

// The kind of per-parameter optimizer and its hyperparameters: SGDOptions -> SGD, AdamOptions
// -> Adam, AdamWOptions -> AdamW.
using OptimizerSpec = std::variant<SGDOptions, AdamOptions, AdamWOptions>;

struct InBackwardOptions {
  bool keep_grads = false;  // leave .grad in place after the step (zero it yourself between steps)
};

// One parameter's step: its optimizer and what to do with the gradient afterwards. Shared by
// the InBackwardOptimizers that made it and, while it is taken over, by the synchroniser, so
// either may be destroyed first.
class InBackwardStep {
 public:
  InBackwardStep(Tensor param, std::unique_ptr<Optimizer> optimizer, bool keep_grads);
  // A step another optimizer provides (register_in_backward_steps): `step` updates the
  // parameter from its .grad; it has no optimizer() of its own.
  InBackwardStep(Tensor param, std::function<void()> step, bool keep_grads);
  InBackwardStep(const InBackwardStep&) = delete;
  InBackwardStep& operator=(const InBackwardStep&) = delete;

  // Steps the parameter with its current .grad (nothing happens if it is undefined), then sets
  // .grad to none unless keep_grads. Does nothing once the owning InBackwardOptimizers was
  // removed or destroyed: the user turned stepping off. Serialised against itself and against
  // the owner's set_lr/state_dict/load_state_dict; steps of different parameters may run
  // concurrently, on any thread (it enters no-grad mode itself).
  void step();

  bool keep_grads() const { return keep_grads_; }
  Optimizer& optimizer();
  const Optimizer& optimizer() const;
  const Tensor& parameter() const { return param_; }
  // False once the owner was removed or destroyed.
  bool active() const { return !removed_.load(std::memory_order_acquire); }
  // True while a synchroniser holds it (the local hook then does not step it).
  bool taken_over() const { return taken_.load(std::memory_order_acquire); }

 private:
  friend class InBackwardOptimizers;
  friend class InBackwardRegistration;
  friend std::shared_ptr<InBackwardStep> take_over_in_backward_step(const Tensor&, const std::string&);
  friend void give_back_in_backward_step(const Tensor&) noexcept;

  // What the post-accumulate-grad hook runs.
  void step_from_hook();

  mutable std::mutex mu_;
  Tensor param_;
  std::unique_ptr<Optimizer> optimizer_;
  std::function<void()> step_fn_;  // instead of optimizer_
  bool keep_grads_;
  std::atomic<bool> removed_{false};
  std::atomic<bool> taken_{false};
  std::string taker_;  // guarded by the registry's mutex
};

// What apply_optimizer_in_backward returns: the per-parameter optimizers and their hooks.
class InBackwardOptimizers {
 public:
  ~InBackwardOptimizers();  // remove()
  InBackwardOptimizers(const InBackwardOptimizers&) = delete;
  InBackwardOptimizers& operator=(const InBackwardOptimizers&) = delete;

  size_t size() const { return params_.size(); }
  const TensorList& parameters() const { return params_; }
  // The optimizer of parameters()[i], or of `param` ("[apply_optimizer_in_backward] ..." if it
  // is not one of them). Calling its step() directly bypasses the step's lock: do it only while
  // no backward or synchroniser can step the same parameter.
  Optimizer& optimizer(size_t i);
  Optimizer& optimizer_for(const Tensor& param);

  // The learning rate (the spec's while there are no parameters); set_lr changes every
  // per-parameter optimizer's, for schedules.
  double lr() const;
  void set_lr(double lr);

  // "<i>.<key of parameters()[i]'s optimizer>", e.g. "0.state.0.exp_avg", "3.param_groups.0.lr".
  TensorDict state_dict() const;
  // Checks every entry against a scratch optimizer of the same kind first, so a dict that does
  // not fit (other parameter count or shapes, another optimizer kind, unknown keys) changes
  // nothing; then loads each parameter's part.
  void load_state_dict(const TensorDict& state_dict);

  // Removes every hook and the registry entries; stepping stops, also for a synchroniser that
  // holds one of the steps. Idempotent; the optimizers and their state stay readable.
  void remove() noexcept;

 private:
  friend std::shared_ptr<InBackwardOptimizers> apply_optimizer_in_backward(const OptimizerSpec&, const TensorList&,
                                                                           InBackwardOptions);
  InBackwardOptimizers(const OptimizerSpec& spec, const TensorList& params, InBackwardOptions options);
  void attach();  // the registry entries, then the hooks

  OptimizerSpec spec_;
  InBackwardOptions options_;
  TensorList params_;
  std::vector<std::shared_ptr<InBackwardStep>> steps_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<HookHandle> hooks_;
  bool registered_ = false;  // the registry holds our entries
};

// Gives each of `params` (defined floating leaves that require grad, each once, none with an
// optimizer in backward already, none claimed by a synchroniser) its own optimizer. Nothing
// changes when a check fails.
std::shared_ptr<InBackwardOptimizers> apply_optimizer_in_backward(const OptimizerSpec& spec, const TensorList& params,
                                                                  InBackwardOptions options = {});

// In-backward steps that another optimizer provides, registered for a synchroniser to take over
// as it takes over apply_optimizer_in_backward's, but with no local hooks: they run only once a
// synchroniser (DDP) has reduced the gradient. ZeroRedundancyOptimizer's overlap_with_ddp
// registers one per parameter. Destroying the registration (or remove()) stops stepping and
// removes the entries.
class InBackwardRegistration {
 public:
  ~InBackwardRegistration();  // remove()
  InBackwardRegistration(const InBackwardRegistration&) = delete;
  InBackwardRegistration& operator=(const InBackwardRegistration&) = delete;
  void remove() noexcept;
  const std::vector<std::shared_ptr<InBackwardStep>>& steps() const { return steps_; }

 private:
  friend std::unique_ptr<InBackwardRegistration> register_in_backward_steps(
      std::vector<std::shared_ptr<InBackwardStep>>, const std::string&);
  explicit InBackwardRegistration(std::vector<std::shared_ptr<InBackwardStep>> steps) : steps_(std::move(steps)) {}
  std::vector<std::shared_ptr<InBackwardStep>> steps_;
  bool registered_ = false;
};
// Registers `steps` (each parameter once, none with an in-backward step already, none claimed by a
// synchroniser; `who` names the caller in errors). Nothing changes when a check fails.
std::unique_ptr<InBackwardRegistration> register_in_backward_steps(std::vector<std::shared_ptr<InBackwardStep>> steps,
                                                                   const std::string& who);

// True while `param` has an optimizer in backward (from apply_optimizer_in_backward until its
// owner is removed or destroyed), whether or not a synchroniser has taken its step over. What
// must run between backward and the step (nn::utils::clip_grad_norm_) asks this: for such a
// parameter the step has already run when backward returns.
bool has_optimizer_in_backward(const Tensor& param);

// ---- The seam for a gradient synchroniser such as DDP ----

// The in-backward step of `param`, or nullptr if it has none. From now on its local hook does
// not step it; the caller does, with InBackwardStep::step(). Taking a step another owner holds
// is an error ("[take_over_in_backward_step] ..."); `owner` names the taker in errors.
std::shared_ptr<InBackwardStep> take_over_in_backward_step(const Tensor& param, const std::string& owner);
// Undoes take_over (the local hook steps again), e.g. when DDP is destroyed. Nothing happens if
// `param` has no in-backward step or it is not taken.
void give_back_in_backward_step(const Tensor& param) noexcept;

// Marks `param` as having its gradients managed by `owner`: apply_optimizer_in_backward on it
// then throws "[apply_optimizer_in_backward] parameter <shape> is managed by <owner>: apply the
// optimizer in backward before wrapping the module in <owner>". Claims by the same owner nest
// (each needs an unclaim); a claim by another owner is an error ("[claim_gradient] ...").
void claim_gradient(const Tensor& param, const std::string& owner);
// Drops one claim; nothing happens if `param` is not claimed.
void unclaim_gradient(const Tensor& param) noexcept;

}  // namespace tandem::optim
