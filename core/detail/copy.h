// Copies between tensors: any dtype to any dtype, any strides to any strides, within a device or
// across devices. Every copy of one tensor into another ends in strided_copy; op families call the
// entry points below (materialize, convert, cast, ...) rather than write their own copy loops.
// Internal to the library (not installed).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/detail/iter.h"
#include "core/tensor.h"

namespace tandem::detail {

// How strided_copy treats two tensors of one dtype.
enum class SameDtype : uint8_t {
  // The bits move unchanged: every copy but copy_.
  bits,
  // Loaded and stored as between two dtypes, which takes f16/bf16 through float and so quiets a
  // signalling NaN: copy_'s rule on the CPU (CUDA's copy kernel moves the bits). Other dtypes
  // come out bit for bit as with `bits`, and take its loops.
  convert,
};

// dst[i] = src[i] converted to dst's dtype by core/detail/elementwise.h's load and store: through acc_t,
// so f16/bf16 go via float and round to nearest even (NaN kept, core/half.h); to an integer by
// truncation; to bool as != 0 (NaN is true). dst and src are on one device; src broadcasts to
// dst's shape; dst has no expanded dims, and src overlaps it at most element for element (copy_
// makes sure of both: check_writable, unaliased). An empty dst is never addressed (the address
// rule, core/shape.h). A device tensor goes to its backend's copy kernel.
//
// On the CPU, one dtype moves bytes: one memmove when both tensors are contiguous with one
// shape, else run by run (core/detail/iter.h's coalesced runs, copy_strided_run below). Two dtypes go
// through core/cpu/elementwise_loops.h's map, which converts contiguous runs in vectorised blocks.
void strided_copy(const Tensor& dst, const Tensor& src, const char* op, SameDtype same = SameDtype::bits);

// One run of a same-dtype copy: a memcpy when it is contiguous on both sides and at least 32
// bytes long, else element by element. Shorter runs copy faster in the loop than through a call to
// memcpy, longer ones slower (a [1024, 1024] f32 narrowed to 4 columns: 3.2 us in the loop, 3.8
// through memcpy; to 12 columns: 6.4 us in the loop, 3.8 through memcpy). strided_copy's runs and
// index_select's rows (core/cpu/index.cpp) go through it.
template <class T>
inline void copy_strided_run(const StridedRun<2>& r) {
  constexpr int64_t kSize = static_cast<int64_t>(sizeof(T));
  char* d = r.ptr[0];
  const char* s = r.ptr[1];
  if (r.stride[0] == kSize && r.stride[1] == kSize && r.n * kSize >= 32) {
    std::memcpy(d, s, static_cast<size_t>(r.n) * sizeof(T));
    return;
  }
  for (int64_t i = 0; i < r.n; ++i, d += r.stride[0], s += r.stride[1])
    *reinterpret_cast<T*>(d) = *reinterpret_cast<const T*>(s);
}

// ---- into a new tensor (contiguous, on the source's device) ----
// `a` itself when it already has `dtype` (strided or not), else a contiguous converted copy.
Tensor cast(const Tensor& a, Dtype dtype, const char* op = "to");
// A fresh contiguous copy of `a` (same dtype and device).
Tensor contiguous_copy(const Tensor& a, const char* op = "contiguous");
// A contiguous copy (the tensor itself when already contiguous), on the tensor's device.
Tensor materialize(const Tensor& t, const char* op);
// A copy converted to `dtype` (contiguous; materialize when t already has `dtype`).
Tensor convert(const Tensor& t, Dtype dtype, const char* op);
// A contiguous copy of src in `dtype` (src itself when it already is one and `force` is false).
Tensor cast_copy(const Tensor& src, Dtype dtype, const char* op, bool force = false);
// A copy of `a` on `device` (a itself when already there), through the backends' copy_bytes.
Tensor to_device(const Tensor& a, Device device);

// ---- into an existing tensor ----
// copy_ without the autograd check or version bump: src (any dtype, any device) converted and
// broadcast into self; a src that overlaps self other than element for element is copied first.
void copy(const Tensor& self, const Tensor& src, const char* name = "copy_");
// dst[...] = src[...] elementwise for tensors of one dtype; src broadcasts to dst's shape.
void copy_same_dtype(const Tensor& dst, const Tensor& src, const char* op);
// Copies src into dst elementwise (same shape, same device), casting between any two dtypes.
void copy_into(const Tensor& dst, const Tensor& src, const char* op);

}  // namespace tandem::detail
