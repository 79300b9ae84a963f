// Indexing and joining: the forward computations (and the raw kernels their backward rules
// reuse) behind embedding, index_select, gather, scatter_add, masked_fill, cat, stack, split
// and chunk. Everything here validates its arguments and throws "[op] ..." errors; nothing here
// records on the tape (autograd/index_grad.cpp does that).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace tandem::detail {

// A zero-filled contiguous tensor.
Tensor zeros_of(const Shape& shape, Dtype dtype, Device device, const char* op);

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

// ---- index range errors ----
// What an out-of-range index is reported against: the parts of the message besides the bad value
// and its position. One formatter for the CPU's immediate errors and a device's deferred ones, so
// both say the same thing. (multinomial reports a bad row of probabilities the same way.)
struct IndexCheck {
  enum class Kind : int32_t {
    dim_index,      // "[op] index v is out of range for dim d of size n (input shape)"
    embedding_row,  // "[embedding] index v (at flat position p) is out of range for an embedding table of
                    //  n rows (weight shape)"
    class_target,   // "[op] target v is out of bounds for n classes (expected 0..n-1 or ignore_index i)"
    probability_row,  // multinomial: row `position` of the probabilities (input shape) is not a distribution to
                      // draw `size` samples from; value: kBadProbability, kZeroSum, kInfiniteSum, or (>= 0) the
                      // row's count of non-zero categories, fewer than the samples drawn without replacement
  };
  static constexpr int64_t kBadProbability = -1;  // a negative, infinite or NaN entry
  static constexpr int64_t kZeroSum = -2;
  static constexpr int64_t kInfiniteSum = -3;     // finite entries whose f64 sum overflows
  Kind kind = Kind::dim_index;
  const char* op = "";
  int64_t dim = 0;           // dim_index: the dim indexed
  int64_t size = 0;          // the bound: [0, size) is in range
  int64_t ignore_index = 0;  // class_target: the one value outside [0, size) that is allowed
  Shape input;               // dim_index, embedding_row: the input's (weight's) shape

  static IndexCheck for_dim(const char* op, int64_t dim, int64_t size, const Shape& input) {
    IndexCheck c;
    c.op = op;
    c.dim = dim;
    c.size = size;
    c.input = input;
    return c;
  }
  static IndexCheck for_embedding(const Shape& weight) {
    IndexCheck c;
    c.kind = Kind::embedding_row;
    c.op = "embedding";
    c.size = weight.empty() ? 0 : weight[0];
    c.input = weight;
    return c;
  }
  static IndexCheck for_classes(const char* op, int64_t classes, int64_t ignore_index) {
    IndexCheck c;
    c.kind = Kind::class_target;
    c.op = op;
    c.size = classes;
    c.ignore_index = ignore_index;
    return c;
  }

  static IndexCheck for_probabilities(const char* op, const Shape& probs, int64_t num_samples) {
    IndexCheck c;
    c.kind = Kind::probability_row;
    c.op = op;
    c.size = num_samples;
    c.input = probs;
    return c;
  }

  bool in_range(int64_t v) const { return (v >= 0 && v < size) || (kind == Kind::class_target && v == ignore_index); }
};
std::string index_error_message(const IndexCheck& check, int64_t value, int64_t position);

// Every value of an integer tensor (any shape, i64 or i32) within check's range, in logical order.
// CPU: throws index_error_message for the first one that is not. A device: the kernel records the
// first bad value there and the backend raises it at its next synchronisation (no host sync here).
void check_index_range(const Tensor& index, const IndexCheck& check);

// ---- device kernels ----
// The table a device backend registers (cuda/index.cu) with register_device_kernels. Core has
// validated every argument and allocated the outputs exactly as for the CPU; all tensors are on
// one device; index tensors are i32 or i64 of any strides. Kernels never touch memory outside a
// tensor for an out-of-range index: they skip it. With a `check` (the forward ops pass one; the
// backward kernels pass none, their indices were checked by the forward) the kernel also records
// the bad index at the lowest logical position of the index tensor on the device, without a host
// sync: the backend raises index_error_message at its next synchronisation (a copy to the host,
// a stream or device synchronize), so the error surfaces later than the op call.
struct IndexDeviceKernels {
  virtual ~IndexDeviceKernels() = default;
  // out.select(dim, k) = src.select(dim, index[k]); index is 1-D, out has src's shape with dim
  // resized to index.numel(). Any strides for src and out. Position: k.
  virtual void index_select(const Tensor& out, const Tensor& src, int64_t dim, const Tensor& index,
                            const IndexCheck* check) = 0;
  // out.select(dim, index[k]) += src.select(dim, k) for every k: contiguous out and src, 1-D
  // index; deterministic (slices summed in order of k, as on the CPU).
  virtual void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src) = 0;
  // Over the positions p of index: out[p] = a[p with coordinate dim replaced by index[p]]. out,
  // a, index have a's number of dims; any strides.
  virtual void gather(const Tensor& out, const Tensor& a, int64_t dim, const Tensor& index,
                      const IndexCheck* check) = 0;
  // out[p with dim replaced by index[p]] += src[p] over the positions p of index: contiguous out,
  // src contiguous with index's shape; deterministic (summed in logical order of p).
  virtual void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                           const IndexCheck* check) = 0;
  // check_index_range for a device tensor: records the first value not check.in_range.
  virtual void check_range(const Tensor& index, const IndexCheck& check) = 0;
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
