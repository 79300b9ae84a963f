#include "core/detail/index.h"

#include <cstring>
#include <numeric>
#include <type_traits>

#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/elementwise.h"
#include "core/detail/iter.h"
#include "core/detail/views.h"
#include "core/detail/wrapping.h"

namespace tandem::detail {

namespace {

void check_defined(const Tensor& t, const char* op, const char* what) {
  TANDEM_CHECK(t.defined(), "[{}] {} is an undefined tensor", op, what);
}

// The kernels for a non-CPU device (throws "built without CUDA" when it has no backend).
IndexDeviceKernels& kernels_for(Device dev, const char* op) { return device_kernels<IndexDeviceKernels>(dev, op); }

// A 1-D view of an index tensor in logical order (a contiguous copy when it has no such view).
Tensor flat_index(const Tensor& index, const char* op) {
  if (index.dim() == 1) return index;
  const Tensor c = cast_copy(index, index.dtype(), op);
  return make_view(c, Shape{c.numel()}, Strides{1}, c.storage_offset());
}

Tensor as_1d(const Tensor& t) { return t.dim() == 0 ? make_view(t, Shape{1}, Strides{1}, t.storage_offset()) : t; }

void check_index_dtype(const Tensor& index, const char* op, const char* what) {
  TANDEM_CHECK(index.dtype() == i64 || index.dtype() == i32, "[{}] {} must be i64 or i32, got {} (shape {})", op,
               what, index.dtype(), index.shape());
}

template <class T>
inline T from_scalar(const Scalar& s) {
  return static_cast<T>(static_cast<acc_t<T>>(s.value));
}

// The element add of the accumulating index ops (scatter_add, index_add, embedding's backward),
// in the compute type; integer elements wrap (core/detail/wrapping.h).
template <class T>
inline T add_element(T a, T b) {
  using C = acc_t<T>;
  return static_cast<T>(wrapping_add<C>(static_cast<C>(a), static_cast<C>(b)));
}

template <class T>
void add_run(const StridedRun<2>& r) {
  char* d = r.ptr[0];
  const char* s = r.ptr[1];
  if (r.stride[0] == static_cast<int64_t>(sizeof(T)) && r.stride[1] == static_cast<int64_t>(sizeof(T))) {
    T* dp = reinterpret_cast<T*>(d);
    const T* sp = reinterpret_cast<const T*>(s);
    for (int64_t i = 0; i < r.n; ++i) dp[i] = add_element(dp[i], sp[i]);
    return;
  }
  for (int64_t i = 0; i < r.n; ++i, d += r.stride[0], s += r.stride[1]) {
    T& dv = *reinterpret_cast<T*>(d);
    dv = add_element(dv, *reinterpret_cast<const T*>(s));
  }
}

// The geometry of `t` with `dim` removed: what one slice along dim looks like.
void slice_geometry(const Tensor& t, int64_t dim, Shape& shape, Strides& strides) {
  shape = Shape();
  strides = Strides();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d == dim) continue;
    shape.push_back(t.size(d));
    strides.push_back(t.stride(d));
  }
}

// out.select(dim, k) = a.select(dim, idx[k]) for every k. Raw strided loops per slice (no
// TensorImpl per row): embedding lookups copy many short rows.
void select_slices(const Tensor& out, const Tensor& a, int64_t dim, const std::vector<int64_t>& idx, const char* op) {
  // Nothing to copy; and an empty tensor's strides, which may be near INT64_MAX, must not be scaled.
  if (out.numel() == 0) return;
  Shape shape;
  Strides os, as;
  slice_geometry(out, dim, shape, os);
  slice_geometry(a, dim, shape, as);
  const int64_t isz = static_cast<int64_t>(a.element_size());
  char* ob = static_cast<char*>(out.data_ptr());
  char* ab = static_cast<char*>(a.data_ptr());
  const int64_t ostep = dim_step_bytes(out, dim), astep = dim_step_bytes(a, dim);
  // Slices on the intra-op threads: slice k of out has one writer.
  int64_t slice_numel = 1;
  for (int64_t d : shape) slice_numel *= d;
  TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
    parallel_for(static_cast<int64_t>(idx.size()), units_per_grain(slice_numel), [&](int64_t begin, int64_t end) {
      for (int64_t k = begin; k < end; ++k) {
        strided_loop<2>(shape, {os, as}, {ob + k * ostep, ab + idx[static_cast<size_t>(k)] * astep}, {isz, isz},
                        [](const StridedRun<2>& r) { copy_strided_run<scalar_t>(r); });
      }
    });
  });
}

