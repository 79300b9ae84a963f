#include "nn/lr_scheduler.h"

#include <cmath>
#include <numbers>

#include "autograd/ops.h"

namespace tandem::optim {

LRScheduler::LRScheduler(Optimizer& optimizer, std::string name) : optimizer_(optimizer), name_(std::move(name)) {
  for (size_t g = 0; g < optimizer_.num_param_groups(); ++g) base_lrs_.push_back(optimizer_.lr(g));
  optimizer_.schedulers_.push_back(this);
}

LRScheduler::~LRScheduler() {
  if (!optimizer_gone_) std::erase(optimizer_.schedulers_, this);
}

void LRScheduler::set_last_epoch(int64_t epoch) {
  TANDEM_CHECK(epoch >= 0, "[{}] set_last_epoch: the epoch must be >= 0, got {}", name_, epoch);
  last_epoch_ = epoch;
}

void LRScheduler::apply() {
  for (size_t g = 0; g < base_lrs_.size(); ++g) optimizer_.set_lr(g, lr_at(last_epoch_, g));
}

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

std::vector<double> LRScheduler::last_lr() const {
  std::vector<double> out;
  for (size_t g = 0; g < base_lrs_.size(); ++g) out.push_back(optimizer_.lr(g));
  return out;
}

TensorDict LRScheduler::state_dict() const {
  TensorDict d;
  d.insert("last_epoch", from_vector<int64_t>({last_epoch_}).reshape({}));
  d.insert("base_lrs", from_vector<double>(base_lrs_));
  return d;
}

void LRScheduler::load_state_dict(const TensorDict& state) {
  check_state_dict(state);
  set_base_lrs(state.at("base_lrs").to(f64).to(kCPU).to_vector<double>());
  last_epoch_ = state.at("last_epoch").to(i64).to(kCPU).item<int64_t>();
  apply();
}

void LRScheduler::check_state_dict(const TensorDict& state) const {
  const char* n = name_.c_str();
  const Tensor* epoch = state.find("last_epoch");
  const Tensor* bases = state.find("base_lrs");
  TANDEM_CHECK(epoch && bases, "[{}] load_state_dict: needs 'last_epoch' and 'base_lrs'", n);
  for (const auto& [key, t] : state)
    TANDEM_CHECK(key == "last_epoch" || key == "base_lrs", "[{}] load_state_dict: unexpected key '{}'", n, key);
  TANDEM_CHECK(epoch->numel() == 1 && !epoch->is_floating_point(),
               "[{}] load_state_dict: 'last_epoch' must be one integer, got {} of shape {}", n, epoch->dtype(),
               epoch->shape());
  const int64_t e = epoch->to(i64).to(kCPU).item<int64_t>();
  TANDEM_CHECK(e >= 0, "[{}] load_state_dict: 'last_epoch' must be >= 0, got {}", n, e);
  TANDEM_CHECK(bases->dim() == 1 && bases->numel() == static_cast<int64_t>(base_lrs_.size()),
               "[{}] load_state_dict: 'base_lrs' has shape {}, but the optimizer has {} groups", n, bases->shape(),
               base_lrs_.size());
  for (double v : bases->to(f64).to(kCPU).to_vector<double>())
    TANDEM_CHECK(v >= 0, "[{}] load_state_dict: a base rate is negative ({})", n, v);
}

StepLR::StepLR(Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer, "StepLR"), step_size_(step_size), gamma_(gamma) {
  TANDEM_CHECK(step_size > 0, "[StepLR] step_size must be positive, got {}", step_size);
  TANDEM_CHECK(gamma > 0, "[StepLR] gamma must be positive, got {}", gamma);
  apply();
}

double StepLR::lr_at(int64_t epoch, size_t group) const {
  return base_lrs_.at(group) * std::pow(gamma_, static_cast<double>(epoch / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer, "CosineAnnealingLR"), t_max_(t_max), eta_min_(eta_min) {
  TANDEM_CHECK(t_max > 0, "[CosineAnnealingLR] t_max must be positive, got {}", t_max);
  TANDEM_CHECK(eta_min >= 0, "[CosineAnnealingLR] eta_min must be >= 0, got {}", eta_min);
  apply();
}

double CosineAnnealingLR::lr_at(int64_t epoch, size_t group) const {
  const double phase = std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(t_max_);
  return eta_min_ + (base_lrs_.at(group) - eta_min_) * (1 + std::cos(phase)) / 2;
}

LinearLR::LinearLR(Optimizer& optimizer, double start_factor, double end_factor, int64_t total_iters)
    : LRScheduler(optimizer, "LinearLR"), start_factor_(start_factor), end_factor_(end_factor),
      total_iters_(total_iters) {
  TANDEM_CHECK(start_factor > 0 && start_factor <= 1 && end_factor >= 0 && end_factor <= 1,
               "[LinearLR] start_factor must be in (0, 1] and end_factor in [0, 1], got {} and {}", start_factor,
               end_factor);
  TANDEM_CHECK(total_iters > 0, "[LinearLR] total_iters must be positive, got {}", total_iters);
  apply();
}

double LinearLR::lr_at(int64_t epoch, size_t group) const {
  const double done = static_cast<double>(std::min(epoch, total_iters_)) / static_cast<double>(total_iters_);
  return base_lrs_.at(group) * (start_factor_ + (end_factor_ - start_factor_) * done);
}

SequentialLR::SequentialLR(Optimizer& optimizer, std::vector<std::shared_ptr<LRScheduler>> schedulers,
                           std::vector<int64_t> milestones)
    : LRScheduler(optimizer, "SequentialLR"), schedulers_(std::move(schedulers)), milestones_(std::move(milestones)) {
  TANDEM_CHECK(!schedulers_.empty(), "[SequentialLR] needs at least one scheduler");
  TANDEM_CHECK(milestones_.size() + 1 == schedulers_.size(),
               "[SequentialLR] {} schedulers need {} milestones, got {}", schedulers_.size(), schedulers_.size() - 1,
               milestones_.size());
  for (size_t i = 0; i < milestones_.size(); ++i)
    TANDEM_CHECK(milestones_[i] > (i == 0 ? 0 : milestones_[i - 1]),
                 "[SequentialLR] milestones must be positive and increasing, got {} at position {}", milestones_[i], i);
  for (const auto& s : schedulers_)
    TANDEM_CHECK(s && &s->optimizer_ == &optimizer, "[SequentialLR] every scheduler must drive the same optimizer");
  set_base_lrs(schedulers_.front()->base_lrs_);  // the rates before any child changed them
  apply();
}

void SequentialLR::set_base_lrs(std::vector<double> bases) {
  for (const auto& s : schedulers_) s->set_base_lrs(bases);
  base_lrs_ = std::move(bases);
}

double SequentialLR::lr_at(int64_t epoch, size_t group) const {
  size_t i = 0;
  while (i < milestones_.size() && epoch >= milestones_[i]) ++i;
  const int64_t start = i == 0 ? 0 : milestones_[i - 1];
  return schedulers_[i]->lr_at(epoch - start, group);
}

}  // namespace tandem::optim
