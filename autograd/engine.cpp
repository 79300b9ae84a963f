// The backward engine.
//
// backward() collects the nodes reachable from the roots, sorts them by sequence number
// (descending: reverse tape order; every node's inputs were recorded before it, so each node
// runs after all its consumers have delivered their gradients), and runs each exactly once
// with its summed input gradients. Leaves are reached through AccumulateGrad nodes, which run
// once per backward however often the leaf was used: that is where a leaf's gradient becomes
// final and its post-accumulate-grad hooks fire.
#include "autograd/engine.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "autograd/hooks.h"
#include "autograd/ops.h"
#include "core/trace.h"

namespace tandem::autograd {

struct EngineAccess {
  static std::vector<Node*>& nodes(GraphTask& t) { return t.nodes_sorted_; }
  static uint64_t& id(GraphTask& t) { return t.id_; }
};

bool GraphTask::reaches(const Node* node) const {
  return std::binary_search(nodes_sorted_.begin(), nodes_sorted_.end(), node);
}

bool GraphTask::reaches(const GraphAnchor& anchor) const {
  auto node = anchor.node_.lock();
  return node && reaches(node.get());
}

GraphAnchor output_anchor(const Tensor& t) {
  GraphAnchor a;
  if (auto* m = t.defined() ? meta(t) : nullptr; m && m->grad_fn) a.node_ = m->grad_fn;
  return a;
}

GraphAnchor leaf_anchor(const Tensor& leaf) {
  GraphAnchor a;
  if (auto* m = leaf.defined() ? meta(leaf) : nullptr) a.node_ = m->grad_accumulator;
  return a;
}

bool GraphTask::reaches(const Tensor& leaf) const {
  auto* m = meta(leaf);
  if (!m) return false;
  if (m->grad_fn) return reaches(m->grad_fn.get());
  auto acc = m->grad_accumulator.lock();
  return acc && reaches(acc.get());
}

namespace {

struct BackwardState {
  std::deque<std::function<void()>> callbacks;
  uint64_t task_id = 0;
};
thread_local BackwardState* current_backward = nullptr;
std::atomic<uint64_t> next_task_id{1};

// The process-wide observer list. A call in flight holds the entry alive and counts itself in
// `in_flight`, so that removal can wait for calls running on other threads to return.
struct Observer {
  uint64_t id = 0;
  std::function<void(const GraphTask&)> fn;
  std::atomic<bool> active{true};
  std::atomic<int> in_flight{0};
};
std::mutex observers_mutex;
std::vector<std::shared_ptr<Observer>> start_observers;  // guarded by observers_mutex
std::atomic<size_t> observer_count{0};                   // read without the lock on every backward
uint64_t next_observer_id = 1;                           // guarded by observers_mutex
thread_local const Observer* running_observer = nullptr;

void notify_start_observers(const GraphTask& task) {
  std::vector<std::shared_ptr<Observer>> snapshot;
  {
    std::lock_guard<std::mutex> lock(observers_mutex);
    snapshot = start_observers;
  }
  for (const auto& o : snapshot) {
    // Count first, then check: remove() clears `active` first, then waits for the count.
    o->in_flight.fetch_add(1);
    struct Leave {
      Observer* o;
      const Observer* outer;
      ~Leave() {
        running_observer = outer;
        o->in_flight.fetch_sub(1);
      }
    } leave{o.get(), running_observer};
    if (!o->active.load()) continue;
    running_observer = o.get();
    o->fn(task);
  }
}

// Applies the tensor hooks registered on a node output (or a leaf) in registration order.
Tensor run_tensor_hooks(const HookList<TensorHook>* hooks, Tensor grad, const OutputMeta& expected) {
  if (!hooks || hooks->hooks.empty()) return grad;
  // Copy: a hook may remove itself (or others) while running.
  auto snapshot = hooks->hooks;
  for (auto& [id, fn] : snapshot) {
    Tensor replaced = fn(grad);
    if (replaced.defined()) {
      TANDEM_CHECK(replaced.shape() == expected.shape,
                   "[hook] a gradient hook returned a tensor of shape {}, but the gradient has shape {}",
                   replaced.shape(), expected.shape);
      TANDEM_CHECK(replaced.dtype() == expected.dtype,
                   "[hook] a gradient hook returned dtype {}, but the gradient has dtype {}", replaced.dtype(),
                   expected.dtype);
      grad = std::move(replaced);
    }
  }
  return grad;
}

void check_gradient(const Tensor& g, const OutputMeta& expected, const Node& producer, const Node& consumer) {
  if (g.shape() != expected.shape || g.dtype() != expected.dtype || g.device() != expected.device) [[unlikely]] {
    fail("[autograd] {} produced a gradient of shape {} ({}, {}) for an input of {} that has shape {} ({}, {})",
         producer.name(), g.shape(), g.dtype(), g.device(), consumer.name(), expected.shape, expected.dtype,
         expected.device);
  }
}

Tensor ones_for(const Tensor& root) { return ones(root.shape(), TensorOptions(root.dtype(), root.device())); }

}  // namespace

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf) : leaf_(std::move(leaf)) {}

