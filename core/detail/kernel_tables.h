// Core's kernel tables: how an op family reaches the kernels a device backend registered. Not
// part of the installed API: core's op families, and the backends that implement their tables,
// include it.
#pragma once

#include "core/backend.h"
#include "core/error.h"

namespace tandem {

// tandem::detail holds everything of core that is not API: the ops' forward computation and CPU
// kernels, the raw (autograd-free) views and copies, the RNG internals and the device kernel
// tables; autograd/, nn/ and cuda/ call it, users call tandem::. One namespace over two folders:
// core/cpu/ (the CPU kernels per op family, the mirror of cuda/) and core/detail/ (what both
// backends and the op layer share). One namespace for every op family rather than one each, as
// `detail` is what C++ libraries (fmt, Boost, MLX) call "internal", and a reader then never has to
// learn which family spells itself ew::, raw:: or rng::. (A backend's own translation unit may
// keep a private namespace for its kernels, as cuda/elementwise.cu's ew_impl: not API, and never
// seen by core.) The families' names do not collide: each table carries its family in its name
// (ElementwiseDeviceKernels, ReduceDeviceKernels, ...).
//
// Kernel tables. An op family with device kernels declares an interface struct next to its
// kernels' declarations (e.g. detail::ElementwiseDeviceKernels in core/detail/elementwise.h, whose
// CPU side is core/cpu/elementwise*.cpp); a backend registers one implementation per device type
// when it is installed. Core validates arguments, promotes dtypes and allocates the result, then
// hands the raw work to `device_kernels<Table>(device, op)`.
namespace detail {
template <class Table>
inline Table* kernel_tables[2] = {nullptr, nullptr};
}  // namespace detail

template <class Table>
void register_device_kernels(DeviceType type, Table* table) {
  detail::kernel_tables<Table>[static_cast<int>(type)] = table;
}

// The registered table for `device`; throws "[op] tandem was built without CUDA" (via
// backend_for) or "[op] has no kernel for tensors on cuda:0".
template <class Table>
Table& device_kernels(Device device, const char* op) {
  backend_for(device, op);
  Table* t = detail::kernel_tables<Table>[static_cast<int>(device.type)];
  if (t == nullptr) [[unlikely]]
    fail("[{}] has no kernel for tensors on {}", op, device);
  return *t;
}

}  // namespace tandem
