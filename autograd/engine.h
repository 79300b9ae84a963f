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
  // Unique over the process's lifetime: tells this backward from a later one that happens to
  // sit at the same address.
  uint64_t id() const { return id_; }

 private:
  friend struct EngineAccess;
  std::vector<Node*> nodes_sorted_;  // sorted by pointer for lookup
  uint64_t id_ = 0;
};

// The id of the innermost backward running on this thread, 0 when none.
uint64_t current_graph_task_id();

// Queues fn to run once the current backward has finished, after every node (callbacks may
// queue more). Only valid inside a backward (e.g. from a hook): otherwise throws.
void queue_callback(std::function<void()> fn);
bool in_backward();

// Observers called at the start of every backward, on whichever thread runs it, before any node
// runs (DDP uses this to adopt the backwards of its forwards and to learn which parameters the
// loss does not reach). They are process-wide, so a model may be driven from any thread: an
// observer must tell its own backwards from others' (the threads backend runs one rank per
// thread) and must be safe to call from several threads at once. Removed by the returned id;
// once remove returns, the observer is not running anywhere and is never called again.
uint64_t add_backward_start_observer(std::function<void(const GraphTask&)> fn);
void remove_backward_start_observer(uint64_t id);

}  // namespace tandem::autograd
