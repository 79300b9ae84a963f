// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind every random op.
//
// A block is a pure function of (counter, key): no state to carry between elements, so a CPU
// loop and a CUDA thread that compute block i of the same (seed, offset) get the same bits.
// Everything here is TANDEM_HOST_DEVICE and header-only so the CUDA kernels include it as is.
#pragma once

#include <cstdint>

#include "core/macros.h"

namespace tandem::detail {

struct PhiloxCounter {
  uint32_t w[4];
};
struct PhiloxKey {
  uint32_t w[2];
};

inline constexpr uint32_t kPhiloxMul0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxWeyl0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxWeyl1 = 0xBB67AE85u;  // sqrt(3) - 1

TANDEM_HOST_DEVICE inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  hi = static_cast<uint32_t>(p >> 32);
  lo = static_cast<uint32_t>(p);
}

TANDEM_HOST_DEVICE inline PhiloxCounter philox_round(PhiloxCounter c, PhiloxKey k) {
  uint32_t hi0, lo0, hi1, lo1;
  mulhilo(kPhiloxMul0, c.w[0], hi0, lo0);
  mulhilo(kPhiloxMul1, c.w[2], hi1, lo1);
  return PhiloxCounter{{hi1 ^ c.w[1] ^ k.w[0], lo1, hi0 ^ c.w[3] ^ k.w[1], lo0}};
}

// The 10-round bijection of Random123's philox4x32_10: philox_round, then bump the key between rounds.
TANDEM_HOST_DEVICE inline PhiloxCounter philox4x32_10(PhiloxCounter c, PhiloxKey k) {
  c = philox_round(c, k);
  for (int r = 1; r < 10; ++r) {
    k.w[0] += kPhiloxWeyl0;
    k.w[1] += kPhiloxWeyl1;
    c = philox_round(c, k);
  }
  return c;
}

// Tandem's mapping of its generator state onto Philox: the key is the 64-bit seed and the
// counter is the 64-bit block index (offset + block) in the low two words.
TANDEM_HOST_DEVICE inline PhiloxCounter philox_block(uint64_t seed, uint64_t counter) {
  PhiloxCounter c{{static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u}};
  PhiloxKey k{{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
  return philox4x32_10(c, k);
}

}  // namespace tandem::detail
