// Tensor's autograd members and op methods: thin forwards to autograd/ops.h, defined here so
// core never depends on the tape.
#include "autograd/engine.h"
#include "autograd/hooks.h"
#include "autograd/ops.h"
#include "core/print.h"

namespace tandem {

using namespace autograd;

namespace {
// Printing shows autograd state as PyTorch does: grad_fn=<Name> or requires_grad=True.
std::vector<std::string> autograd_suffixes(const Tensor& t) {
  auto* m = meta(t);
  if (!m) return {};
  if (m->grad_fn) return {fmt::format("grad_fn=<{}>", m->grad_fn->name())};
  if (m->requires_grad) return {"requires_grad=True"};
  return {};
}
const bool suffixes_registered = (set_str_suffix_provider(&autograd_suffixes), true);
}  // namespace

bool Tensor::requires_grad() const { return autograd::requires_grad(*this); }

const Tensor& Tensor::requires_grad_(bool on) const {
  auto* m = meta(*this);
  if (m && m->grad_fn) {
    TANDEM_CHECK(on, "[requires_grad_] cannot turn off requires_grad of a non-leaf tensor (produced by {}); "
                           "use detach()", m->grad_fn->name());
    return *this;
  }
  if (on) {
    TANDEM_CHECK(is_floating(dtype()), "[requires_grad_] only floating tensors can require grad, got {}", dtype());
    ensure_meta(*this).requires_grad = true;
  } else if (m) {
    m->requires_grad = false;
  }
  return *this;
}

bool Tensor::is_leaf() const {
  auto* m = meta(*this);
  return !m || !m->grad_fn;
}

Tensor Tensor::grad() const {
  auto* m = meta(*this);
  return m ? m->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined()) {
    TANDEM_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(),
                 "[set_grad] gradient of shape {} ({}, {}) does not match the tensor's shape {} ({}, {})", g.shape(),
                 g.dtype(), g.device(), shape(), dtype(), device());
    ensure_meta(*this).grad = g;
  } else if (auto* m = meta(*this)) {
    m->grad = Tensor();
  }
}

std::shared_ptr<Node> Tensor::grad_fn() const {
  auto* m = meta(*this);
  return m ? m->grad_fn : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, gradient.defined() ? TensorList{gradient} : TensorList{}, retain_graph);
}

Tensor Tensor::detach() const { return make_view(*this, shape(), strides(), storage_offset()); }

void Tensor::retain_grad() const {
  auto* m = meta(*this);
  TANDEM_CHECK(m && (m->grad_fn || m->requires_grad), "[retain_grad] the tensor (shape {}) does not require grad",
               shape());
  if (!m->grad_fn || m->retains_grad) return;
  m->retains_grad = true;
  // The hook holds the metadata weakly: a retained tensor must not keep itself alive.
  std::weak_ptr<AutogradMeta> weak = impl()->autograd;
  HookHandle handle = register_hook(*this, [weak](const Tensor& g) {
    if (auto mm = weak.lock()) {
      NoGradGuard ng;
      mm->grad = mm->grad.defined() ? tandem::add(mm->grad, g) : tandem::clone(g);
    }
    return Tensor();
  });
  handle.release();  // lives as long as the node's hook list
}

