// Launch helpers of the sliding-window kernel files, cuda/conv.cu and cuda/pool.cu (.cu only):
// their kernels take one thread per output (or input) element in a grid-stride loop, launched for
// the tensor's floating dtype on its device's current stream.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "core/tensor.h"
#include "cuda/detail/launch.h"

#define TANDEM_GRID_LOOP(i, n) \
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < (n); i += int64_t(gridDim.x) * blockDim.x)

namespace tandem::cuda::window_impl {

template <class T>
T* ptr(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

// Runs fn(T{}, total, blocks, stream) for `like`'s floating dtype on its device's current
// stream; nothing for an empty launch.
template <class F>
void launch(const Tensor& like, const char* op, int64_t total, F&& fn) {
  if (total == 0) return;
  DeviceGuard guard(like.device());
  cudaStream_t stream = current_stream(like.device());
  TANDEM_DISPATCH_FLOATING(like.dtype(), op, [&] { fn(scalar_t{}, total, blocks_for(total), stream); });
}

}  // namespace tandem::cuda::window_impl