// out.select(dim, idx[k]) += src.select(dim, k) for every k, in order (repeated indices add up).
void add_slices(const Tensor& out, int64_t dim, const std::vector<int64_t>& idx, const Tensor& src, const char* op) {
  if (out.numel() == 0 || src.numel() == 0) return;  // as in select_slices
  Shape shape;
  Strides os, ss;
  slice_geometry(out, dim, shape, os);
  slice_geometry(src, dim, shape, ss);
  const int64_t isz = static_cast<int64_t>(out.element_size());
  char* ob = static_cast<char*>(out.data_ptr());
  char* sb = static_cast<char*>(src.data_ptr());
  const int64_t ostep = dim_step_bytes(out, dim), sstep = dim_step_bytes(src, dim);
  TANDEM_DISPATCH_NUMERIC(out.dtype(), op, [&] {
    if (shape.size() == 1) {
      // Rows (embedding's backward): blocks of columns on the intra-op threads, each adding every
      // slice in order, so repeated indices add up in the same order at any thread count.
      const int64_t n = static_cast<int64_t>(idx.size());
      parallel_for(shape[0], std::max<int64_t>(16, units_per_grain(n)), [&](int64_t begin, int64_t end) {
        const Shape part{end - begin};
        for (int64_t k = 0; k < n; ++k) {
          strided_loop<2>(part, {os, ss},
                          {ob + idx[static_cast<size_t>(k)] * ostep + begin * os[0] * isz,
                           sb + k * sstep + begin * ss[0] * isz},
                          {isz, isz}, [](const StridedRun<2>& r) { add_run<scalar_t>(r); });
        }
      });
      return;
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      strided_loop<2>(shape, {os, ss}, {ob + idx[k] * ostep, sb + static_cast<int64_t>(k) * sstep}, {isz, isz},
                      [](const StridedRun<2>& r) { add_run<scalar_t>(r); });
    }
  });
}

// Walks the positions p of `index`, calling body(element of `base` at index[p] along dim,
// element of `other` at p) with bounds-checked index values: the loop gather and scatter_add
// share (gather reads base into other, scatter_add accumulates other into base).
template <class Body>
void walk_indexed(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& other, const Shape& shape_for_error,
                  const char* op, Body&& body) {
  if (index.numel() == 0) return;  // nothing to visit
  if (base.numel() == 0) {
    // index's other dims are bounded by base's, so an empty base with a non-empty index has size 0
    // along dim: every index value is out of range. No view of base is made: an empty tensor's
    // offset and strides address nothing and may be near INT64_MAX (the address rule, core/shape.h),
    // and a view shaped like index would claim elements at them. The error names the first value.
    int64_t first = 0;
    dispatch_index(index.dtype(), op, [&](auto tag) {
      first = static_cast<int64_t>(*static_cast<const decltype(tag)*>(index.data_ptr()));
    });
    throw Error(index_error_message(IndexCheck::for_dim(op, dim, base.size(dim), shape_for_error), first, -1));
  }
  Strides st = base.strides();
  const int64_t jump = dim_step_bytes(base, dim);
  st[dim] = 0;  // the dim walked by the index values, not by the iterator
  const Tensor base_r = make_view(base, index.shape(), st, base.storage_offset());
  // other may be larger than index in any dim: only its leading index-shaped block is visited.
  const Tensor other_r = make_view(other, index.shape(), other.strides(), other.storage_offset());
  const int64_t limit = base.size(dim);
  dispatch_index(index.dtype(), op, [&](auto tag) {
    using index_t = decltype(tag);
    for_each_run<3>(index.shape(), {&base_r, &other_r, &index}, [&](const StridedRun<3>& r) {
      char* b = r.ptr[0];
      char* o = r.ptr[1];
      const char* ix = r.ptr[2];
      for (int64_t i = 0; i < r.n; ++i, o += r.stride[1], ix += r.stride[2]) {
        const int64_t k = *reinterpret_cast<const index_t*>(ix);
        if (k < 0 || k >= limit) [[unlikely]]
          throw Error(index_error_message(IndexCheck::for_dim(op, dim, limit, shape_for_error), k, -1));
        body(b + i * r.stride[0] + k * jump, o);
      }
    });
  });
}

