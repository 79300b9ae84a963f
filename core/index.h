// Indexing and joining: the forward computations (and the raw kernels their backward rules
// reuse) behind embedding, index_select, gather, scatter_add, masked_fill, cat, stack, split
// and chunk. Everything here validates its arguments and throws "[op] ..." errors; nothing here
// records on the tape (autograd/index_grad.cpp does that).
#pragma once

#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace tandem::detail {

// A zero-filled contiguous tensor.
Tensor zeros_of(const Shape& shape, Dtype dtype, Device device, const char* op);
// Copies src into dst elementwise (same shape), casting between any two dtypes.
void copy_into(const Tensor& dst, const Tensor& src, const char* op);
// A contiguous copy of src in `dtype` (src itself when it already is one and `force` is false).
Tensor cast_copy(const Tensor& src, Dtype dtype, const char* op, bool force = false);

// ---- ops ----
// weight [V, D], integer indices of any shape -> [..., D].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// grad [..., D] scatter-added row by row into zeros [num_rows, D].
Tensor embedding_backward(const Tensor& grad, const Tensor& indices, int64_t num_rows);

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// zeros(shape) with slice k of src (along dim) added into slice index[k]: index_select's
// backward. `dim` must already be wrapped; src's shape is `shape` with dim resized to index.numel().
Tensor index_add_zeros(const Shape& shape, int64_t dim, const Tensor& index, const Tensor& src);

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// zeros(src_shape) whose leading index-shaped block is gather(grad, dim, index): the gradient of
// scatter_add w.r.t. src (src may be larger than index; the rest of it is never read).
Tensor gather_padded(const Tensor& grad, int64_t dim, const Tensor& index, const Shape& src_shape);

Tensor masked_fill(const Tensor& a, const Tensor& mask, const Scalar& value);

// `op` names the caller in errors (stack reuses cat).
Tensor cat(const TensorList& tensors, int64_t dim, const char* op = "cat");
Tensor stack(const TensorList& tensors, int64_t dim);

// ---- device kernels ----
// The table a device backend registers (cuda/index.cu) with register_device_kernels. Core has
// validated every argument and allocated the outputs exactly as for the CPU; all tensors are on
// one device; index tensors are i32 or i64 of any strides. Kernels never touch memory outside a
// tensor for an out-of-range index: they skip it and, when `check` is set, report the one at the
// lowest logical position of the index tensor, which reads that report back to the host (the one
// host sync of these ops: the forward ops check, the backward kernels do not, their indices were
// checked by the forward).
struct IndexOutOfRange {
  int64_t position = -1;  // logical position in the index tensor; -1: all in range
  int64_t value = 0;
};

struct IndexDeviceKernels {
  virtual ~IndexDeviceKernels() = default;
  // out.select(dim, k) = src.select(dim, index[k]); index is 1-D, out has src's shape with dim
  // resized to index.numel(). Any strides for src and out.
  virtual IndexOutOfRange index_select(const Tensor& out, const Tensor& src, int64_t dim, const Tensor& index,
                                       bool check) = 0;
  // out.select(dim, index[k]) += src.select(dim, k) for every k: contiguous out and src, 1-D
  // index; deterministic (slices summed in order of k, as on the CPU).
  virtual void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) = 0;
  // Over the positions p of index: out[p] = a[p with coordinate dim replaced by index[p]]. out,
  // a, index have a's number of dims; any strides.
  virtual IndexOutOfRange gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index, bool check) = 0;
  // out[p with dim replaced by index[p]] += src[p] over the positions p of index: contiguous out,
  // src contiguous with index's shape; deterministic (summed in logical order of p).
  virtual IndexOutOfRange scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                                      bool check) = 0;
  // out (contiguous, a's shape) = mask ? value : a; mask (bool) broadcasts to a.
  virtual void masked_fill(const Tensor& out, const Tensor& a, const Tensor& mask, const Scalar& value) = 0;
};

// Calls f with a value of the C++ type of an i64/i32 index tensor (f(int64_t{}) or f(int32_t{})),
// binding the index type of a kernel; the CPU and the device backends (cuda/index.cu) share it.
template <class F>
void dispatch_index(Dtype dt, const char* op, F&& f) {
  if (dt == i64) {
    f(int64_t{});
  } else if (dt == i32) {
    f(int32_t{});
  } else {
    fail("[{}] index must be i64 or i32, got {}", op, dt);
  }
}

// True for the 1-D empty tensors cat skips (PyTorch's legacy behaviour).
inline bool cat_skips(const Tensor& t) { return t.dim() == 1 && t.size(0) == 0; }

// Sizes of the pieces split/chunk cut a dim of size n into. At most kMaxSplitPieces: each piece is a
// view object (a few hundred bytes), and an empty tensor's dim, or chunk's count for it, can be
// as large as int64 allows with no memory behind it, so the list itself would exhaust memory.
inline constexpr int64_t kMaxSplitPieces = int64_t{1} << 24;
std::vector<int64_t> split_sizes(int64_t n, int64_t split_size);
std::vector<int64_t> chunk_sizes(int64_t n, int64_t chunks);
// Views of consecutive slices of `a` along dim with the given sizes (which must sum to its size).
TensorList split_with_sizes(const Tensor& a, const std::vector<int64_t>& sizes, int64_t dim, const char* op);

}  // namespace tandem::detail
