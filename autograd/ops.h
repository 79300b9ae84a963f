// The public ops: each validates its inputs, computes its forward (core/), and records a node
// on the tape when an input requires grad. Semantics follow PyTorch's C++ frontend.
#pragma once

#include <optional>
#include <vector>

#include "core/tensor.h"

namespace tandem {

// ---- creation (core/cpu/creation.cpp, core/random.cpp) ----
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, const Scalar& value, TensorOptions opts = {});
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);
Tensor full_like(const Tensor& t, const Scalar& value);
// Without options the dtype follows PyTorch: i64 when start, end and step are all integral,
// else the default float (f32).
Tensor arange(const Scalar& end);
Tensor arange(const Scalar& end, TensorOptions opts);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step = 1);
Tensor arange(const Scalar& start, const Scalar& end, TensorOptions opts);
Tensor arange(const Scalar& start, const Scalar& end, const Scalar& step, TensorOptions opts);
Tensor linspace(double start, double end, int64_t steps, TensorOptions opts = {});
Tensor eye(int64_t n, TensorOptions opts = {});
Tensor scalar_tensor(const Scalar& value, TensorOptions opts = {});
// from_blob wraps caller-owned memory (not copied; `deleter` runs when the tensor dies).
Tensor from_blob(void* data, const Shape& shape, Dtype dtype, std::function<void(void*)> deleter = {});
template <class T> Tensor from_vector(const std::vector<T>& values, const Shape& shape);
template <class T> Tensor from_vector(const std::vector<T>& values) {
  return from_vector(values, Shape{static_cast<int64_t>(values.size())});
}

// Random numbers: Philox-4x32-10, counter based; manual_seed resets the (per-thread) generator.
void manual_seed(uint64_t seed);
Tensor rand(const Shape& shape, TensorOptions opts = {});
Tensor randn(const Shape& shape, TensorOptions opts = {});
Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts = i64);
// Category indices (i64) drawn from the rows of `probs` (1-D [n] -> [num_samples], or 2-D
// [rows, n] -> [rows, num_samples]): finite, non-negative weights (any floating dtype), each row
// with a positive sum, which need not be 1. Without replacement a row must have num_samples
// non-zero categories, and each draw is from the weights not drawn yet. Not differentiable. The
// same seed gives the same samples on CPU and CUDA (the scheme: detail::multinomial_* in
// core/random.h).
Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement = false);

// ---- elementwise (core/cpu/elementwise.cpp, autograd/elementwise_grad.cpp) ----
Tensor add(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor sub(const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);  // true division: integers promote to f32
Tensor add(const Tensor& a, const Scalar& b);
Tensor sub(const Tensor& a, const Scalar& b);
Tensor mul(const Tensor& a, const Scalar& b);
Tensor div(const Tensor& a, const Scalar& b);
Tensor rsub(const Tensor& a, const Scalar& b);  // b - a
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Scalar& exponent);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor neg(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor gelu(const Tensor& a, bool tanh_approximation = false);
Tensor silu(const Tensor& a);
Tensor clamp(const Tensor& a, std::optional<double> lo, std::optional<double> hi);
// Tensor bounds (PyTorch's clamp.Tensor): min(max(a, lo), hi) with a, lo and hi broadcast and
// promoted together; NaN in any of them gives NaN, and lo > hi gives hi. An absent or undefined
// bound is not applied. Differentiable in all three, with PyTorch's rule: a gets the gradient
// where lo <= a <= hi, lo where a < lo < hi, hi where a > hi or hi < lo.
Tensor clamp(const Tensor& a, const std::optional<Tensor>& lo, const std::optional<Tensor>& hi);
inline Tensor clamp_min(const Tensor& a, double lo) { return clamp(a, lo, std::nullopt); }
inline Tensor clamp_max(const Tensor& a, double hi) { return clamp(a, std::nullopt, hi); }
inline Tensor clamp_min(const Tensor& a, const Tensor& lo) { return clamp(a, lo, std::nullopt); }
inline Tensor clamp_max(const Tensor& a, const Tensor& hi) { return clamp(a, std::nullopt, hi); }
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
// A Scalar branch promotes as a Scalar operand of a binary op does (a float with an integer
// tensor gives f32; it never widens a floating tensor). With two Scalars the result has cond's
// shape and is i64 when both are integral, else the default float (f32), as in PyTorch.
Tensor where(const Tensor& cond, const Tensor& a, const Scalar& b);
Tensor where(const Tensor& cond, const Scalar& a, const Tensor& b);
Tensor where(const Tensor& cond, const Scalar& a, const Scalar& b);
// comparisons and logic give bool tensors (not differentiable)
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Scalar& b);
Tensor ne(const Tensor& a, const Scalar& b);
Tensor lt(const Tensor& a, const Scalar& b);
Tensor le(const Tensor& a, const Scalar& b);
Tensor gt(const Tensor& a, const Scalar& b);
Tensor ge(const Tensor& a, const Scalar& b);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);
Tensor logical_xor(const Tensor& a, const Tensor& b);
Tensor logical_not(const Tensor& a);
Tensor isnan(const Tensor& a);
Tensor isinf(const Tensor& a);
Tensor to_dtype(const Tensor& a, Dtype dtype);  // == a.to(dtype); differentiable between floats