// out (index's shape) = a gathered along dim at index. dim is wrapped; shapes are validated.
void gather_into(const Tensor& out_in, const Tensor& a_in, int64_t dim, const Tensor& index_in, const char* op) {
  const Tensor out = as_1d(out_in), a = as_1d(a_in), index = as_1d(index_in);
  TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
    walk_indexed(a, dim, index, out, a_in.shape(), op, [](char* from, char* to) {
      *reinterpret_cast<scalar_t*>(to) = *reinterpret_cast<const scalar_t*>(from);
    });
  });
}

// out[... index[p] ...] += src[p] over the positions p of index. dim is wrapped; shapes validated.
void scatter_add_into(const Tensor& out_in, int64_t dim, const Tensor& index_in, const Tensor& src_in, const char* op) {
  const Tensor out = as_1d(out_in), index = as_1d(index_in), src = as_1d(src_in);
  TANDEM_DISPATCH_NUMERIC(out.dtype(), op, [&] {
    walk_indexed(out, dim, index, src, out_in.shape(), op, [](char* into, char* from) {
      scalar_t& dv = *reinterpret_cast<scalar_t*>(into);
      dv = add_element(dv, *reinterpret_cast<const scalar_t*>(from));
    });
  });
}

// Validates gather/scatter_add index geometry against a (and src): same ndim, and no larger
// than a outside dim.
void check_index_geometry(const Tensor& a, int64_t dim, const Tensor& index, const char* op) {
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d == dim) continue;
    TANDEM_CHECK(index.size(d) <= a.size(d),
                 "[{}] index {} is larger than the input {} in dim {} (only dim {} may be larger)", op, index.shape(),
                 a.shape(), d, dim);
  }
}

}  // namespace

std::string index_error_message(const IndexCheck& check, int64_t value, int64_t position) {
  switch (check.kind) {
    case IndexCheck::Kind::dim_index:
      return fmt::format("[{}] index {} is out of range for dim {} of size {} (input {})", check.op, value, check.dim,
                         check.size, check.input);
    case IndexCheck::Kind::embedding_row:
      return fmt::format(
          "[{}] index {} (at flat position {}) is out of range for an embedding table of {} rows (weight {})",
          check.op, value, position, check.size, check.input);
    case IndexCheck::Kind::class_target:
      return fmt::format("[{}] target {} is out of bounds for {} classes (expected 0..{} or ignore_index {})",
                         check.op, value, check.size, check.size - 1, check.ignore_index);
    case IndexCheck::Kind::probability_row:
      if (value == IndexCheck::kBadProbability)
        return fmt::format("[{}] row {} of the probabilities (shape {}) has a negative, infinite or NaN entry",
                           check.op, position, check.input);
      if (value == IndexCheck::kZeroSum)
        return fmt::format("[{}] row {} of the probabilities (shape {}) sums to 0; every row needs a positive sum",
                           check.op, position, check.input);
      if (value == IndexCheck::kInfiniteSum)
        return fmt::format("[{}] row {} of the probabilities (shape {}) sums to infinity in f64", check.op, position,
                           check.input);
      return fmt::format(
          "[{}] row {} of the probabilities (shape {}) has {} non-zero categories, fewer than the {} samples to draw "
          "without replacement",
          check.op, position, check.input, value, check.size);
  }
  return fmt::format("[{}] index {} is out of range", check.op, value);
}

void check_index_range(const Tensor& index, const IndexCheck& check) {
  TANDEM_CHECK(index.defined(), "[{}] undefined index tensor", check.op);
  check_index_dtype(index, check.op, "index");
  if (index.numel() == 0) return;
  if (!index.is_cpu()) [[unlikely]] {
    kernels_for(index.device(), check.op).check_range(index, check);
    return;
  }
  const std::vector<int64_t> values = index.to_vector<int64_t>();
  for (size_t k = 0; k < values.size(); ++k)
    if (!check.in_range(values[k])) [[unlikely]]
      throw Error(index_error_message(check, values[k], static_cast<int64_t>(k)));
}

