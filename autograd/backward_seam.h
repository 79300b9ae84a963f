// The seam between autograd and the layers that watch its backwards (dist's DDP), in one header:
// besides the public API (ops.h, grad_mode.h, and hooks.h's grad-ready hooks,
// register_post_accumulate_grad_hook), this is all of autograd's machinery that dist reaches.
// - The backward-start observer, with the identity of a backward (GraphTask: its id, and whether
//   it will reach a given tensor or graph node).
// - Anchors: weak handles to the graph node that produces a tensor, so that a watcher can ask a
//   starting backward whether it reaches a forward's outputs without holding the graph alive.
// - The running backward on this thread: its id, and callbacks queued to run when it has finished.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace tandem::autograd {

class Node;

// A weak handle to the node that produces a tensor in the graph (an op output's grad_fn, a leaf's
// gradient accumulator). Expired once nothing holds that part of the graph any more (or when the
// tensor had no node).
class GraphAnchor {
 public:
  GraphAnchor() = default;
  bool expired() const { return node_.expired(); }

 private:
  friend GraphAnchor output_anchor(const Tensor& t);
  friend GraphAnchor leaf_anchor(const Tensor& leaf);
  friend class GraphTask;
  std::weak_ptr<Node> node_;
};

// The op node that produced `t` (its grad_fn); expired for a leaf or a tensor outside the graph.
GraphAnchor output_anchor(const Tensor& t);
// The gradient accumulator of a leaf that requires grad (once one exists); expired otherwise.
GraphAnchor leaf_anchor(const Tensor& leaf);

// What a running backward knows when it starts: the nodes (and so the leaves) the roots reach.
class GraphTask {
 public:
  // True when this backward will deliver a gradient to `leaf` (a tensor that requires grad).
  bool reaches(const Tensor& leaf) const;
  bool reaches(const Node* node) const;
  bool reaches(const GraphAnchor& anchor) const;  // false once the anchor expired
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
