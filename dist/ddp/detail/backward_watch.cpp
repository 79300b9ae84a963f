#include "dist/ddp/detail/backward_watch.h"

#include <algorithm>

namespace tandem::dist {

BackwardWatch::BackwardWatch(TensorList fallback, Adopt adopt)
    : fallback_(std::move(fallback)), adopt_(std::move(adopt)) {
  observer_ = autograd::add_backward_start_observer([this](const autograd::GraphTask& t) { on_backward_start(t); });
}

BackwardWatch::~BackwardWatch() { stop(); }

void BackwardWatch::stop() {
  if (stopped_) return;
  stopped_ = true;
  autograd::remove_backward_start_observer(observer_);  // returns once no call of it is running
  disarm();
}

void BackwardWatch::arm(const TensorList& outputs) {
  std::vector<autograd::GraphAnchor> nodes;
  for (const Tensor& t : outputs)
    if (autograd::GraphAnchor a = autograd::output_anchor(t); !a.expired()) nodes.push_back(std::move(a));
  if (nodes.empty()) {
    // No output DDP can see: the parameters' gradient accumulators stand in for it.
    for (const Tensor& p : fallback_) nodes.push_back(autograd::leaf_anchor(p));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  pending_forwards_.push_back(std::move(nodes));
}

void BackwardWatch::forget_dropped() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(pending_forwards_, [](const auto& outs) {
    return std::all_of(outs.begin(), outs.end(), [](const auto& w) { return w.expired(); });
  });
}

void BackwardWatch::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  pending_forwards_.clear();
}

void BackwardWatch::on_backward_start(const autograd::GraphTask& task) {
  // Runs on whichever thread starts a backward, DDP's or another's: only the state under the
  // mutex is read until the backward is known to be DDP's.
  size_t reached = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!armed_) return;
    for (const auto& outs : pending_forwards_) {
      reached += std::any_of(outs.begin(), outs.end(), [&](const auto& a) { return task.reaches(a); });
    }
    if (reached == 0) return;  // not the backward of a synchronised forward
    armed_ = false;
    pending_forwards_.clear();
  }
  adopt_(task, reached);
}

}  // namespace tandem::dist
