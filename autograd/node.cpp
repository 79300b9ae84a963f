#include "autograd/node.h"

#include <atomic>

#include "autograd/ops.h"

namespace tandem::autograd {

namespace {
// Tape order, process-wide (a graph may be built on one thread and backwarded on another): a
// node's number is larger than those of the nodes it points to.
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace


std::atomic<int64_t> live_nodes{0};

Node::Node() : sequence_nr_(next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {
  live_nodes.fetch_add(1, std::memory_order_relaxed);
}

// Frees the chain behind this node iteratively: a long graph (a loss summed over many steps
// without detach) would otherwise recurse once per node in the destructors and overflow the stack.
Node::~Node() {
  live_nodes.fetch_sub(1, std::memory_order_relaxed);
  std::vector<std::shared_ptr<Node>> pending;
  for (auto& e : next_edges)
    if (e.fn) pending.push_back(std::move(e.fn));
  while (!pending.empty()) {
    std::shared_ptr<Node> n = std::move(pending.back());
    pending.pop_back();
    if (n.use_count() == 1) {  // we hold the last reference: take its edges before it dies
      for (auto& e : n->next_edges)
        if (e.fn) pending.push_back(std::move(e.fn));
    }
  }
}
int64_t live_node_count() { return live_nodes.load(std::memory_order_relaxed); }

SavedTensor::SavedTensor(const Tensor& t, bool is_output) {
  if (!t.defined()) return;
  version_ = t.version();
  if (is_output && t.impl()->autograd) {
    tensor_ = make_view(t, t.shape(), t.strides(), t.storage_offset());
  } else {
    tensor_ = t;
  }
}

Tensor SavedTensor::unpack(const Node& owner) const {
  if (released_) {
    fail("[autograd] trying to backward through {} a second time: its saved tensors were freed by the "
         "first backward; pass retain_graph=true to the first backward if you need to backward twice",
         owner.name());
  }
  if (tensor_.defined() && tensor_.version() != version_) {
    fail("[autograd] a tensor saved by {} for backward was modified by an in-place operation "
         "(now at version {}, saved at version {}); use the out-of-place op or clone it first",
         owner.name(), tensor_.version(), version_);
  }
  return tensor_;
}

AutogradMeta* meta(const Tensor& t) { return t.defined() ? t.impl()->autograd.get() : nullptr; }

AutogradMeta& ensure_meta(const Tensor& t) {
  auto& m = t.impl()->autograd;
  if (!m) m = std::make_shared<AutogradMeta>();
  return *m;
}

bool requires_grad(const Tensor& t) {
  auto* m = meta(t);
  return m && (m->requires_grad || m->grad_fn);
}

Edge gradient_edge(const Tensor& t) {
  auto* m = meta(t);
  if (!m) return {};
  if (m->grad_fn) return {m->grad_fn, m->output_nr};
  if (!m->requires_grad) return {};
  auto acc = m->grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t.impl_ptr());
    acc->outputs.push_back({t.shape(), t.dtype(), t.device()});
    m->grad_accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t && requires_grad(*t)) return true;
  return false;
}

bool any_requires_grad(const TensorList& inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& t : inputs)
    if (requires_grad(t)) return true;
  return false;
}

std::vector<Edge> collect_edges(const TensorList& inputs) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  return edges;
}

void set_history(const std::shared_ptr<Node>& node, Tensor* const* outputs, size_t n) {
  node->outputs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Tensor& out = *outputs[i];
    TANDEM_CHECK(out.defined(), "[{}] output {} is an undefined tensor", node->name(), i);
    auto& m = ensure_meta(out);
    m.grad_fn = node;
    m.output_nr = static_cast<uint32_t>(i);
    node->outputs.push_back({out.shape(), out.dtype(), out.device()});
  }
}

void set_history(const std::shared_ptr<Node>& node, std::initializer_list<Tensor*> outputs) {
  set_history(node, outputs.begin(), outputs.size());
}