TensorList AccumulateGrad::apply(TensorList&& grads) {
  Tensor leaf(leaf_);
  auto& m = ensure_meta(leaf);
  Tensor g = run_tensor_hooks(m.leaf_hooks.get(), std::move(grads[0]), outputs[0]);
  if (!m.grad.defined()) {
    // Steal the incoming gradient when nobody else can see it; otherwise copy, so .grad never
    // aliases a tensor that another node or the user still holds.
    bool unique = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
    m.grad = unique ? g : clone(g);
  } else {
    TANDEM_CHECK(m.grad.shape() == g.shape() && m.grad.dtype() == g.dtype(),
                 "[autograd] cannot accumulate a gradient of shape {} ({}) into .grad of shape {} ({})", g.shape(),
                 g.dtype(), m.grad.shape(), m.grad.dtype());
    add_(m.grad, g);  // in place: a .grad that is a view into a bucket stays one
  }
  if (m.post_accumulate_hooks) {
    auto snapshot = m.post_accumulate_hooks->hooks;
    for (auto& [id, fn] : snapshot) fn(leaf);
  }
  return {};
}

void backward(const TensorList& roots, const TensorList& grads, bool retain_graph) {
  TANDEM_TRACE_SCOPE("backward", "autograd");  // DDP's buckets launch inside it, its wait ends it
  TANDEM_CHECK(!roots.empty(), "[backward] no tensors given");
  TANDEM_CHECK(grads.empty() || grads.size() == roots.size(), "[backward] got {} roots but {} gradients",
               roots.size(), grads.size());
  // Root edges and their gradients.
  std::vector<std::pair<Edge, Tensor>> seeds;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    TANDEM_CHECK(r.defined(), "[backward] root {} is an undefined tensor", i);
    TANDEM_CHECK(requires_grad(r),
                 "[backward] element {} of the roots does not require grad and has no grad_fn", i);
    Tensor g = grads.empty() ? Tensor() : grads[i];
    if (!g.defined()) {
      TANDEM_CHECK(r.numel() == 1,
                   "[backward] grad can be implicitly created only for scalar outputs; the root has shape {}",
                   r.shape());
      g = ones_for(r);
    } else {
      TANDEM_CHECK(g.shape() == r.shape() && g.dtype() == r.dtype() && g.device() == r.device(),
                   "[backward] gradient is {} ({}, {}) but the root is {} ({}, {})", g.shape(), g.dtype(), g.device(),
                   r.shape(), r.dtype(), r.device());
    }
    seeds.emplace_back(gradient_edge(r), std::move(g));
  }

  // Reachable nodes and their slots, kept per backward (not in the nodes), so a backward
  // started from a hook, or on another thread over a shared node, cannot disturb this one.
  std::unordered_map<Node*, uint32_t> slot_of;
  std::vector<Node*> order;
  {
    std::vector<Node*> stack;
    for (auto& [e, g] : seeds) {
      if (slot_of.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
    }
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      order.push_back(n);
      for (const Edge& e : n->next_edges) {
        if (e.fn && slot_of.emplace(e.fn.get(), 0).second) stack.push_back(e.fn.get());
      }
    }
  }
  std::sort(order.begin(), order.end(), [](Node* a, Node* b) { return a->sequence_nr() > b->sequence_nr(); });
  for (size_t i = 0; i < order.size(); ++i) slot_of[order[i]] = static_cast<uint32_t>(i);

  GraphTask task;
  EngineAccess::id(task) = next_task_id.fetch_add(1);
  if (observer_count.load() > 0) {
    EngineAccess::nodes(task) = order;
    std::sort(EngineAccess::nodes(task).begin(), EngineAccess::nodes(task).end());
  }

  std::vector<TensorList> buffers(order.size());
  auto deliver = [&](Node* to, uint32_t slot, Tensor g, const Node* from) {
    TensorList& buf = buffers[slot_of.find(to)->second];
    if (buf.empty()) buf.resize(to->outputs.size());
    if (from) check_gradient(g, to->outputs[slot], *from, *to);
    if (!buf[slot].defined()) {
      buf[slot] = std::move(g);
    } else {
      buf[slot] = add(buf[slot], g);
    }
  };

  BackwardState state;
  state.task_id = task.id();
  BackwardState* outer = current_backward;
  current_backward = &state;
  struct Restore {
    BackwardState* outer;
    ~Restore() { current_backward = outer; }
  } restore{outer};

  GradModeGuard no_grad(false);
  for (auto& [e, g] : seeds) deliver(e.fn.get(), e.input_nr, std::move(g), nullptr);
  if (observer_count.load() > 0) notify_start_observers(task);

  for (Node* node : order) {
    TensorList in = std::move(buffers[slot_of.find(node)->second]);
    if (in.empty()) continue;  // reachable, but no gradient arrived (every path gave none)
    in.resize(node->outputs.size());
    for (size_t k = 0; k < in.size(); ++k) {
      if (!in[k].defined()) {
        const auto& om = node->outputs[k];
        in[k] = zeros(om.shape, TensorOptions(om.dtype, om.device));
      }
      if (k < node->output_hooks.size()) in[k] = run_tensor_hooks(node->output_hooks[k].get(), in[k], node->outputs[k]);
    }
    TensorList out = node->apply(std::move(in));
    if (!retain_graph) node->release_saved();
    TANDEM_CHECK(out.size() == node->next_edges.size() || dynamic_cast<AccumulateGrad*>(node),
                 "[autograd] {} returned {} gradients for {} inputs", node->name(), out.size(),
                 node->next_edges.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const Edge& e = node->next_edges[i];
      if (!e.fn || !out[i].defined()) continue;
      deliver(e.fn.get(), e.input_nr, std::move(out[i]), node);
    }
  }

  // End-of-backward callbacks, in order; a callback may queue more.
  while (!state.callbacks.empty()) {
    auto fn = std::move(state.callbacks.front());
    state.callbacks.pop_front();
    fn();
  }
}

