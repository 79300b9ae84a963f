// The argument checks core's op families share, one message format each: every tensor of an op
// on one device, and a floating dtype where an op computes only in floating point. Op files
// include this, not each other's headers, for them. Internal to the library (not installed).
#pragma once

#include <initializer_list>

#include "core/tensor.h"

namespace tandem::detail {

// A tensor and the name an error gives it ("input", "weight", "grad").
struct NamedTensor {
  const char* name;
  const Tensor& t;
};

// Throws "[op] tensors are on different devices: a on cuda:0, b on cpu", naming each defined
// tensor of `ts` with its device.
[[noreturn]] void fail_devices(const char* op, std::initializer_list<NamedTensor> ts);

// The one device all the defined tensors of `ts` are on (cpu when none is); an undefined one is an
// absent optional argument and is skipped. Otherwise throws as fail_devices. Binary ops and where
// let a 0-dim CPU tensor join another device's tensors, as in PyTorch: they copy it over first
// (move_cpu_scalars, core/detail/elementwise.h) and then check here.
inline Device check_same_device(const char* op, std::initializer_list<NamedTensor> ts) {
  // On every elementwise op's path: the first defined tensor's device is read once.
  bool seen = false;
  Device d = kCPU;
  for (const NamedTensor& n : ts) {
    if (!n.t.defined()) [[unlikely]]
      continue;
    const Device here = n.t.device();
    if (!seen) {
      seen = true;
      d = here;
    } else if (!(here == d)) [[unlikely]] {
      fail_devices(op, ts);
    }
  }
  return d;
}

// The same for a list (cat, stack): "[cat] tensors are on different devices: tensor 0 on cuda:0,
// tensor 2 on cpu" names the first defined tensor and the first one not on its device.
Device check_same_device(const char* op, const TensorList& ts);

// Throws "[op] got an undefined input" or "[op] input must be floating, got i64 (shape [2, 3]);
// convert it first, e.g. .to(f32)"; `what` names the tensor.
[[noreturn]] void fail_floating(const Tensor& t, const char* op, const char* what);
inline void check_floating(const Tensor& t, const char* op, const char* what = "input") {
  if (!t.defined() || !is_floating(t.dtype())) [[unlikely]]
    fail_floating(t, op, what);
}

}  // namespace tandem::detail
