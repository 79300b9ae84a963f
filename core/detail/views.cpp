#include "core/detail/views.h"

#include "core/detail/copy.h"  // contiguous_copy, when reshape cannot view

namespace tandem::detail {

Shape infer_size(const Shape& shape, int64_t numel, const char* op) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      TANDEM_CHECK(infer < 0, "[{}] only one dimension can be inferred (-1), got shape {}", op, shape);
      infer = static_cast<int>(i);
    } else {
      TANDEM_CHECK(shape[i] >= 0, "[{}] invalid dimension {} in shape {}", op, shape[i], shape);
      known = checked_mul(known, shape[i], op);
    }
  }
  if (infer >= 0) {
    // A 0 elsewhere makes the -1 ambiguous (any size fits), as in PyTorch.
    TANDEM_CHECK(known != 0 && numel % known == 0, "[{}] shape {} is invalid for input of size {}", op, shape, numel);
    out[infer] = numel / known;
  } else {
    TANDEM_CHECK(known == numel, "[{}] shape {} is invalid for input of size {}", op, shape, numel);
  }
  return out;
}

std::optional<Strides> view_strides(const Tensor& a, const Shape& new_shape) {
  Shape old_shape = a.shape();
  Strides old_strides = a.strides();
  if (old_shape.empty()) {  // a 0-dim tensor behaves as shape [1]
    old_shape = Shape{1};
    old_strides = Strides{1};
  }
  Strides out(new_shape.size());
  if (a.numel() == 0) {
    if (old_shape == new_shape) return old_strides;
    return contiguous_strides(new_shape);
  }
  // Walk the old dims from the innermost, grouping runs that are contiguous with one another
  // ("chunks"); each chunk must be covered exactly by consecutive new dims, which then get
  // strides derived from the chunk's innermost stride.
  int64_t view_d = static_cast<int64_t>(new_shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(old_shape.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    if (tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_shape[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = old_strides[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

Tensor view(const Tensor& a, const Shape& shape) {
  Shape s = infer_size(shape, a.numel(), "view");
  auto st = view_strides(a, s);
  TANDEM_CHECK(st.has_value(),
               "[view] shape {} is not compatible with the input's shape {} and strides {} (at least one dimension "
               "spans across two contiguous subspaces); use reshape instead",
               s, a.shape(), a.strides());
  return make_view(a, s, *st, a.storage_offset());
}

Tensor reshape(const Tensor& a, const Shape& shape) {
  Shape s = infer_size(shape, a.numel(), "reshape");
  if (auto st = view_strides(a, s)) return make_view(a, s, *st, a.storage_offset());
  Tensor c = contiguous_copy(a, "reshape");
  return make_view(c, s, contiguous_strides(s), 0);
}

Tensor permute(const Tensor& a, const Shape& dims) {
  const int64_t n = a.dim();
  TANDEM_CHECK(static_cast<int64_t>(dims.size()) == n,
               "[permute] got {} dims {} for a tensor with {} dims (shape {})", dims.size(), dims, n, a.shape());
  Shape shape(n);
  Strides strides(n);
  std::vector<bool> seen(n, false);
  for (int64_t i = 0; i < n; ++i) {
    int64_t d = wrap_dim(dims[i], n, "permute");
    TANDEM_CHECK(!seen[d], "[permute] dims {} repeat dim {} (tensor shape {})", dims, d, a.shape());
    seen[d] = true;
    shape[i] = a.shape()[d];
    strides[i] = a.strides()[d];
  }
  return make_view(a, shape, strides, a.storage_offset());
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  if (a.dim() == 0) {
    wrap_dim(d0, 0, "transpose");
    wrap_dim(d1, 0, "transpose");
    return make_view(a, a.shape(), a.strides(), a.storage_offset());
  }
  d0 = wrap_dim(d0, a.dim(), "transpose");
  d1 = wrap_dim(d1, a.dim(), "transpose");
  Shape shape = a.shape();
  Strides strides = a.strides();
  std::swap(shape[d0], shape[d1]);
  std::swap(strides[d0], strides[d1]);
  return make_view(a, shape, strides, a.storage_offset());
}

namespace {
// Products for a view's strides and offset. A tensor with elements keeps them in int64 (its storage
// does); an empty tensor's sizes, and so its strides, can be anything up to INT64_MAX, and a
// stride or offset it never reads through is then 0 rather than an overflow.
int64_t empty_safe_product(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? 0 : r;
}
int64_t empty_safe_offset(const Tensor& a, int64_t index, int64_t stride) {
  int64_t r;
  if (__builtin_mul_overflow(index, stride, &r) || __builtin_add_overflow(a.storage_offset(), r, &r)) return 0;
  return r;
}
}  // namespace

SliceArgs slice_args(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step, const char* op) {
  TANDEM_CHECK(a.dim() > 0, "[{}] cannot slice a 0-dim tensor", op);
  dim = wrap_dim(dim, a.dim(), op);
  TANDEM_CHECK(step > 0, "[{}] step must be positive, got {}", op, step);
  const int64_t size = a.shape()[dim];
  // Python semantics: negative bounds count from the end, then everything clamps into range.
  if (start < 0) start += size;
  if (end < 0) end += size;
  start = std::clamp<int64_t>(start, 0, size);
  end = std::clamp<int64_t>(end, start, size);
  return {dim, start, end, step};
}

namespace {
Tensor slice_view(const Tensor& a, const SliceArgs& s) {
  Shape shape = a.shape();
  Strides strides = a.strides();
  // (end - start - 1) / step + 1 cannot overflow for any step, unlike end - start + step - 1.
  shape[s.dim] = s.end > s.start ? (s.end - s.start - 1) / s.step + 1 : 0;
  // Only a dim of 2 or more elements steps by it, and then step < size keeps the product in range;
  // with one element (any step up to INT64_MAX) the stride is never used, so it is left as is.
  if (shape[s.dim] > 1) strides[s.dim] = empty_safe_product(a.strides()[s.dim], s.step);
  return make_view(a, shape, strides, empty_safe_offset(a, s.start, a.strides()[s.dim]));
}
}  // namespace

Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) {
  return slice_view(a, slice_args(a, dim, start, end, step, "slice"));
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  TANDEM_CHECK(a.dim() > 0, "[narrow] cannot narrow a 0-dim tensor");
  dim = wrap_dim(dim, a.dim(), "narrow");
  const int64_t size = a.shape()[dim];
  TANDEM_CHECK(start >= -size && start <= size, "[narrow] start {} out of range for dim {} of size {} (shape {})",
               start, dim, size, a.shape());
  if (start < 0) start += size;
  TANDEM_CHECK(length >= 0 && length <= size - start,
               "[narrow] start {} + length {} exceeds dim {} of size {} (shape {})", start, length, dim, size,
               a.shape());
  return slice_view(a, SliceArgs{dim, start, start + length, 1});
}

Tensor select(const Tensor& a, int64_t dim, int64_t index) {
  TANDEM_CHECK(a.dim() > 0, "[select] cannot select on a 0-dim tensor");
  dim = wrap_dim(dim, a.dim(), "select");
  const int64_t size = a.shape()[dim];
  TANDEM_CHECK(index >= -size && index < size, "[select] index {} out of range for dim {} of size {} (shape {})",
               index, dim, size, a.shape());
  if (index < 0) index += size;
  Shape shape = a.shape();
  Strides strides = a.strides();
  shape.erase(dim);
  strides.erase(dim);
  return make_view(a, shape, strides, empty_safe_offset(a, index, a.strides()[dim]));
}

Tensor expand(const Tensor& a, const Shape& shape) {
  const size_t n = shape.size();
  const size_t nd = a.shape().size();
  TANDEM_CHECK(n >= nd, "[expand] the target shape {} has fewer dims than the tensor's shape {}", shape, a.shape());
  Shape out(n);
  Strides strides(n);
  const size_t lead = n - nd;
  for (size_t i = 0; i < n; ++i) {
    if (i < lead) {
      TANDEM_CHECK(shape[i] >= 0, "[expand] size {} is not allowed in the new leading dim {} (tensor shape {}, target {})",
                   shape[i], i, a.shape(), shape);
      out[i] = shape[i];
      strides[i] = 0;
      continue;
    }
    const int64_t have = a.shape()[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    TANDEM_CHECK(want >= 0, "[expand] invalid size {} at dim {} (target {})", shape[i], i, shape);
    if (have == want) {
      out[i] = have;
      strides[i] = a.strides()[i - lead];
    } else {
      TANDEM_CHECK(have == 1, "[expand] the expanded size {} must match the existing size {} at dim {} (tensor shape {}, "
                   "target {})", want, have, i, a.shape(), shape);
      out[i] = want;
      strides[i] = 0;
    }
  }
  return make_view(a, out, strides, a.storage_offset());
}

Tensor squeeze(const Tensor& a) {
  Shape shape;
  Strides strides;
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (a.shape()[d] == 1) continue;
    shape.push_back(a.shape()[d]);
    strides.push_back(a.strides()[d]);
  }
  return make_view(a, shape, strides, a.storage_offset());
}

Tensor squeeze(const Tensor& a, int64_t dim) {
  dim = wrap_dim(dim, a.dim(), "squeeze");
  Shape shape = a.shape();
  Strides strides = a.strides();
  if (a.dim() > 0 && shape[dim] == 1) {  // a dim of another size is left alone, as in PyTorch
    shape.erase(dim);
    strides.erase(dim);
  }
  return make_view(a, shape, strides, a.storage_offset());
}

Tensor unsqueeze(const Tensor& a, int64_t dim) {
  dim = wrap_dim(dim, a.dim() + 1, "unsqueeze");
  Shape shape = a.shape();
  Strides strides = a.strides();
  // The new dim's stride only matters for is_contiguous: pick the one a contiguous tensor has.
  int64_t st = dim < a.dim() ? empty_safe_product(shape[dim], strides[dim]) : 1;
  shape.insert(dim, 1);
  strides.insert(dim, st);
  return make_view(a, shape, strides, a.storage_offset());
}

Shape flatten_shape(const Tensor& a, int64_t start_dim, int64_t end_dim) {
  if (a.dim() == 0) {
    wrap_dim(start_dim, 0, "flatten");
    wrap_dim(end_dim, 0, "flatten");
    return Shape{1};
  }
  start_dim = wrap_dim(start_dim, a.dim(), "flatten");
  end_dim = wrap_dim(end_dim, a.dim(), "flatten");
  TANDEM_CHECK(start_dim <= end_dim, "[flatten] start_dim {} must not come after end_dim {} (shape {})", start_dim,
               end_dim, a.shape());
  Shape out;
  for (int64_t d = 0; d < start_dim; ++d) out.push_back(a.shape()[d]);
  int64_t merged = 1;
  for (int64_t d = start_dim; d <= end_dim; ++d) merged = checked_mul(merged, a.shape()[d], "flatten");
  out.push_back(merged);
  for (int64_t d = end_dim + 1; d < a.dim(); ++d) out.push_back(a.shape()[d]);
  return out;
}

}  // namespace tandem::detail
