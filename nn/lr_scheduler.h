// Learning-rate schedules, as torch.optim.lr_scheduler: a scheduler is built on an optimizer (whose
// groups' learning rates at that moment are its base rates), sets epoch 0's rates at once, and
// step() — once per epoch or per iteration, after optimizer.step() — moves to the next epoch.
// Each rate is the schedule's closed form at that epoch, so a resumed run (load_state_dict) lands
// on exactly the rates of an uninterrupted one.
//
//   optim::SGD sgd(model.parameters(), {.lr = 0.1, .momentum = 0.9});
//   optim::CosineAnnealingLR cosine(sgd, /*t_max=*/epochs);
//   for (int e = 0; e < epochs; ++e) { train_one_epoch(); cosine.step(); }
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "nn/optim.h"

namespace tandem::optim {

class LRScheduler {
 public:
  LRScheduler(Optimizer& optimizer, std::string name);  // adds itself to optimizer.schedulers()
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  void step();  // next epoch: every group's lr becomes lr_at(epoch, group)
  int64_t last_epoch() const { return last_epoch_; }
  std::vector<double> last_lr() const;  // the rates step() set last, per group (get_last_lr)
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // The schedule's rate for `group` at `epoch` (>= 0).
  virtual double lr_at(int64_t epoch, size_t group) const = 0;

  // "last_epoch" (i64) and "base_lrs" (f64, one per group): save it beside the optimizer's
  // (e.g. under a "lr_scheduler." prefix in the same file). Loading checks both, then applies the
  // rates of the loaded epoch.
  TensorDict state_dict() const;
  void load_state_dict(const TensorDict& state);
  // What load_state_dict checks, without changing anything (throws its error).
  void check_state_dict(const TensorDict& state) const;
  // Moves the schedule to `epoch` without setting any rate: what a ZeroRedundancyOptimizer under a
  // Join does to the schedulers of a rank that ran out of data, whose optimizer already took the
  // rates of a rank still training. (load_state_dict sets the rates too.)
  void set_last_epoch(int64_t epoch);

 protected:
  void apply();  // sets every group's lr for last_epoch_
  virtual void set_base_lrs(std::vector<double> bases) { base_lrs_ = std::move(bases); }
  Optimizer& optimizer_;
  std::string name_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;

  friend class SequentialLR;
  friend class Optimizer;
  bool optimizer_gone_ = false;  // the optimizer was destroyed first
};

// lr = base * gamma ^ floor(epoch / step_size)
class StepLR : public LRScheduler {
 public:
  StepLR(Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr = eta_min + (base - eta_min) * (1 + cos(pi * epoch / t_max)) / 2 (periodic beyond t_max, as
// PyTorch's).
class CosineAnnealingLR : public LRScheduler {
 public:
  CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min = 0);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// Linear warm-up (or decay): the factor on the base rate moves from start_factor to end_factor
// over total_iters epochs, then stays.
class LinearLR : public LRScheduler {
 public:
  LinearLR(Optimizer& optimizer, double start_factor = 1.0 / 3, double end_factor = 1.0, int64_t total_iters = 5);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  double start_factor_, end_factor_;
  int64_t total_iters_;
};

// One schedule after another: schedulers[i] runs from milestones[i - 1] (its own epoch 0) until
// milestones[i]. Build the children back to back on the same optimizer, then this: they all keep
// the base rates of the first (as PyTorch's initial_lr), e.g. a warm-up then a cosine.
class SequentialLR : public LRScheduler {
 public:
  SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
               std::vector<int64_t> milestones);
  double lr_at(int64_t epoch, size_t group) const override;

 private:
  void set_base_lrs(std::vector<double> bases) override;  // the children's too
  std::vector<std::shared_ptr<LRScheduler>> schedulers_;
  std::vector<int64_t> milestones_;
};

}  // namespace tandem::optim
