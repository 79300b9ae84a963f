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

Tensor Tensor::add(const Tensor& o, const Scalar& alpha) const { return tandem::add(*this, o, alpha); }
Tensor Tensor::add(const Scalar& s) const { return tandem::add(*this, s); }
Tensor Tensor::sub(const Tensor& o, const Scalar& alpha) const { return tandem::sub(*this, o, alpha); }
Tensor Tensor::sub(const Scalar& s) const { return tandem::sub(*this, s); }
Tensor Tensor::mul(const Tensor& o) const { return tandem::mul(*this, o); }
Tensor Tensor::mul(const Scalar& s) const { return tandem::mul(*this, s); }
Tensor Tensor::div(const Tensor& o) const { return tandem::div(*this, o); }
Tensor Tensor::div(const Scalar& s) const { return tandem::div(*this, s); }
Tensor Tensor::maximum(const Tensor& o) const { return tandem::maximum(*this, o); }
Tensor Tensor::minimum(const Tensor& o) const { return tandem::minimum(*this, o); }
Tensor Tensor::neg() const { return tandem::neg(*this); }
Tensor Tensor::abs() const { return tandem::abs(*this); }
Tensor Tensor::exp() const { return tandem::exp(*this); }
Tensor Tensor::log() const { return tandem::log(*this); }
Tensor Tensor::sqrt() const { return tandem::sqrt(*this); }
Tensor Tensor::rsqrt() const { return tandem::rsqrt(*this); }
Tensor Tensor::pow(const Scalar& e) const { return tandem::pow(*this, e); }
Tensor Tensor::pow(const Tensor& e) const { return tandem::pow(*this, e); }
Tensor Tensor::tanh() const { return tandem::tanh(*this); }
Tensor Tensor::sigmoid() const { return tandem::sigmoid(*this); }
Tensor Tensor::relu() const { return tandem::relu(*this); }
Tensor Tensor::gelu(bool tanh_approximation) const { return tandem::gelu(*this, tanh_approximation); }
Tensor Tensor::clamp(std::optional<double> lo, std::optional<double> hi) const { return tandem::clamp(*this, lo, hi); }
Tensor Tensor::clamp(const std::optional<Tensor>& lo, const std::optional<Tensor>& hi) const {
  return tandem::clamp(*this, lo, hi);
}
Tensor Tensor::clamp_min(double lo) const { return tandem::clamp_min(*this, lo); }
Tensor Tensor::clamp_max(double hi) const { return tandem::clamp_max(*this, hi); }
Tensor Tensor::where(const Tensor& cond, const Tensor& other) const { return tandem::where(cond, *this, other); }
Tensor Tensor::where(const Tensor& cond, const Scalar& other) const { return tandem::where(cond, *this, other); }
Tensor Tensor::masked_fill(const Tensor& mask, const Scalar& v) const { return tandem::masked_fill(*this, mask, v); }
Tensor Tensor::eq(const Tensor& o) const { return tandem::eq(*this, o); }
Tensor Tensor::ne(const Tensor& o) const { return tandem::ne(*this, o); }
Tensor Tensor::lt(const Tensor& o) const { return tandem::lt(*this, o); }
Tensor Tensor::le(const Tensor& o) const { return tandem::le(*this, o); }
Tensor Tensor::gt(const Tensor& o) const { return tandem::gt(*this, o); }
Tensor Tensor::ge(const Tensor& o) const { return tandem::ge(*this, o); }
Tensor Tensor::eq(const Scalar& s) const { return tandem::eq(*this, s); }
Tensor Tensor::ne(const Scalar& s) const { return tandem::ne(*this, s); }
Tensor Tensor::lt(const Scalar& s) const { return tandem::lt(*this, s); }
Tensor Tensor::le(const Scalar& s) const { return tandem::le(*this, s); }
Tensor Tensor::gt(const Scalar& s) const { return tandem::gt(*this, s); }
Tensor Tensor::ge(const Scalar& s) const { return tandem::ge(*this, s); }
Tensor Tensor::logical_and(const Tensor& o) const { return tandem::logical_and(*this, o); }
Tensor Tensor::logical_or(const Tensor& o) const { return tandem::logical_or(*this, o); }
Tensor Tensor::logical_xor(const Tensor& o) const { return tandem::logical_xor(*this, o); }
Tensor Tensor::logical_not() const { return tandem::logical_not(*this); }
Tensor Tensor::isnan() const { return tandem::isnan(*this); }
Tensor Tensor::isinf() const { return tandem::isinf(*this); }
Tensor Tensor::matmul(const Tensor& o) const { return tandem::matmul(*this, o); }
Tensor Tensor::mm(const Tensor& o) const { return tandem::mm(*this, o); }
Tensor Tensor::bmm(const Tensor& o) const { return tandem::bmm(*this, o); }