Tensor zeros_of(const Shape& shape, Dtype dtype, Device device, const char* op) {
  Tensor out = make_empty(shape, dtype, device, op);
  if (!device.is_cpu()) [[unlikely]] {
    if (out.numel() > 0) detail::fill(out, 0, op);
    return out;
  }
  // All-zero bytes are zero (or false) in every dtype, the 2-byte floats included.
  if (out.numel() > 0) std::memset(out.data_ptr(), 0, out.nbytes());
  return out;
}

// ---- embedding / index_select ----

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  const char* op = "embedding";
  check_defined(weight, op, "weight");
  check_defined(indices, op, "indices");
  TANDEM_CHECK(weight.dim() == 2, "[embedding] weight must be 2-D [num_embeddings, embedding_dim], got {}",
               weight.shape());
  check_index_dtype(indices, op, "indices");
  const Device dev = check_same_device(op, {{"weight", weight}, {"indices", indices}});
  const int64_t rows = weight.size(0), cols = weight.size(1);
  if (!dev.is_cpu()) [[unlikely]] {
    Shape out_shape = indices.shape();
    out_shape.push_back(cols);
    Tensor out = make_empty(out_shape, weight.dtype(), dev, op);
    const int64_t n = indices.numel();
    const IndexCheck check = IndexCheck::for_embedding(weight.shape());
    kernels_for(dev, op).index_select(make_view(out, Shape{n, cols}, Strides{cols, 1}, 0), weight, 0,
                                      flat_index(indices, op), &check);
    return out;
  }
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  for (size_t k = 0; k < idx.size(); ++k)
    if (idx[k] < 0 || idx[k] >= rows) [[unlikely]]
      throw Error(index_error_message(IndexCheck::for_embedding(weight.shape()), idx[k], static_cast<int64_t>(k)));
  Shape out_shape = indices.shape();
  out_shape.push_back(cols);
  Tensor out = make_empty(out_shape, weight.dtype(), weight.device(), op);
  const int64_t n = static_cast<int64_t>(idx.size());
  select_slices(make_view(out, Shape{n, cols}, Strides{cols, 1}, 0), weight, 0, idx, op);
  return out;
}

Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_rows) {
  const char* op = "embedding_backward";
  const int64_t cols = grad.size(-1);
  if (!grad.is_cpu()) [[unlikely]] {
    check_same_device(op, {{"grad", grad}, {"indices", indices}});
    const int64_t n = indices.numel();
    const Tensor g = cast_copy(grad, grad.dtype(), op);
    Tensor out = zeros_of(Shape{num_rows, cols}, grad.dtype(), grad.device(), op);
    kernels_for(grad.device(), op)
        .index_add(out, 0, flat_index(indices, op), make_view(g, Shape{n, cols}, Strides{cols, 1}, g.storage_offset()));
    return out;
  }
  const std::vector<int64_t> idx = indices.to_vector<int64_t>();
  const int64_t n = static_cast<int64_t>(idx.size());
  const Tensor g = cast_copy(grad, grad.dtype(), op);  // contiguous, so it views as [n, cols]
  Tensor out = zeros_of(Shape{num_rows, cols}, grad.dtype(), grad.device(), op);
  add_slices(out, 0, idx, make_view(g, Shape{n, cols}, Strides{cols, 1}, g.storage_offset()), op);
  return out;
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  const char* op = "index_select";
  check_defined(a, op, "input");
  check_defined(index, op, "index");
  check_index_dtype(index, op, "index");
  TANDEM_CHECK(index.dim() <= 1, "[index_select] index must be 0-D or 1-D, got shape {}", index.shape());
  const Device dev = check_same_device(op, {{"input", a}, {"index", index}});
  dim = wrap_dim(dim, a.dim(), op);
  if (!dev.is_cpu()) [[unlikely]] {
    if (a.dim() == 0)
      TANDEM_CHECK(index.numel() == 1, "[index_select] a 0-dim input takes exactly one index, got {}", index.numel());
    const Tensor src = as_1d(a);
    Shape out_shape = src.shape();
    out_shape[dim] = index.numel();
    Tensor out = make_empty(out_shape, a.dtype(), dev, op);
    const IndexCheck check = IndexCheck::for_dim(op, dim, src.size(dim), a.shape());
    kernels_for(dev, op).index_select(out, src, dim, as_1d(index), &check);
    return a.dim() == 0 ? make_view(out, Shape{}, Strides{}, 0) : out;
  }
  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  if (a.dim() == 0)
    TANDEM_CHECK(idx.size() == 1, "[index_select] a 0-dim input takes exactly one index, got {}", idx.size());
  const Tensor src = as_1d(a);
  const int64_t n = src.size(dim);
  for (size_t k = 0; k < idx.size(); ++k)
    if (idx[k] < 0 || idx[k] >= n) [[unlikely]]
      throw Error(index_error_message(IndexCheck::for_dim(op, dim, n, a.shape()), idx[k], static_cast<int64_t>(k)));
  Shape out_shape = src.shape();
  out_shape[dim] = static_cast<int64_t>(idx.size());
  Tensor out = make_empty(out_shape, a.dtype(), a.device(), op);
  select_slices(out, src, dim, idx, op);
  return a.dim() == 0 ? make_view(out, Shape{}, Strides{}, 0) : out;
}

Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "index_select_backward";
  if (!src.is_cpu()) [[unlikely]] {
    check_same_device(op, {{"grad", src}, {"index", index}});
    Tensor out = zeros_of(shape, src.dtype(), src.device(), op);
    kernels_for(src.device(), op).index_add(as_1d(out), dim, as_1d(index), as_1d(cast_copy(src, src.dtype(), op)));
    return out;
  }
  const std::vector<int64_t> idx = index.to_vector<int64_t>();
  Tensor out = zeros_of(shape, src.dtype(), src.device(), op);
  add_slices(as_1d(out), dim, idx, as_1d(src), op);
  return out;
}

