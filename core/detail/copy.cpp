// The copies of core/detail/copy.h: strided_copy, and the entry points that allocate, check or cross
// devices around it.
#include "core/detail/copy.h"

#include <cstring>

#include "core/backend.h"
#include "core/cpu/elementwise_loops.h"
#include "core/detail/checks.h"

namespace tandem::detail {

namespace {

bool through_float(Dtype d) { return d == f16 || d == bf16; }

// One dtype on the CPU: the bytes move.
void copy_bits(const Tensor& dst, const Tensor& src, const char* op) {
  if (dst.is_contiguous() && src.is_contiguous() && dst.shape() == src.shape()) {
    std::memmove(dst.data_ptr(), src.data_ptr(), dst.nbytes());
    return;
  }
  // copy_'s element-for-element alias: every element is already where it goes (and memcpy must
  // not be handed one range as both source and destination).
  if (dst.data_ptr() == src.data_ptr() && dst.shape() == src.shape() && dst.strides() == src.strides()) return;
  // Runs on the intra-op threads, unless source and destination share memory (an overlapping
  // copy_ would then depend on the order of the runs).
  TANDEM_DISPATCH_ALL(dst.dtype(), op, [&] {
    auto kernel = [](const StridedRun<2>& r) { copy_strided_run<scalar_t>(r); };
    if (dst.storage() == src.storage()) {
      for_each_run<2>(dst.shape(), {&dst, &src}, kernel);
    } else {
      for_each_output_run<2>(dst.shape(), {&dst, &src}, kernel);
    }
  });
}

// Two dtypes on the CPU, or copy_ from f16 to f16 and bf16 to bf16: load, store.
void copy_converting(const Tensor& dst, const Tensor& src, const char* op) {
  TANDEM_DISPATCH_ALL(src.dtype(), op, [&] {
    using S = scalar_t;
    TANDEM_DISPATCH_ALL(dst.dtype(), op, [&] {
      using D = scalar_t;
      map<D, S>(dst, {&src}, Identity{});
    });
  });
}

}  // namespace

void strided_copy(const Tensor& dst, const Tensor& src, const char* op, SameDtype same) {
  if (!dst.is_cpu()) [[unlikely]] {
    if (dst.numel() > 0) elementwise_table(dst, op).copy(dst, src);
    return;
  }
  if (dst.numel() == 0) return;
  if (dst.dtype() == src.dtype() && !(same == SameDtype::convert && through_float(dst.dtype()))) {
    copy_bits(dst, src, op);
    return;
  }
  copy_converting(dst, src, op);
}

// ---- into a new tensor ----

Tensor cast(const Tensor& a, Dtype dtype, const char* op) {
  if (a.dtype() == dtype) return a;
  Tensor out = make_empty(a.shape(), dtype, a.device(), op);
  copy(out, a, op);
  return out;
}

Tensor contiguous_copy(const Tensor& a, const char* op) {
  Tensor out = make_empty(a.shape(), a.dtype(), a.device(), op);
  copy_same_dtype(out, a, op);
  return out;
}

Tensor materialize(const Tensor& t, const char* op) {
  if (t.is_contiguous()) return t;
  Tensor out = make_empty(t.shape(), t.dtype(), t.device(), op);
  strided_copy(out, t, op);
  return out;
}

Tensor convert(const Tensor& t, Dtype dtype, const char* op) {
  if (t.dtype() == dtype) return materialize(t, op);
  Tensor out = make_empty(t.shape(), dtype, t.device(), op);
  strided_copy(out, t, op);
  return out;
}

Tensor cast_copy(const Tensor& src, Dtype dtype, const char* op, bool force) {
  if (!force && src.dtype() == dtype && src.is_contiguous()) return src;
  Tensor out = make_empty(src.shape(), dtype, src.device(), op);
  copy_into(out, src, op);
  return out;
}

Tensor to_device(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  Backend& dst_backend = backend_for(device, "to");
  Backend& src_backend = backend_for(a.device(), "to");
  // The backends copy raw bytes, so a strided source is made contiguous on its own device.
  Tensor src = a.is_contiguous() ? a : contiguous_copy(a, "to");
  Tensor out = make_empty(a.shape(), a.dtype(), device, "to");
  Backend& b = device.is_cpu() ? src_backend : dst_backend;  // the device-side backend does the copy
  b.copy_bytes(out.data_ptr(), device, src.data_ptr(), a.device(), src.nbytes());
  return out;
}

// ---- into an existing tensor ----

void copy(const Tensor& self, const Tensor& src_in, const char* name) {
  TANDEM_CHECK(self.defined() && src_in.defined(), "[{}] undefined tensor", name);
  check_broadcasts_to(src_in, self, "source", name);
  check_writable(self, name);
  if (!(self.device() == src_in.device())) [[unlikely]] {
    // Across devices: the bytes move in src's dtype and shape, then convert on self's device.
    copy(self, to_device(src_in, self.device()), name);
    return;
  }
  strided_copy(self, unaliased(self, src_in, name), name, SameDtype::convert);
}

void copy_same_dtype(const Tensor& dst, const Tensor& src, const char* op) {
  TANDEM_CHECK(dst.dtype() == src.dtype(), "[{}] copy between dtypes {} and {} (expected one dtype)", op, dst.dtype(),
               src.dtype());
  if (!(dst.is_cpu() && src.is_cpu())) [[unlikely]]
    check_same_device(op, {{"dst", dst}, {"src", src}});
  strided_copy(dst, src, op);
}

void copy_into(const Tensor& dst, const Tensor& src, const char* op) {
  TANDEM_CHECK(dst.shape() == src.shape(), "[{}] internal: copy from {} into {}", op, src.shape(), dst.shape());
  check_same_device(op, {{"destination", dst}, {"source", src}});
  strided_copy(dst, src, op);
}

}  // namespace tandem::detail