// in place: bump the version; error on a leaf that requires grad while grad mode is on
const Tensor& add_(const Tensor& self, const Tensor& other, const Scalar& alpha = 1);
const Tensor& add_(const Tensor& self, const Scalar& other);
const Tensor& sub_(const Tensor& self, const Tensor& other, const Scalar& alpha = 1);
const Tensor& sub_(const Tensor& self, const Scalar& other);
const Tensor& mul_(const Tensor& self, const Tensor& other);
const Tensor& mul_(const Tensor& self, const Scalar& other);
const Tensor& div_(const Tensor& self, const Tensor& other);
const Tensor& div_(const Tensor& self, const Scalar& other);
const Tensor& zero_(const Tensor& self);
const Tensor& fill_(const Tensor& self, const Scalar& value);
const Tensor& copy_(const Tensor& self, const Tensor& src);  // broadcasts and casts src
const Tensor& clamp_(const Tensor& self, std::optional<double> lo, std::optional<double> hi);
const Tensor& uniform_(const Tensor& self, double lo = 0, double hi = 1);
const Tensor& normal_(const Tensor& self, double mean = 0, double std = 1);
// self += alpha * a * b and self += alpha * a / b (optimizers)
const Tensor& addcmul_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
const Tensor& addcdiv_(const Tensor& self, const Tensor& a, const Tensor& b, const Scalar& alpha = 1);
const Tensor& lerp_(const Tensor& self, const Tensor& end, const Scalar& weight);

// ---- views and shape (core/detail/views.cpp, autograd/views_grad.cpp) ----
Tensor view(const Tensor& a, const Shape& shape);  // one -1 allowed; needs compatible strides
Tensor reshape(const Tensor& a, const Shape& shape);  // view when possible, else a copy
Tensor permute(const Tensor& a, const Shape& dims);
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);
Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
Tensor select(const Tensor& a, int64_t dim, int64_t index);
Tensor expand(const Tensor& a, const Shape& shape);  // -1 keeps a dim
Tensor squeeze(const Tensor& a);
Tensor squeeze(const Tensor& a, int64_t dim);
Tensor unsqueeze(const Tensor& a, int64_t dim);
Tensor flatten(const Tensor& a, int64_t start_dim = 0, int64_t end_dim = -1);
Tensor contiguous(const Tensor& a);
Tensor clone(const Tensor& a);