void set_history(const std::shared_ptr<Node>& node, TensorList& outputs) {
  std::vector<Tensor*> ptrs;
  ptrs.reserve(outputs.size());
  for (auto& t : outputs) ptrs.push_back(&t);
  set_history(node, ptrs.data(), ptrs.size());
}

namespace {
template <class Inputs, class Outputs>
void record_impl(const char* name, const Inputs& inputs, size_t n_in, const Outputs& set_outputs,
                 BackwardFn backward, TensorList&& saved_inputs, TensorList&& saved_outputs) {
  // Edges first: gradient_edge may create a leaf's AccumulateGrad, which must get a smaller
  // sequence number than this node so that it runs after it.
  std::vector<Edge> edges;
  edges.reserve(n_in);
  for (const auto& in : inputs) edges.push_back(gradient_edge(in));
  auto node = std::make_shared<FunctionNode>(name, std::move(backward));
  node->next_edges = std::move(edges);
  node->saved.reserve(saved_inputs.size() + saved_outputs.size());
  for (auto& t : saved_inputs) node->saved.emplace_back(t, false);
  set_outputs(node);
  for (auto& t : saved_outputs) node->saved.emplace_back(t, true);
}
struct DerefRange {
  std::initializer_list<const Tensor*> list;
  struct It {
    const Tensor* const* p;
    const Tensor& operator*() const { return **p; }
    It& operator++() {
      ++p;
      return *this;
    }
    bool operator!=(const It& o) const { return p != o.p; }
  };
  It begin() const { return {list.begin()}; }
  It end() const { return {list.end()}; }
};
}  // namespace

void record(const char* name, std::initializer_list<const Tensor*> inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward, TensorList saved_inputs, TensorList saved_outputs) {
  if (!any_requires_grad(inputs)) return;
  record_impl(name, DerefRange{inputs}, inputs.size(),
              [&](const std::shared_ptr<Node>& n) { set_history(n, outputs); }, std::move(backward),
              std::move(saved_inputs), std::move(saved_outputs));
}

void record(const char* name, const TensorList& inputs, TensorList& outputs, BackwardFn backward,
            TensorList saved_inputs, TensorList saved_outputs) {
  if (!any_requires_grad(inputs)) return;
  record_impl(name, inputs, inputs.size(), [&](const std::shared_ptr<Node>& n) { set_history(n, outputs); },
              std::move(backward), std::move(saved_inputs), std::move(saved_outputs));
}

TensorList FunctionNode::apply(TensorList&& grads) {
  BackwardContext ctx{grads, {}, *this, saved};
  ctx.needs_input_grad.reserve(next_edges.size());
  for (const Edge& e : next_edges) ctx.needs_input_grad.push_back(e.valid());
  return fn_(ctx);
}

void FunctionNode::release_saved() {
  for (auto& s : saved) s.release();
}

void check_inplace(const Tensor& self, const char* op) {
  if (!grad_mode_enabled() || !requires_grad(self)) return;
  auto* m = meta(self);
  if (!m->grad_fn) {
    fail("[{}] a leaf tensor that requires grad (shape {}) cannot be modified in place while grad mode is "
         "on; wrap the update in a NoGradGuard",
         op, self.shape());
  }
  fail("[{}] in-place modification of a tensor that requires grad (shape {}, produced by {}) is not "
       "supported; use the out-of-place op",
       op, self.shape(), m->grad_fn->name());
}

Tensor sum_to(const Tensor& grad, const Shape& shape) {
  const Shape& g = grad.shape();
  if (g == shape) return grad;
  size_t lead = g.size() - shape.size();
  Shape dims;
  for (size_t i = 0; i < g.size(); ++i) {
    if (i < lead || (shape[i - lead] == 1 && g[i] != 1)) dims.push_back(static_cast<int64_t>(i));
  }
  Tensor r = dims.empty() ? grad : sum(grad, dims, /*keepdim=*/true);
  return r.shape() == shape ? r : reshape(r, shape);
}

}  // namespace tandem::autograd