// ---- gather / scatter_add ----

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  const char* op = "gather";
  check_defined(a, op, "input");
  check_defined(index, op, "index");
  check_index_dtype(index, op, "index");
  const Device dev = check_same_device(op, {{"input", a}, {"index", index}});
  TANDEM_CHECK(index.dim() == a.dim(), "[gather] index must have as many dims as the input: index is {}, input is {}",
               index.shape(), a.shape());
  dim = wrap_dim(dim, a.dim(), op);
  check_index_geometry(a, dim, index, op);
  Tensor out = make_empty(index.shape(), a.dtype(), a.device(), op);
  if (!dev.is_cpu()) [[unlikely]] {
    const IndexCheck check = IndexCheck::for_dim(op, dim, as_1d(a).size(dim), a.shape());
    kernels_for(dev, op).gather(as_1d(out), as_1d(a), dim, as_1d(index), &check);
    return out;
  }
  gather_into(out, a, dim, index, op);
  return out;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  const char* op = "scatter_add";
  check_defined(a, op, "input");
  check_defined(index, op, "index");
  check_defined(src, op, "src");
  check_index_dtype(index, op, "index");
  const Device dev = check_same_device(op, {{"input", a}, {"index", index}, {"src", src}});
  TANDEM_CHECK(src.dtype() == a.dtype(), "[scatter_add] src must have the input's dtype: input is {}, src is {}",
               a.dtype(), src.dtype());
  TANDEM_CHECK(index.dim() == a.dim() && src.dim() == a.dim(),
               "[scatter_add] input, index and src must have the same number of dims: input is {}, index is {}, "
               "src is {}",
               a.shape(), index.shape(), src.shape());
  dim = wrap_dim(dim, a.dim(), op);
  for (int64_t d = 0; d < a.dim(); ++d)
    TANDEM_CHECK(index.size(d) <= src.size(d), "[scatter_add] index {} is larger than src {} in dim {}",
                 index.shape(), src.shape(), d);
  check_index_geometry(a, dim, index, op);
  Tensor out = cast_copy(a, a.dtype(), op, /*force=*/true);
  if (!dev.is_cpu()) [[unlikely]] {
    // Only src's leading index-shaped block is read: made contiguous, its element p pairs with index[p].
    const Tensor block = cast_copy(make_view(src, index.shape(), src.strides(), src.storage_offset()), src.dtype(), op);
    const IndexCheck check = IndexCheck::for_dim(op, dim, as_1d(a).size(dim), a.shape());
    kernels_for(dev, op).scatter_add(as_1d(out), dim, as_1d(index), as_1d(block), &check);
    return out;
  }
  scatter_add_into(out, dim, index, src, op);
  return out;
}

