#include "core/tensor.h"

#include <algorithm>
#include <sstream>

#include "core/detail/copy.h"  // to_device
#include "core/detail/iter.h"

namespace tandem {

void TensorImpl::rebind(const TensorImpl& data, bool bump_version) {
  const uint64_t old_version = storage ? storage->version() : 0;
  storage = data.storage;
  offset = data.offset;
  shape = data.shape;
  strides = data.strides;
  numel = data.numel;
  dtype = data.dtype;
  contiguous = data.contiguous;
  is_view = false;
  if (bump_version) storage->set_version(std::max(old_version, storage->version()) + 1);
}

void TensorImpl::refresh_contiguity() {
  numel = numel_of(shape);
  int64_t expected = 1;
  contiguous = true;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 1) continue;
    if (strides[i] != expected) {
      contiguous = false;
      return;
    }
    // An empty tensor's sizes may multiply past int64; no stride can then match what follows.
    if (__builtin_mul_overflow(expected, shape[i], &expected)) {
      contiguous = false;
      return;
    }
  }
}

int64_t Tensor::size(int64_t d) const {
  TANDEM_CHECK(dim() > 0, "[size] a 0-dim tensor has no dimension {}", d);
  return shape()[wrap_dim(d, dim(), "size")];
}
int64_t Tensor::stride(int64_t d) const {
  TANDEM_CHECK(dim() > 0, "[stride] a 0-dim tensor has no dimension {}", d);
  return strides()[wrap_dim(d, dim(), "stride")];
}

void* Tensor::data_ptr() const {
  auto* i = checked();
  char* start = static_cast<char*>(i->storage->data());
  // The address rule (core/shape.h): a tensor with no elements addresses nothing, and its offset may
  // be anything a view of an empty tensor computed (up to INT64_MAX): its pointer is the storage's
  // start. A tensor with elements has its first one inside the storage, so the product fits.
  if (i->numel == 0) return start;
  return start + i->offset * static_cast<int64_t>(itemsize(i->dtype));
}

int64_t dim_step_bytes(const Tensor& t, int64_t dim) {
  if (t.numel() == 0 || t.shape()[static_cast<size_t>(dim)] <= 1) return 0;
  return t.strides()[static_cast<size_t>(dim)] * static_cast<int64_t>(t.element_size());  // inside the storage
}

Tensor make_empty(const Shape& shape, Dtype dtype, Device device, const char* op) {
  for (int64_t d : shape) TANDEM_CHECK(d >= 0, "[{}] negative dimension in shape {}", op, shape);
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->numel = numel_of(shape);  // before the strides: it names the overflow of the element count
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  int64_t nbytes = checked_mul(impl->numel, static_cast<int64_t>(itemsize(dtype)), op);
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(nbytes), device, op);
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& base, const Shape& shape, const Strides& strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->is_view = true;
  impl->refresh_contiguity();
  return Tensor(std::move(impl));
}

Strides broadcast_strides(const Tensor& t, const Shape& shape) {
  const Shape& s = t.shape();
  const Strides& st = t.strides();
  size_t n = shape.size();
  TANDEM_CHECK(s.size() <= n, "[broadcast] tensor of shape {} cannot be viewed as {}", s, shape);
  Strides out(n, 0);
  size_t lead = n - s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == shape[lead + i]) {
      out[lead + i] = st[i];
    } else {
      TANDEM_CHECK(s[i] == 1, "[broadcast] tensor of shape {} cannot be viewed as {}", s, shape);
    }
  }
  return out;
}

template <class T> T Tensor::item() const {
  TANDEM_CHECK(numel() == 1, "[item] needs a tensor with one element, got shape {}", shape());
  // As PyTorch: on a device, one element is copied to the host, which waits for the device.
  if (!is_cpu()) return detail::to_device(*this, kCPU).item<T>();
  T out{};
  TANDEM_DISPATCH_ALL(dtype(), "item", [&] {
    out = static_cast<T>(static_cast<acc_t<scalar_t>>(*static_cast<const scalar_t*>(data_ptr())));
  });
  return out;
}

template <class T> std::vector<T> Tensor::to_vector() const {
  if (!is_cpu()) return detail::to_device(*this, kCPU).to_vector<T>();  // as item(): waits for the device
  std::vector<T> out(static_cast<size_t>(numel()));
  if (out.empty()) return out;
  size_t idx = 0;  // indexed, not a pointer: std::vector<bool> has no data()
  TANDEM_DISPATCH_ALL(dtype(), "to_vector", [&] {
    for_each_run<1>(shape(), {this}, [&](const StridedRun<1>& r) {
      const char* p = r.ptr[0];
      for (int64_t i = 0; i < r.n; ++i, p += r.stride[0])
        out[idx++] = static_cast<T>(static_cast<acc_t<scalar_t>>(*reinterpret_cast<const scalar_t*>(p)));
    });
  });
  return out;
}

#define TANDEM_INSTANTIATE_VALUE_ACCESS(T)   \
  template T Tensor::item<T>() const;        \
  template std::vector<T> Tensor::to_vector<T>() const;
TANDEM_INSTANTIATE_VALUE_ACCESS(float)
TANDEM_INSTANTIATE_VALUE_ACCESS(double)
TANDEM_INSTANTIATE_VALUE_ACCESS(int32_t)
TANDEM_INSTANTIATE_VALUE_ACCESS(int64_t)
TANDEM_INSTANTIATE_VALUE_ACCESS(bool)
#undef TANDEM_INSTANTIATE_VALUE_ACCESS

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace tandem