void queue_callback(std::function<void()> fn) {
  TANDEM_CHECK(current_backward != nullptr, "[queue_callback] can only be called while a backward is running");
  current_backward->callbacks.push_back(std::move(fn));
}

bool in_backward() { return current_backward != nullptr; }

uint64_t current_graph_task_id() { return current_backward ? current_backward->task_id : 0; }

uint64_t add_backward_start_observer(std::function<void(const GraphTask&)> fn) {
  auto o = std::make_shared<Observer>();
  o->fn = std::move(fn);
  std::lock_guard<std::mutex> lock(observers_mutex);
  o->id = next_observer_id++;
  start_observers.push_back(o);
  observer_count.store(start_observers.size());
  return o->id;
}

void remove_backward_start_observer(uint64_t id) {
  std::shared_ptr<Observer> removed;
  {
    std::lock_guard<std::mutex> lock(observers_mutex);
    auto it = std::find_if(start_observers.begin(), start_observers.end(), [id](const auto& o) { return o->id == id; });
    if (it == start_observers.end()) return;
    removed = *it;
    start_observers.erase(it);
    observer_count.store(start_observers.size());
  }
  removed->active.store(false);
  // Wait for calls in flight on other threads (the owner's state is about to go away). A call on
  // this thread (an observer removing itself) cannot be waited for and need not be.
  const int self = running_observer == removed.get() ? 1 : 0;
  while (removed->in_flight.load() > self) std::this_thread::yield();
}

}  // namespace tandem::autograd