Tensor gather_padded(const Tensor& grad, int64_t dim, const Tensor& index, const Shape& src_shape) {
  const char* op = "scatter_add_backward";
  Tensor out = zeros_of(src_shape, grad.dtype(), grad.device(), op);
  if (!grad.is_cpu()) [[unlikely]] {
    check_same_device(op, {{"grad", grad}, {"index", index}});
    kernels_for(grad.device(), op)
        .gather(as_1d(make_view(out, index.shape(), out.strides(), 0)), as_1d(grad), dim, as_1d(index), nullptr);
    return out;
  }
  gather_into(make_view(out, index.shape(), out.strides(), 0), grad, dim, index, op);
  return out;
}

// ---- masked_fill ----

Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value) {
  const char* op = "masked_fill";
  check_defined(a, op, "input");
  check_defined(mask, op, "mask");
  TANDEM_CHECK(mask.dtype() == boolean, "[masked_fill] mask must be bool, got {} (shape {})", mask.dtype(),
               mask.shape());
  const Device dev = check_same_device(op, {{"input", a}, {"mask", mask}});
  bool fits = mask.dim() <= a.dim();
  for (int64_t i = 0; fits && i < mask.dim(); ++i) {
    const int64_t m = mask.size(mask.dim() - 1 - i), s = a.size(a.dim() - 1 - i);
    fits = m == s || m == 1;
  }
  TANDEM_CHECK(fits, "[masked_fill] mask of shape {} cannot be broadcast to the input's shape {}", mask.shape(),
               a.shape());
  check_scalar_fits(value.value, a.dtype(), op);
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  if (!dev.is_cpu()) [[unlikely]] {
    kernels_for(dev, op).masked_fill(out, a, mask, value);
    return out;
  }
  TANDEM_DISPATCH_ALL(a.dtype(), op, [&] {
    const scalar_t v = from_scalar<scalar_t>(value);
    for_each_output_run<3>(a.shape(), {&out, &a, &mask}, [v](const StridedRun<3>& r) {
      char* o = r.ptr[0];
      const char* x = r.ptr[1];
      const char* m = r.ptr[2];
      for (int64_t i = 0; i < r.n; ++i, o += r.stride[0], x += r.stride[1], m += r.stride[2])
        *reinterpret_cast<scalar_t*>(o) = *reinterpret_cast<const bool*>(m) ? v : *reinterpret_cast<const scalar_t*>(x);
    });
  });
  return out;
}

// ---- cat / stack ----

Tensor cat(const TensorList& tensors, int64_t dim, const char* op) {
  TANDEM_CHECK(!tensors.empty(), "[{}] expected a non-empty list of tensors", op);
  for (size_t i = 0; i < tensors.size(); ++i) TANDEM_CHECK(tensors[i].defined(), "[{}] tensor {} is undefined", op, i);
  Dtype dtype = tensors[0].dtype();
  const Device device = check_same_device(op, tensors);
  int64_t ref = -1;  // the first tensor that is not skipped sets the geometry
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    dtype = promote_types(dtype, t.dtype());
    TANDEM_CHECK(t.dim() > 0, "[{}] zero-dimensional tensor (at index {}) cannot be concatenated", op, i);
    if (ref < 0 && !cat_skips(t)) ref = static_cast<int64_t>(i);
  }
  if (ref < 0) {  // only empty 1-D tensors: the result is one too
    wrap_dim(dim, 1, op);
    return zeros_of(Shape{0}, dtype, device, op);
  }
  const Tensor& r = tensors[static_cast<size_t>(ref)];
  const int64_t nd = r.dim();
  dim = wrap_dim(dim, nd, op);
  Shape out_shape = r.shape();
  out_shape[dim] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (cat_skips(t)) continue;
    TANDEM_CHECK(t.dim() == nd, "[{}] tensors must have the same number of dims: tensor {} is {}, tensor {} is {}", op,
                 ref, r.shape(), i, t.shape());
    for (int64_t d = 0; d < nd; ++d) {
      if (d == dim) continue;
      TANDEM_CHECK(t.size(d) == r.size(d), "[{}] sizes must match except in dim {}: tensor {} is {}, tensor {} is {}",
                   op, dim, ref, r.shape(), i, t.shape());
    }
    TANDEM_CHECK(!__builtin_add_overflow(out_shape[dim], t.size(dim), &out_shape[dim]),
                 "[{}] sizes in dim {} sum past int64 (tensor {} is {})", op, dim, i, t.shape());
  }
  // Any device: copy_into casts and copies each piece with the device's copy kernel.
  Tensor out = make_empty(out_shape, dtype, device, op);
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (cat_skips(t)) continue;
    const int64_t len = t.size(dim);
    if (len > 0) copy_into(narrow(out, dim, offset, len), t, op);
    offset += len;
  }
  return out;
}

