// Optimizers over parameter groups: SGD (momentum, dampening, weight decay, Nesterov), Adam and
// AdamW (bias correction, optional AMSGrad), with torch.optim's update rules exactly. Steps run
// under no_grad and update parameters in place; a parameter whose grad is undefined is skipped.
// Contiguous parameters on a device (CUDA) are updated by the backend's fused kernels
// (core/detail/optim_kernels.h): one launch per group, device and dtype covers all of them.
//
// state_dict() flattens the state into named tensors so it fits a safetensors file:
//   "state.<i>.momentum_buffer" | "state.<i>.exp_avg" | "state.<i>.exp_avg_sq" |
//   "state.<i>.max_exp_avg_sq" | "state.<i>.step"   (i: the parameter's index over all groups)
//   "param_groups.<g>.params"  (i64 [n]: the indices of the group's parameters)
//   "param_groups.<g>.<hyperparameter>"  (0-dim f64: lr, momentum, betas as beta1/beta2, ...)
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "nn/module.h"

namespace tandem::optim {

using nn::TensorDict;

class LRScheduler;

// What an optimizer keeps per parameter: a step count (Adam) and named buffers.
struct ParamState {
  int64_t step = 0;
  TensorDict buffers;
};

template <class Options>
struct ParamGroup {
  TensorList params;
  Options options;
};

// Hyperparameters are plain aggregates, so designated initialisers read well:
//   optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
struct SGDOptions {
  double lr = 1e-3;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool maximize = false;

  std::vector<std::pair<std::string, double>> hyperparameters() const;
  void set_hyperparameter(const std::string& name, double value);
  void validate() const;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;  // Adam: L2 added to the gradient; AdamW: decoupled decay
  bool amsgrad = false;
  bool maximize = false;

  std::vector<std::pair<std::string, double>> hyperparameters() const;
  void set_hyperparameter(const std::string& name, double value);
  void validate() const;
};

// AdamW's defaults differ from Adam's only in the weight decay (1e-2, as torch.optim.AdamW); a
// separate aggregate so `AdamW(params, {.lr = 3e-4})` keeps that default.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  bool maximize = false;
  operator AdamOptions() const {  // NOLINT: the groups of AdamW hold AdamOptions
    return AdamOptions{lr, beta1, beta2, eps, weight_decay, amsgrad, maximize};
  }
};

class Optimizer {
 public:
  explicit Optimizer(std::string name) : name_(std::move(name)) {}
  virtual ~Optimizer();  // its schedulers, if they outlive it, let go of it
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // Steps `param` alone, as step() would step it (nothing if its gradient is undefined): the
  // step of one parameter of a larger optimizer, run in backward once its gradient is reduced
  // (ZeroRedundancyOptimizer's overlap_with_ddp). Not thread-safe against other steps. An
  // optimizer whose step() cannot skip parameters (supports_step_only() false), or a parameter it
  // does not hold, is an error.
  void step_only(const Tensor& param);
  virtual bool supports_step_only() const { return false; }
  // set_to_none drops the gradients (the default, as in PyTorch 2); otherwise zeroes them.
  void zero_grad(bool set_to_none = true);

  const std::string& name() const { return name_; }
  virtual size_t num_param_groups() const = 0;
  virtual const TensorList& group_params(size_t group) const = 0;
  TensorList parameters() const;  // every group's parameters, in order
  virtual double lr(size_t group = 0) const = 0;
  virtual void set_lr(double lr) = 0;  // every group
  virtual void set_lr(size_t group, double lr) = 0;  // one group (what schedules set)

  // The state of a parameter, nullptr until a step has touched it.
  const ParamState* state(const Tensor& param) const;

  // The learning-rate schedulers built on this optimizer and still alive, in the order they were
  // made (each LRScheduler adds itself): what a ZeroRedundancyOptimizer under a Join brings up to
  // date on a rank that ran out of data and stopped stepping them.
  const std::vector<LRScheduler*>& schedulers() const { return schedulers_; }

  virtual TensorDict state_dict() const;
  // Validates everything (parameter indices, shapes, hyperparameter names, group sizes) before
  // changing anything; state tensors are copied to each parameter's dtype and device.
  virtual void load_state_dict(const TensorDict& state_dict);

 protected:
  virtual std::vector<std::pair<std::string, double>> group_hyperparameters(size_t group) const = 0;
  virtual void set_group_hyperparameter(size_t group, const std::string& name, double value) = 0;
  // The buffer names this optimizer keeps per parameter, and whether it counts steps.
  virtual std::vector<std::string> state_names() const = 0;
  virtual bool counts_steps() const = 0;

  ParamState& state_for(const Tensor& param) { return state_[param.impl()]; }
  // True when step() must leave `param` alone: a step_only of another parameter runs.
  bool skips(const Tensor& param) const { return only_ != nullptr && param.impl() != only_; }
  // Parameters must be defined floating leaves, each in one group only.
  void check_new_params(const TensorList& params) const;

  std::string name_;
  std::unordered_map<const TensorImpl*, ParamState> state_;

 private:
  friend class LRScheduler;
  const TensorImpl* only_ = nullptr;  // step_only's parameter while it runs
  std::vector<LRScheduler*> schedulers_;
};

template <class Options>
class OptimizerWithOptions : public Optimizer {
 public:
  using Group = ParamGroup<Options>;

  std::vector<Group>& param_groups() { return groups_; }
  const std::vector<Group>& param_groups() const { return groups_; }
  void add_param_group(Group group) {
    group.options.validate();
    check_new_params(group.params);
    groups_.push_back(std::move(group));
  }

  size_t num_param_groups() const override { return groups_.size(); }
  const TensorList& group_params(size_t g) const override { return groups_.at(g).params; }
  double lr(size_t g = 0) const override { return groups_.at(g).options.lr; }
  void set_lr(double lr) override {
    for (auto& g : groups_) g.options.lr = lr;
  }
  void set_lr(size_t g, double lr) override { groups_.at(g).options.lr = lr; }

 protected:
  using Optimizer::Optimizer;
  std::vector<std::pair<std::string, double>> group_hyperparameters(size_t g) const override {
    return groups_.at(g).options.hyperparameters();
  }
  void set_group_hyperparameter(size_t g, const std::string& name, double value) override {
    groups_.at(g).options.set_hyperparameter(name, value);
  }

  std::vector<Group> groups_;
};

class SGD : public OptimizerWithOptions<SGDOptions> {
 public:
  explicit SGD(const TensorList& params, SGDOptions options = {});
  explicit SGD(std::vector<Group> groups);
  void step() override;
  bool supports_step_only() const override { return true; }

 protected:
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  bool counts_steps() const override { return false; }
};

// Adam and AdamW share the update; AdamW decays the parameter (p *= 1 - lr * wd) instead of
// adding wd * p to the gradient.
class Adam : public OptimizerWithOptions<AdamOptions> {
 public:
  explicit Adam(const TensorList& params, AdamOptions options = {});
  explicit Adam(std::vector<Group> groups);
  void step() override;
  bool supports_step_only() const override { return true; }

 protected:
  Adam(std::string name, bool decoupled) : OptimizerWithOptions(std::move(name)), decoupled_(decoupled) {}
  std::vector<std::string> state_names() const override { return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}; }
  bool counts_steps() const override { return true; }

 private:
  bool decoupled_ = false;
};

class AdamW : public Adam {
 public:
  explicit AdamW(const TensorList& params, AdamWOptions options = {});
  explicit AdamW(std::vector<Group> groups);
};

}  // namespace tandem::optim

namespace tandem::nn {
namespace optim = tandem::optim;
}  // namespace tandem::nn
