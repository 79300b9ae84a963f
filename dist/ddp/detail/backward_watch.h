// Which backward is DDP's: one that reaches the output of a synchronised forward. After such a
// forward DDP arms the watch with the forward's outputs; a backward-start observer, process-wide
// so that DDP can be driven from any thread, then adopts the first backward that reaches one of
// them, before any of its nodes runs. Gradient hooks fired by any other backward (another model
// sharing parameters, a forward outside DDP) are not the iteration's. The bucket reducer and the
// delayed allreduce follow the same watch, so they always agree on which backward reduces.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "autograd/backward_seam.h"
#include "core/tensor.h"

namespace tandem::dist {

class BackwardWatch {
 public:
  // `adopt(task, forwards_reached)` runs on the thread that starts the adopted backward, once per
  // arming, with how many of the armed forwards' outputs that backward reaches.
  using Adopt = std::function<void(const autograd::GraphTask& task, size_t forwards_reached)>;
  // `fallback`: the leaves that stand for a forward whose result holds no tensor DDP can see
  // (then any backward that reaches them is adopted).
  BackwardWatch(TensorList fallback, Adopt adopt);
  ~BackwardWatch();
  BackwardWatch(const BackwardWatch&) = delete;
  BackwardWatch& operator=(const BackwardWatch&) = delete;

  // After a synchronised forward in grad mode; several calls before a backward add forwards.
  void arm(const TensorList& outputs);
  // Forwards never backwarded are forgiven: those whose outputs nothing holds any more are dropped.
  void forget_dropped();
  void disarm();
  // No backward is adopted any more; returns once no call of the observer is running.
  void stop();

 private:
  void on_backward_start(const autograd::GraphTask& task);

  TensorList fallback_;
  Adopt adopt_;
  uint64_t observer_ = 0;
  bool stopped_ = false;
  std::mutex mutex_;  // the observer runs on whichever thread starts a backward
  bool armed_ = false;
  std::vector<std::vector<autograd::GraphAnchor>> pending_forwards_;  // output nodes per forward
};

}  // namespace tandem::dist
