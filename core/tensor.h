// Tensor: a cheap-to-copy handle to a shared TensorImpl (storage, offset, shape, strides,
// dtype, autograd metadata). Views share storage and its version counter.
//
// The metadata and data accessors are defined in core. The op methods (t.add(u), t.sum(), ...)
// are thin forwards to the differentiable free functions of autograd/ops.h and are defined by
// the autograd layer, so nothing in core depends on the tape.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/shape.h"
#include "core/storage.h"

namespace tandem {

class Tensor;
using TensorList = std::vector<Tensor>;

namespace autograd {
class Node;
struct AutogradMeta;
}  // namespace autograd

// A number standing in for a 0-dim tensor in mixed ops (t + 2, t * 0.5). An integral Scalar
// keeps an integer tensor's dtype; a floating one promotes it to f32, as in PyTorch.
struct Scalar {
  double value = 0;
  bool integral = false;
  Scalar() = default;
  Scalar(double v) : value(v) {}  // NOLINT: implicit, like PyTorch's Scalar
  Scalar(float v) : value(v) {}   // NOLINT
  Scalar(int v) : value(v), integral(true) {}  // NOLINT
  Scalar(int64_t v) : value(static_cast<double>(v)), integral(true) {}  // NOLINT
  Scalar(bool v) : value(v), integral(true) {}  // NOLINT
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  int64_t numel = 0;
  Dtype dtype = f32;
  bool contiguous = true;
  bool is_view = false;
  // Owned by the autograd layer (type-erased deleter, so core needs no definition).
  std::shared_ptr<autograd::AutogradMeta> autograd;

  Device device() const { return storage->device(); }
  void refresh_contiguity();
  // Makes this tensor hold `data`'s elements (storage, offset, shape, strides, dtype) as a tensor
  // of its own, not a view; every handle to this impl follows. The version rule:
  // `bump_version` for a change of the values (Module::to: tensors saved for a backward that has
  // not run yet alias the old data and must notice; the new storage continues past the old count,
  // so the two never compare equal by accident); without it for a switch between copies of the
  // same values (mixed precision's parameter moving between its master and its low-precision
  // shadow), whose saved tensors stay valid.
  void rebind(const TensorImpl& data, bool bump_version);
};

struct TensorOptions {
  Dtype dtype = f32;
  Device device = kCPU;
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(Dtype d) : dtype(d) {}  // NOLINT: zeros({2}, f64)
  TensorOptions(Device dev) : device(dev) {}  // NOLINT
  TensorOptions(Dtype d, Device dev) : dtype(d), device(dev) {}
  TensorOptions with_requires_grad(bool r = true) const {
    auto o = *this;
    o.requires_grad = r;
    return o;
  }
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& o) const { return impl_ == o.impl_; }