// ---- reductions (core/cpu/reduce.cpp, autograd/reduce_grad.cpp) ----
Tensor sum(const Tensor& a);
Tensor sum(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor mean(const Tensor& a);
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor max(const Tensor& a);
Tensor min(const Tensor& a);
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);  // values, indices
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor amin(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a);  // over the flattened tensor
Tensor argmin(const Tensor& a);
Tensor var(const Tensor& a, const Shape& dims, int64_t correction = 1, bool keepdim = false);
Tensor std(const Tensor& a, const Shape& dims, int64_t correction = 1, bool keepdim = false);
// Over all elements, with Bessel's correction (pass dims {} and a correction for another one).
Tensor var(const Tensor& a);
Tensor std(const Tensor& a);
Tensor logsumexp(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor norm(const Tensor& a);  // 2-norm of all elements

// ---- top-k (core/cpu/topk.cpp, autograd/topk_grad.cpp) ----
// The k largest (largest = false: smallest) elements along dim and their i64 indices, ranked
// first to last when sorted, else in the order of their indices. Ties go to the lower index
// first; NaN ranks above every number (as in PyTorch). Numeric dtypes (not bool); a 0-dim input
// takes k 0 or 1. Differentiable in the values: the gradient goes back to the selected elements.
std::pair<Tensor, Tensor> topk(const Tensor& a, int64_t k, int64_t dim = -1, bool largest = true,
                               bool sorted = true);

// ---- linear algebra (core/cpu/matmul.cpp, autograd/matmul_grad.cpp) ----
Tensor matmul(const Tensor& a, const Tensor& b);  // 1-D, 2-D and batched with broadcasting
Tensor mm(const Tensor& a, const Tensor& b);
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());  // x W^T + b
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);  // bias + a b

// ---- nn functional (core/cpu/nn_ops.cpp, autograd/nn_ops_grad.cpp) ----
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor dropout(const Tensor& x, double p, bool training);

// ---- attention (core/cpu/attention.cpp, autograd/attention_grad.cpp) ----
// PyTorch 2.x's torch.nn.functional.scaled_dot_product_attention, fused: q [..., L, E],
// k [..., S, E], v [..., S, Ev] with the same leading (batch) dims -> [..., L, Ev], of q's dtype
// (f32, f64, bf16, f16; accumulated in f32, f64 for f64). attn_mask broadcasts to [..., L, S]:
// bool (true takes part) or q's dtype (added to the scores, differentiable). is_causal masks key j
// for query i when j > i (top-left aligned) and excludes attn_mask. scale defaults to 1/sqrt(E).
// dropout_p drops attention weights (Philox, redrawn in backward). Tiled with an online softmax:
// neither the forward nor its saved state holds an L x S matrix. A query whose keys are all
// masked gets 0 (PyTorch's math path gives NaN there).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& attn_mask = Tensor(), double dropout_p = 0.0,
                                    bool is_causal = false, std::optional<double> scale = std::nullopt);

// ---- convolution and pooling (core/cpu/conv.cpp, core/cpu/pool.cpp, autograd/conv_grad.cpp) ----
// Inputs are [N, C, H, W], or [C, H, W] for one unbatched sample (the result is then unbatched).
// A Size2 is one value for both spatial dims or {h, w}. Semantics and output sizes are PyTorch's.
// weight [out_channels, in_channels / groups, kh, kw], bias [out_channels] or undefined.
Tensor conv2d(const Tensor& input, const Tensor& weight, const Tensor& bias = Tensor(), Size2 stride = 1,
              Size2 padding = 0, Size2 dilation = 1, int64_t groups = 1);
// stride defaults to kernel_size; padding at most half the kernel. The gradient goes to the first
// maximum of each window (row-major order); a NaN is a maximum.
Tensor max_pool2d(const Tensor& input, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, Size2 dilation = 1, bool ceil_mode = false);
// Also the i64 index (h * W + w within its plane) of each maximum.
std::pair<Tensor, Tensor> max_pool2d_with_indices(const Tensor& input, Size2 kernel_size,
                                                  std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                                                  Size2 dilation = 1, bool ceil_mode = false);
Tensor avg_pool2d(const Tensor& input, Size2 kernel_size, std::optional<Size2> stride = std::nullopt,
                  Size2 padding = 0, bool ceil_mode = false, bool count_include_pad = true,
                  std::optional<int64_t> divisor_override = std::nullopt);
// Output cell (i, j) averages input rows [floor(i H / OH), ceil((i + 1) H / OH)) and likewise columns.
Tensor adaptive_avg_pool2d(const Tensor& input, Size2 output_size);

// ---- indexing and joining (core/cpu/index.cpp, autograd/index_grad.cpp) ----
Tensor embedding(const Tensor& weight, const Tensor& indices);
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value);
Tensor cat(const TensorList& tensors, int64_t dim = 0);
Tensor stack(const TensorList& tensors, int64_t dim = 0);
TensorList split(const Tensor& a, int64_t split_size, int64_t dim = 0);
TensorList split(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim = 0);
TensorList chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);

