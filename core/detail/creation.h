// The device kernels behind the factory functions of core/cpu/creation.cpp (zeros/ones/full and
// eye's zeros go through detail::fill; arange, linspace and eye have their own).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace tandem::detail {

// The table a device backend registers (cuda/creation.cu). `out` is a fresh contiguous 1-D
// (arange, linspace) or square 2-D (eye) tensor of a numeric dtype; every element is computed as
// the CPU loop computes it, so both devices give the same bits.
struct CreationDeviceKernels {
  virtual ~CreationDeviceKernels() = default;
  // integral: out[i] = istart + i * istep in int64; else start + i * step in double (not fused).
  virtual void arange(const Tensor& out, bool integral, int64_t istart, int64_t istep, double start,
                      double step) = 0;
  // out[i] = i < half ? start + step * i : end - step * (steps - 1 - i), in double (not fused).
  virtual void linspace(const Tensor& out, double start, double end, double step, int64_t half) = 0;
  // The identity matrix.
  virtual void eye(const Tensor& out) = 0;
};

}  // namespace tandem::detail