Tensor Tensor::sum() const { return tandem::sum(*this); }
Tensor Tensor::sum(const Shape& d, bool k) const { return tandem::sum(*this, d, k); }
Tensor Tensor::mean() const { return tandem::mean(*this); }
Tensor Tensor::mean(const Shape& d, bool k) const { return tandem::mean(*this, d, k); }
Tensor Tensor::max() const { return tandem::max(*this); }
Tensor Tensor::min() const { return tandem::min(*this); }
std::pair<Tensor, Tensor> Tensor::max(int64_t d, bool k) const { return tandem::max(*this, d, k); }
std::pair<Tensor, Tensor> Tensor::min(int64_t d, bool k) const { return tandem::min(*this, d, k); }
std::pair<Tensor, Tensor> Tensor::topk(int64_t k, int64_t d, bool largest, bool sorted) const {
  return tandem::topk(*this, k, d, largest, sorted);
}
Tensor Tensor::multinomial(int64_t n, bool replacement) const { return tandem::multinomial(*this, n, replacement); }
Tensor Tensor::amax(const Shape& d, bool k) const { return tandem::amax(*this, d, k); }
Tensor Tensor::amin(const Shape& d, bool k) const { return tandem::amin(*this, d, k); }
Tensor Tensor::argmax() const { return tandem::argmax(*this); }
Tensor Tensor::argmax(int64_t d, bool k) const { return tandem::argmax(*this, d, k); }
Tensor Tensor::argmin() const { return tandem::argmin(*this); }
Tensor Tensor::argmin(int64_t d, bool k) const { return tandem::argmin(*this, d, k); }
Tensor Tensor::var() const { return tandem::var(*this); }
Tensor Tensor::var(const Shape& d, int64_t c, bool k) const { return tandem::var(*this, d, c, k); }
Tensor Tensor::std() const { return tandem::std(*this); }
Tensor Tensor::std(const Shape& d, int64_t c, bool k) const { return tandem::std(*this, d, c, k); }
Tensor Tensor::logsumexp(const Shape& d, bool k) const { return tandem::logsumexp(*this, d, k); }
Tensor Tensor::norm() const { return tandem::norm(*this); }
Tensor Tensor::softmax(int64_t d) const { return tandem::softmax(*this, d); }
Tensor Tensor::log_softmax(int64_t d) const { return tandem::log_softmax(*this, d); }

Tensor Tensor::index_select(int64_t d, const Tensor& i) const { return tandem::index_select(*this, d, i); }
Tensor Tensor::gather(int64_t d, const Tensor& i) const { return tandem::gather(*this, d, i); }
Tensor Tensor::scatter_add(int64_t d, const Tensor& i, const Tensor& s) const {
  return tandem::scatter_add(*this, d, i, s);
}
TensorList Tensor::split(int64_t size, int64_t d) const { return tandem::split(*this, size, d); }
TensorList Tensor::split(const std::vector<int64_t>& sizes, int64_t d) const { return tandem::split(*this, sizes, d); }
TensorList Tensor::chunk(int64_t chunks, int64_t d) const { return tandem::chunk(*this, chunks, d); }
Tensor Tensor::tril(int64_t diagonal) const { return tandem::tril(*this, diagonal); }
Tensor Tensor::triu(int64_t diagonal) const { return tandem::triu(*this, diagonal); }

const Tensor& Tensor::add_(const Tensor& o, const Scalar& alpha) const { return tandem::add_(*this, o, alpha); }
const Tensor& Tensor::add_(const Scalar& s) const { return tandem::add_(*this, s); }
const Tensor& Tensor::sub_(const Tensor& o, const Scalar& alpha) const { return tandem::sub_(*this, o, alpha); }
const Tensor& Tensor::sub_(const Scalar& s) const { return tandem::sub_(*this, s); }
const Tensor& Tensor::mul_(const Tensor& o) const { return tandem::mul_(*this, o); }
const Tensor& Tensor::mul_(const Scalar& s) const { return tandem::mul_(*this, s); }
const Tensor& Tensor::div_(const Tensor& o) const { return tandem::div_(*this, o); }
const Tensor& Tensor::div_(const Scalar& s) const { return tandem::div_(*this, s); }
const Tensor& Tensor::clamp_(std::optional<double> lo, std::optional<double> hi) const {
  return tandem::clamp_(*this, lo, hi);
}
const Tensor& Tensor::zero_() const { return tandem::zero_(*this); }
const Tensor& Tensor::fill_(const Scalar& v) const { return tandem::fill_(*this, v); }
const Tensor& Tensor::copy_(const Tensor& s) const { return tandem::copy_(*this, s); }
const Tensor& Tensor::uniform_(double lo, double hi) const { return tandem::uniform_(*this, lo, hi); }
const Tensor& Tensor::normal_(double m, double s) const { return tandem::normal_(*this, m, s); }
const Tensor& Tensor::addcmul_(const Tensor& a, const Tensor& b, const Scalar& alpha) const {
  return tandem::addcmul_(*this, a, b, alpha);
}
const Tensor& Tensor::addcdiv_(const Tensor& a, const Tensor& b, const Scalar& alpha) const {
  return tandem::addcdiv_(*this, a, b, alpha);
}
const Tensor& Tensor::lerp_(const Tensor& end, const Scalar& w) const { return tandem::lerp_(*this, end, w); }

}  // namespace tandem