// ---- triangles (core/cpu/triangle.cpp, autograd/triangle_grad.cpp) ----
// A new tensor: the lower (tril: column - row <= diagonal) or upper (triu: column - row >=
// diagonal) triangle of each matrix in the last two dims, zero elsewhere. At least 2 dims, any
// dtype; the gradient goes through the same mask.
Tensor tril(const Tensor& a, int64_t diagonal = 0);
Tensor triu(const Tensor& a, int64_t diagonal = 0);

// ---- comparison of whole tensors ----
bool equal(const Tensor& a, const Tensor& b);  // same shape and values (dtype promoted)
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

// ---- operators ----
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator+(const Tensor& a, const Scalar& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Scalar& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Scalar& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Scalar& b) { return div(a, b); }
inline Tensor operator+(const Scalar& a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(const Scalar& a, const Tensor& b) { return rsub(b, a); }
inline Tensor operator*(const Scalar& a, const Tensor& b) { return mul(b, a); }
Tensor operator/(const Scalar& a, const Tensor& b);
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline const Tensor& operator+=(const Tensor& a, const Tensor& b) { return add_(a, b); }
inline const Tensor& operator-=(const Tensor& a, const Tensor& b) { return sub_(a, b); }
inline const Tensor& operator*=(const Tensor& a, const Tensor& b) { return mul_(a, b); }
inline const Tensor& operator/=(const Tensor& a, const Tensor& b) { return div_(a, b); }
inline const Tensor& operator+=(const Tensor& a, const Scalar& b) { return add_(a, b); }
inline const Tensor& operator-=(const Tensor& a, const Scalar& b) { return sub_(a, b); }
inline const Tensor& operator*=(const Tensor& a, const Scalar& b) { return mul_(a, b); }
inline const Tensor& operator/=(const Tensor& a, const Scalar& b) { return div_(a, b); }
inline Tensor operator==(const Tensor& a, const Tensor& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Tensor& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Tensor& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Tensor& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Tensor& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Tensor& b) { return ge(a, b); }
inline Tensor operator==(const Tensor& a, const Scalar& b) { return eq(a, b); }
inline Tensor operator!=(const Tensor& a, const Scalar& b) { return ne(a, b); }
inline Tensor operator<(const Tensor& a, const Scalar& b) { return lt(a, b); }
inline Tensor operator<=(const Tensor& a, const Scalar& b) { return le(a, b); }
inline Tensor operator>(const Tensor& a, const Scalar& b) { return gt(a, b); }
inline Tensor operator>=(const Tensor& a, const Scalar& b) { return ge(a, b); }
// Scalar first: the comparison mirrored onto the tensor (0.5 < t is t > 0.5). Declared so that
// C++20 does not try the reversed t == s, whose non-bool result would be ill-formed.
inline Tensor operator==(const Scalar& a, const Tensor& b) { return eq(b, a); }
inline Tensor operator!=(const Scalar& a, const Tensor& b) { return ne(b, a); }
inline Tensor operator<(const Scalar& a, const Tensor& b) { return gt(b, a); }
inline Tensor operator<=(const Scalar& a, const Tensor& b) { return ge(b, a); }
inline Tensor operator>(const Scalar& a, const Tensor& b) { return lt(b, a); }
inline Tensor operator>=(const Scalar& a, const Tensor& b) { return le(b, a); }
inline Tensor operator&&(const Tensor& a, const Tensor& b) { return logical_and(a, b); }
inline Tensor operator||(const Tensor& a, const Tensor& b) { return logical_or(a, b); }
inline Tensor operator!(const Tensor& a) { return logical_not(a); }
// PyTorch's spelling for combining masks, (x > 0) & (x < 1). Bool tensors only: on integers
// these would be bitwise operations, which Tandem does not have.
Tensor operator&(const Tensor& a, const Tensor& b);
Tensor operator|(const Tensor& a, const Tensor& b);
Tensor operator^(const Tensor& a, const Tensor& b);
Tensor operator~(const Tensor& a);

}  // namespace tandem
