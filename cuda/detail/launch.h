// Launch helpers shared by the kernel files (.cu only).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/detail/check.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

inline constexpr int kBlockThreads = 256;

// Blocks for n elements at `per_thread` elements each, capped so grid-stride loops cover the rest.
inline unsigned blocks_for(int64_t n, int per_thread = 1, int threads = kBlockThreads) {
  int64_t per_block = int64_t(threads) * per_thread;
  int64_t b = (n + per_block - 1) / per_block;
  if (b < 1) b = 1;
  if (b > (int64_t{1} << 20)) b = int64_t{1} << 20;
  return static_cast<unsigned>(b);
}

}  // namespace tandem::cuda