Tensor stack(const TensorList& tensors, int64_t dim) {
  const char* op = "stack";
  TANDEM_CHECK(!tensors.empty(), "[stack] expected a non-empty list of tensors");
  for (size_t i = 0; i < tensors.size(); ++i) TANDEM_CHECK(tensors[i].defined(), "[stack] tensor {} is undefined", i);
  for (size_t i = 1; i < tensors.size(); ++i)
    TANDEM_CHECK(tensors[i].shape() == tensors[0].shape(),
                 "[stack] all tensors must have the same shape: tensor 0 is {}, tensor {} is {}", tensors[0].shape(), i,
                 tensors[i].shape());
  dim = wrap_dim(dim, tensors[0].dim() + 1, op);
  TensorList expanded;
  expanded.reserve(tensors.size());
  for (const Tensor& t : tensors) expanded.push_back(unsqueeze(t, dim));
  return cat(expanded, dim, op);
}

// ---- split / chunk ----

// ceil(n / d) for n >= 0, d > 0, without the n + d - 1 that overflows for d near INT64_MAX.
static int64_t ceil_div(int64_t n, int64_t d) { return n / d + (n % d != 0); }

std::vector<int64_t> split_sizes(int64_t n, int64_t split_size) {
  TANDEM_CHECK(split_size >= 0, "[split] split_size must be non-negative, got {}", split_size);
  TANDEM_CHECK(split_size > 0 || n == 0, "[split] split_size can only be 0 when the dim has size 0, got size {}", n);
  if (n == 0) return {0};  // one empty piece, as in PyTorch
  const int64_t pieces = ceil_div(n, split_size);
  TANDEM_CHECK(pieces <= kMaxSplitPieces,
               "[split] a dim of size {} in pieces of {} makes {} views, more than the {} one call returns", n,
               split_size, pieces, kMaxSplitPieces);
  std::vector<int64_t> sizes(static_cast<size_t>(pieces), split_size);
  sizes.back() = n - split_size * (pieces - 1);
  return sizes;
}

std::vector<int64_t> chunk_sizes(int64_t n, int64_t chunks) {
  TANDEM_CHECK(chunks > 0, "[chunk] chunks must be positive, got {}", chunks);
  // An empty dim gives `chunks` empty pieces (PyTorch); otherwise pieces of ceil(n / chunks),
  // which may be fewer than `chunks`.
  if (n == 0) {
    TANDEM_CHECK(chunks <= kMaxSplitPieces, "[chunk] {} chunks of an empty dim: more than the {} views one call returns",
                 chunks, kMaxSplitPieces);
    return std::vector<int64_t>(static_cast<size_t>(chunks), 0);
  }
  return split_sizes(n, ceil_div(n, chunks));
}

TensorList split_with_sizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim, const char* op) {
  check_defined(a, op, "input");
  TANDEM_CHECK(a.dim() > 0, "[{}] expects a tensor with at least one dim, got a 0-dim tensor", op);
  dim = wrap_dim(dim, a.dim(), op);
  int64_t total = 0;
  for (int64_t s : sizes) {
    TANDEM_CHECK(s >= 0, "[{}] sizes must be non-negative, got {}", op, fmt::join(sizes, ", "));
    // Compared before adding: sizes near INT64_MAX would overflow the sum.
    TANDEM_CHECK(s <= a.size(dim) - total, "[{}] sizes [{}] sum to more than dim {} of the input {}, size {}", op,
                 fmt::join(sizes, ", "), dim, a.shape(), a.size(dim));
    total += s;
  }
  TANDEM_CHECK(total == a.size(dim), "[{}] sizes [{}] sum to {} but dim {} of the input {} has size {}", op,
               fmt::join(sizes, ", "), total, dim, a.shape(), a.size(dim));
  TensorList out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(a, dim, start, s));
    start += s;
  }
  return out;
}

}  // namespace tandem::detail
