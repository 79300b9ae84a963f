// backward(): replays, in reverse tape order, exactly the nodes the roots depend on.
#pragma once

#include <functional>

#include "autograd/node.h"

namespace tandem::autograd {

// Runs backward from `roots` (with `grads`, or ones for scalar roots). Without retain_graph the
// saved tensors of every node that ran are freed, so a second backward through them throws.
void backward(const TensorList& roots, const TensorList& grads = {}, bool retain_graph = false);

// What a running backward knows when it starts: the nodes (and so the leaves) the roots reach.
class GraphTask {
 public:
  // True when this backward will deliver a gradient to `leaf` (a tensor that requires grad).
  bool reaches(const Tensor& leaf) const;
  bool reaches(const Node* node) const;

 private:
  friend struct EngineAccess;
  std::vector<Node*> nodes_sorted_;  // sorted by pointer for lookup
};

// Queues fn to run once the current backward has finished, after every node (callbacks may
// queue more). Only valid inside a backward (e.g. from a hook): otherwise throws.
void queue_callback(std::function<void()> fn);
bool in_backward();

// Observers are per thread (each rank of the threads backend has its own autograd state):
// register and remove one on the thread that runs the backwards it observes.
// Observers called at the start of every backward on this thread, before any node runs (DDP
// uses this to learn which parameters the loss does not reach). Removed by the returned id.
uint64_t add_backward_start_observer(std::function<void(const GraphTask&)> fn);
void remove_backward_start_observer(uint64_t id);

}  // namespace tandem::autograd
