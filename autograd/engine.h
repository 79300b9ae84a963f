// backward(): replays, in reverse tape order, exactly the nodes the roots depend on.
#pragma once

#include <functional>

#include "autograd/backward_seam.h"
#include "autograd/node.h"

namespace tandem::autograd {

// Runs backward from `roots` (with `grads`, or ones for scalar roots). Without retain_graph the
// saved tensors of every node that ran are freed, so a second backward through them throws.
void backward(const TensorList& roots, const TensorList& grads = {}, bool retain_graph = false);

// GraphTask, the running backward's id and callbacks, and the backward-start observers are
// declared in backward_seam.h (what dist may know of a backward).

}  // namespace tandem::autograd
