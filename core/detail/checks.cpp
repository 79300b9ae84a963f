#include "core/detail/checks.h"

#include <string>

namespace tandem::detail {

void fail_devices(const char* op, std::initializer_list<NamedTensor> ts) {
  std::string list;
  for (const NamedTensor& n : ts) {
    if (!n.t.defined()) continue;
    list += fmt::format("{}{} on {}", list.empty() ? "" : ", ", n.name, n.t.device());
  }
  fail("[{}] tensors are on different devices: {}", op, list);
}

Device check_same_device(const char* op, const TensorList& ts) {
  const Tensor* first = nullptr;
  size_t first_i = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const Tensor& t = ts[i];
    if (!t.defined()) continue;
    if (first == nullptr) {
      first = &t;
      first_i = i;
    } else if (!(t.device() == first->device())) [[unlikely]] {
      const std::string a = fmt::format("tensor {}", first_i), b = fmt::format("tensor {}", i);
      fail_devices(op, {{a.c_str(), *first}, {b.c_str(), t}});
    }
  }
  return first != nullptr ? first->device() : kCPU;
}

void fail_floating(const Tensor& t, const char* op, const char* what) {
  if (!t.defined()) fail("[{}] got an undefined {}", op, what);
  fail("[{}] {} must be floating, got {} (shape {}); convert it first, e.g. .to(f32)", op, what, t.dtype(), t.shape());
}

}  // namespace tandem::detail