Tensor Tensor::view(const Shape& s) const { return tandem::view(*this, s); }
Tensor Tensor::reshape(const Shape& s) const { return tandem::reshape(*this, s); }
Tensor Tensor::permute(const Shape& d) const { return tandem::permute(*this, d); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return tandem::transpose(*this, a, b); }
Tensor Tensor::t() const {
  TANDEM_CHECK(dim() <= 2, "[t] expects a tensor with <= 2 dims, got shape {}", shape());
  return dim() < 2 ? *this : tandem::transpose(*this, 0, 1);
}
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t l) const { return tandem::narrow(*this, d, s, l); }
Tensor Tensor::slice(int64_t d, int64_t s, int64_t e, int64_t st) const { return tandem::slice(*this, d, s, e, st); }
Tensor Tensor::select(int64_t d, int64_t i) const { return tandem::select(*this, d, i); }
Tensor Tensor::expand(const Shape& s) const { return tandem::expand(*this, s); }
Tensor Tensor::squeeze() const { return tandem::squeeze(*this); }
Tensor Tensor::squeeze(int64_t d) const { return tandem::squeeze(*this, d); }
Tensor Tensor::unsqueeze(int64_t d) const { return tandem::unsqueeze(*this, d); }
Tensor Tensor::flatten(int64_t s, int64_t e) const { return tandem::flatten(*this, s, e); }
Tensor Tensor::contiguous() const { return tandem::contiguous(*this); }
Tensor Tensor::clone() const { return tandem::clone(*this); }
Tensor Tensor::to(Dtype d) const { return tandem::to_dtype(*this, d); }

Tensor Tensor::add(const Tensor& o) const { return tandem::add(*this, o); }
Tensor Tensor::sub(const Tensor& o) const { return tandem::sub(*this, o); }
Tensor Tensor::mul(const Tensor& o) const { return tandem::mul(*this, o); }
Tensor Tensor::div(const Tensor& o) const { return tandem::div(*this, o); }
Tensor Tensor::neg() const { return tandem::neg(*this); }
Tensor Tensor::abs() const { return tandem::abs(*this); }
Tensor Tensor::exp() const { return tandem::exp(*this); }
Tensor Tensor::log() const { return tandem::log(*this); }
Tensor Tensor::sqrt() const { return tandem::sqrt(*this); }
Tensor Tensor::rsqrt() const { return tandem::rsqrt(*this); }
Tensor Tensor::pow(const Scalar& e) const { return tandem::pow(*this, e); }
Tensor Tensor::tanh() const { return tandem::tanh(*this); }
Tensor Tensor::sigmoid() const { return tandem::sigmoid(*this); }
Tensor Tensor::relu() const { return tandem::relu(*this); }
Tensor Tensor::clamp(std::optional<double> lo, std::optional<double> hi) const { return tandem::clamp(*this, lo, hi); }
Tensor Tensor::matmul(const Tensor& o) const { return tandem::matmul(*this, o); }
Tensor Tensor::sum() const { return tandem::sum(*this); }
Tensor Tensor::sum(const Shape& d, bool k) const { return tandem::sum(*this, d, k); }
Tensor Tensor::mean() const { return tandem::mean(*this); }
Tensor Tensor::mean(const Shape& d, bool k) const { return tandem::mean(*this, d, k); }
Tensor Tensor::max() const { return tandem::max(*this); }
Tensor Tensor::min() const { return tandem::min(*this); }
Tensor Tensor::argmax(int64_t d, bool k) const { return tandem::argmax(*this, d, k); }
Tensor Tensor::softmax(int64_t d) const { return tandem::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return tandem::log_softmax(*this, d); }

const Tensor& Tensor::add_(const Tensor& o, const Scalar& alpha) const { return tandem::add_(*this, o, alpha); }
const Tensor& Tensor::add_(const Scalar& s) const { return tandem::add_(*this, s); }
const Tensor& Tensor::sub_(const Tensor& o) const { return tandem::sub_(*this, o); }
const Tensor& Tensor::mul_(const Tensor& o) const { return tandem::mul_(*this, o); }
const Tensor& Tensor::mul_(const Scalar& s) const { return tandem::mul_(*this, s); }
const Tensor& Tensor::div_(const Scalar& s) const { return tandem::div_(*this, s); }
const Tensor& Tensor::zero_() const { return tandem::zero_(*this); }
const Tensor& Tensor::fill_(const Scalar& v) const { return tandem::fill_(*this, v); }
const Tensor& Tensor::copy_(const Tensor& s) const { return tandem::copy_(*this, s); }
const Tensor& Tensor::uniform_(double lo, double hi) const { return tandem::uniform_(*this, lo, hi); }
const Tensor& Tensor::normal_(double m, double s) const { return tandem::normal_(*this, m, s); }

}  // namespace tandem