  // Metadata. All throw "[tensor] undefined tensor" on an undefined handle.
  const Shape& shape() const { return checked()->shape; }
  const Shape& sizes() const { return shape(); }
  const Strides& strides() const { return checked()->strides; }
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return checked()->numel; }
  Dtype dtype() const { return checked()->dtype; }
  Device device() const { return checked()->device(); }
  bool is_cpu() const { return device().is_cpu(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_contiguous() const { return checked()->contiguous; }
  bool is_floating_point() const { return is_floating(dtype()); }
  int64_t storage_offset() const { return checked()->offset; }
  size_t element_size() const { return itemsize(dtype()); }
  size_t nbytes() const { return numel() * element_size(); }
  uint64_t version() const { return checked()->storage->version(); }
  void bump_version() const { checked()->storage->bump_version(); }
  const std::shared_ptr<Storage>& storage() const { return checked()->storage; }

  void* data_ptr() const;
  template <class T> T* data_ptr() const;  // checks T matches the dtype

  // Values. item() needs exactly one element; to_vector copies in logical order.
  template <class T> T item() const;
  template <class T> std::vector<T> to_vector() const;
  std::string str() const;  // PyTorch-like printing

  // ---- Autograd (defined in autograd/) ----
  bool requires_grad() const;
  const Tensor& requires_grad_(bool on = true) const;
  bool is_leaf() const;
  Tensor grad() const;  // undefined when none
  void set_grad(const Tensor& grad) const;  // checked for shape/dtype/device; undefined clears
  std::shared_ptr<autograd::Node> grad_fn() const;
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;
  void retain_grad() const;
  // (hooks: autograd/hooks.h, register_hook / register_post_accumulate_grad_hook)

  // ---- Views ----
  Tensor view(const Shape& shape) const;
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const Shape& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;
  Tensor operator[](int64_t index) const { return select(0, index); }
  Tensor expand(const Shape& shape) const;
  Tensor expand_as(const Tensor& other) const { return expand(other.shape()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Dtype dtype) const;
  Tensor to(Device device) const;

  // ---- Math (see autograd/ops.h for the full list and semantics) ----
  // The common free functions as methods, spelled as libtorch's Tensor methods are.
  Tensor add(const Tensor& o, const Scalar& alpha = 1) const;
  Tensor add(const Scalar& s) const;
  Tensor sub(const Tensor& o, const Scalar& alpha = 1) const;
  Tensor sub(const Scalar& s) const;
  Tensor mul(const Tensor& o) const;
  Tensor mul(const Scalar& s) const;
  Tensor div(const Tensor& o) const;
  Tensor div(const Scalar& s) const;
  Tensor maximum(const Tensor& o) const;
  Tensor minimum(const Tensor& o) const;
  Tensor neg() const;
  Tensor abs() const;
  Tensor exp() const;
  Tensor log() const;
  Tensor sqrt() const;
  Tensor rsqrt() const;
  Tensor pow(const Scalar& e) const;
  Tensor pow(const Tensor& e) const;
  Tensor tanh() const;
  Tensor sigmoid() const;
  Tensor relu() const;
  Tensor gelu(bool tanh_approximation = false) const;
  Tensor clamp(std::optional<double> lo, std::optional<double> hi) const;
  Tensor clamp(const std::optional<Tensor>& lo, const std::optional<Tensor>& hi) const;
  Tensor clamp_min(double lo) const;
  Tensor clamp_max(double hi) const;
  // x.where(cond, y) is where(cond, x, y), as in libtorch.
  Tensor where(const Tensor& cond, const Tensor& other) const;
  Tensor where(const Tensor& cond, const Scalar& other) const;
  Tensor masked_fill(const Tensor& mask, const Scalar& value) const;
  // Comparisons and logic give bool tensors.
  Tensor eq(const Tensor& o) const;
  Tensor ne(const Tensor& o) const;
  Tensor lt(const Tensor& o) const;
  Tensor le(const Tensor& o) const;
  Tensor gt(const Tensor& o) const;
  Tensor ge(const Tensor& o) const;
  Tensor eq(const Scalar& s) const;
  Tensor ne(const Scalar& s) const;
  Tensor lt(const Scalar& s) const;
  Tensor le(const Scalar& s) const;
  Tensor gt(const Scalar& s) const;
  Tensor ge(const Scalar& s) const;
  Tensor logical_and(const Tensor& o) const;
  Tensor logical_or(const Tensor& o) const;
  Tensor logical_xor(const Tensor& o) const;
  Tensor logical_not() const;
  Tensor isnan() const;
  Tensor isinf() const;
  Tensor matmul(const Tensor& o) const;
  Tensor mm(const Tensor& o) const;
  Tensor bmm(const Tensor& o) const;

  // ---- Reductions (an empty dims list reduces over every dim) ----
  Tensor sum() const;
  Tensor sum(const Shape& dims, bool keepdim = false) const;
  Tensor mean() const;
  Tensor mean(const Shape& dims, bool keepdim = false) const;
  Tensor max() const;
  Tensor min() const;
  std::pair<Tensor, Tensor> max(int64_t dim, bool keepdim = false) const;  // values, indices (i64)
  std::pair<Tensor, Tensor> min(int64_t dim, bool keepdim = false) const;
  // The k largest (or smallest) along dim: values, indices (i64); see autograd/ops.h.
  std::pair<Tensor, Tensor> topk(int64_t k, int64_t dim = -1, bool largest = true, bool sorted = true) const;
  Tensor multinomial(int64_t num_samples, bool replacement = false) const;  // i64 samples of the rows
  Tensor amax(const Shape& dims = {}, bool keepdim = false) const;
  Tensor amin(const Shape& dims = {}, bool keepdim = false) const;
  Tensor argmax() const;  // over the flattened tensor
  Tensor argmax(int64_t dim, bool keepdim = false) const;
  Tensor argmin() const;
  Tensor argmin(int64_t dim, bool keepdim = false) const;
  Tensor var() const;  // every element, Bessel's correction
  Tensor var(const Shape& dims, int64_t correction = 1, bool keepdim = false) const;
  Tensor std() const;
  Tensor std(const Shape& dims, int64_t correction = 1, bool keepdim = false) const;
  Tensor logsumexp(const Shape& dims, bool keepdim = false) const;
  Tensor norm() const;  // 2-norm of all elements
  Tensor softmax(int64_t dim) const;
  Tensor log_softmax(int64_t dim) const;

  // ---- Indexing and splitting ----
  Tensor index_select(int64_t dim, const Tensor& index) const;
  Tensor gather(int64_t dim, const Tensor& index) const;
  Tensor scatter_add(int64_t dim, const Tensor& index, const Tensor& src) const;
  TensorList split(int64_t split_size, int64_t dim = 0) const;
  TensorList split(const std::vector<int64_t>& sizes, int64_t dim = 0) const;
  TensorList chunk(int64_t chunks, int64_t dim = 0) const;
  Tensor tril(int64_t diagonal = 0) const;  // lower triangle of the last two dims
  Tensor triu(int64_t diagonal = 0) const;  // upper triangle

  // ---- In place (bump the version; an error on a leaf that requires grad in grad mode) ----
  const Tensor& add_(const Tensor& o, const Scalar& alpha = 1) const;
  const Tensor& add_(const Scalar& s) const;
  const Tensor& sub_(const Tensor& o, const Scalar& alpha = 1) const;
  const Tensor& sub_(const Scalar& s) const;
  const Tensor& mul_(const Tensor& o) const;
  const Tensor& mul_(const Scalar& s) const;
  const Tensor& div_(const Tensor& o) const;
  const Tensor& div_(const Scalar& s) const;
  const Tensor& clamp_(std::optional<double> lo, std::optional<double> hi) const;
  const Tensor& zero_() const;
  const Tensor& fill_(const Scalar& value) const;
  const Tensor& copy_(const Tensor& src) const;
  const Tensor& uniform_(double lo = 0, double hi = 1) const;
  const Tensor& normal_(double mean = 0, double std = 1) const;
  // self += alpha * a * b, self += alpha * a / b, self += weight * (end - self) (optimizers)
  const Tensor& addcmul_(const Tensor& a, const Tensor& b, const Scalar& alpha = 1) const;
  const Tensor& addcdiv_(const Tensor& a, const Tensor& b, const Scalar& alpha = 1) const;
  const Tensor& lerp_(const Tensor& end, const Scalar& weight) const;

  bool equal(const Tensor& o) const;
  bool allclose(const Tensor& o, double rtol = 1e-5, double atol = 1e-8) const;

 private:
  TensorImpl* checked() const {
    if (!impl_) [[unlikely]] fail("[tensor] operation on an undefined tensor");
    return impl_.get();
  }
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// A new TensorImpl over fresh contiguous storage (uninitialised). The building block of ops.
// Bytes between consecutive elements of `t` along `dim` (the address rule, core/shape.h): 0 when
// `t` has no elements or the dim has at most one, whose strides may then be anything.
int64_t dim_step_bytes(const Tensor& t, int64_t dim);

Tensor make_empty(const Shape& shape, Dtype dtype, Device device, const char* op = "empty");
// A new TensorImpl that views `base`'s storage with the given geometry (no autograd history).
Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset);

template <class T> T* Tensor::data_ptr() const {
  TANDEM_CHECK(dtype() == dtype_v<T>, "[data_ptr] tensor has dtype {}, requested {}", dtype(), dtype_v<T>);
  return static_cast<T*>(data_ptr());
}

}  // namespace tandem
