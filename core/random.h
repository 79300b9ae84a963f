// The random-number generator state and the element transforms shared by every random op.
//
// The generator is per thread: (seed, offset). An op reserves `counters` consecutive Philox
// blocks starting at `offset` and advances it, so element i of its output depends only on
// (seed, offset, i) -- never on the thread count, the device, or the tensor's strides. The
// CUDA kernels use the same reservation and the same transforms below, so CPU and GPU give the
// same uniforms bit for bit (normals too, up to a last-ulp difference of the device libm).
//
// Layout per op (words_per_element words of block (i * words_per_element) / 4):
//   f32/f16/bf16 uniform, i32/i64 randint with a range < 2^32: one word per element;
//   f64 uniform, randint with a range >= 2^32:                   two words per element;
//   normal (f32/f16/bf16): one word per element, Box-Muller over word pairs (0,1) and (2,3);
//   normal f64: two words per element, Box-Muller over the block's two 53-bit uniforms.
//   multinomial: two words (an f64 uniform) per (row, sample), whatever the dtype (see below).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/macros.h"
#include "core/philox.h"
#include "core/tensor.h"

namespace tandem {

inline constexpr uint64_t kDefaultSeed = 67280421310721ull;

struct PhiloxState {
  uint64_t seed = kDefaultSeed;
  uint64_t offset = 0;
};

// Returns the calling thread's state and advances its offset by `counters` blocks.
PhiloxState philox_reserve(uint64_t counters);
// The calling thread's state, and restoring one (to replay a random op exactly).
PhiloxState get_rng_state();
void set_rng_state(PhiloxState state);

// Blocks needed for `numel` elements taking `words_per_element` 32-bit words each.
constexpr uint64_t philox_blocks(int64_t numel, int words_per_element) {
  return (static_cast<uint64_t>(numel) * static_cast<uint64_t>(words_per_element) + 3) / 4;
}

namespace detail {

// [0, 1) from the top 24 bits: every value exactly representable in f32.
TANDEM_HOST_DEVICE inline float uniform_f32(uint32_t x) { return static_cast<float>(x >> 8) * 0x1.0p-24f; }
// [0, 1) with 53 random bits from two words.
TANDEM_HOST_DEVICE inline double uniform_f64(uint32_t lo, uint32_t hi) {
  uint64_t bits = (static_cast<uint64_t>(hi) << 32 | lo) >> 11;
  return static_cast<double>(bits) * 0x1.0p-53;
}
// [0, 1) with as many bits as the 2-byte types hold (11 for f16, 8 for bf16), so the rounding to
// the narrow type can never produce 1.
TANDEM_HOST_DEVICE inline float uniform_f16(uint32_t x) { return static_cast<float>(x >> 21) * 0x1.0p-11f; }
TANDEM_HOST_DEVICE inline float uniform_bf16(uint32_t x) { return static_cast<float>(x >> 24) * 0x1.0p-8f; }

struct NormalPair {
  double z0, z1;
};
// Box-Muller from two uniforms in [0, 1): u1 is flipped into (0, 1] so log never sees 0. Done in
// double for every dtype so f32 results are correctly rounded on both devices.
TANDEM_HOST_DEVICE inline NormalPair box_muller(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  double r = std::sqrt(-2.0 * std::log(1.0 - u1));
  double theta = kTwoPi * u2;
  return {r * std::cos(theta), r * std::sin(theta)};
}

// Normal number k (0..3) of a block, for the one-word-per-element layout.
TANDEM_HOST_DEVICE inline double normal_from_block(const PhiloxCounter& b, int k) {
  int pair = k >> 1;
  double u1 = uniform_f32(b.w[2 * pair]);
  double u2 = uniform_f32(b.w[2 * pair + 1]);
  NormalPair p = box_muller(u1, u2);
  return (k & 1) ? p.z1 : p.z0;
}
// Normal number k (0..1) of a block, for the two-words-per-element (f64) layout.
TANDEM_HOST_DEVICE inline double normal_f64_from_block(const PhiloxCounter& b, int k) {
  NormalPair p = box_muller(uniform_f64(b.w[0], b.w[1]), uniform_f64(b.w[2], b.w[3]));
  return k ? p.z1 : p.z0;
}

// 32-bit words per element of randint over [low, low + range).
TANDEM_HOST_DEVICE constexpr int randint_words(uint64_t range) { return range > 0xffffffffull ? 2 : 1; }
// 32-bit words per element of a uniform or normal fill of a floating dtype.
constexpr int float_words(Dtype dtype) { return dtype == f64 ? 2 : 1; }

// ---- multinomial ----
// The scheme both devices follow, so that a seed gives the same samples on each: every sum and
// product below is one f64 operation, rounded to nearest, in the same order, never fused.
//
// Row r's weights (converted to f64) are cut into chunks of multinomial_chunk(n) categories. In a
// chunk the local sums run left to right from 0: local(j) = local(j - 1) + w(j). Over the chunks
// the offsets run left to right: off(0) = 0, off(c + 1) = off(c) + local(last of chunk c), and
// off(chunks) is the row's total. Category j of chunk c has the cumulative weight
// cdf(j) = off(c) + local(j): non-decreasing in j, and a weight of 0 adds exactly 0. (The chunks
// let a device sum a row in parallel and still round as the CPU does.)
//
// Sample s of row r takes the f64 uniform u of element r * num_samples + s (two words each, the
// layout of rand(f64)), target = u * total, and draws the first category whose cdf exceeds the
// target (when rounding made the target reach the total: the first whose cdf reaches it). Its
// weight is positive either way. Without replacement its weight then becomes 0, its chunk's local
// sums and the offsets after it are summed again as above, and the next sample draws from what is
// left: exactly as if the row had held those zeros from the start.
//
// A multinomial reserves philox_blocks(rows * num_samples, 2) blocks with or without replacement,
// so one sample per row is the same draw either way.
TANDEM_HOST_DEVICE inline int64_t multinomial_chunk(int64_t n) {
  int64_t c = 32;
  while (c < (int64_t{1} << 31) && c * c < n) c *= 2;
  return c;
}

// One f64 add or multiply, rounded to nearest: nvcc would otherwise be free to fuse a multiply into
// a later add; the host compiles these as plain SSE2 operations.
TANDEM_HOST_DEVICE inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TANDEM_HOST_DEVICE inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

// The f64 uniform of element i of a two-words-per-element draw reserved at (seed, offset).
TANDEM_HOST_DEVICE inline double uniform_f64_at(uint64_t seed, uint64_t offset, uint64_t i) {
  const PhiloxCounter b = philox_block(seed, offset + i / 2);
  const int w = static_cast<int>(i % 2) * 2;
  return uniform_f64(b.w[w], b.w[w + 1]);
}

// A weight a row may hold: finite and non-negative (NaN fails both comparisons).
TANDEM_HOST_DEVICE inline bool multinomial_weight_ok(double w) { return w >= 0 && w <= 0x1.fffffffffffffp+1023; }

TANDEM_HOST_DEVICE inline bool multinomial_passes(double cdf, double target, bool strict) {
  return strict ? cdf > target : cdf >= target;
}

// The category a sample with uniform u draws from a row of n categories summed as above: `off`
// holds off(0 .. chunks), `local` the local sums of the row.
TANDEM_HOST_DEVICE inline int64_t multinomial_search(const double* off, const double* local, int64_t n, int64_t chunk,
                                                     double u) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  const double total = off[chunks];
  double target = mul_rn(u, total);
  const bool strict = target < total;
  if (!strict) target = total;
  // The first chunk whose last cdf, off(c + 1), passes; then the first category in it that does.
  int64_t lo = 0, hi = chunks - 1;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (multinomial_passes(off[mid + 1], target, strict)) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  const double base = off[lo];
  int64_t jl = lo * chunk, jh = (n < jl + chunk ? n : jl + chunk) - 1;
  while (jl < jh) {
    const int64_t mid = jl + (jh - jl) / 2;
    if (multinomial_passes(add_rn(base, local[mid]), target, strict)) {
      jh = mid;
    } else {
      jl = mid + 1;
    }
  }
  return jl;
}

// The table a device backend registers (cuda/random.cu). Core has validated the arguments and
// reserved `state` (philox_reserve) exactly as for the CPU; the kernel fills t (any strides, no
// two elements sharing memory) in logical order so that element i gets what the CPU gives it.
struct RandomDeviceKernels {
  virtual ~RandomDeviceKernels() = default;
  virtual void uniform(const Tensor& t, double lo, double hi, PhiloxState state) = 0;
  virtual void normal(const Tensor& t, double mean, double std, PhiloxState state) = 0;
  // Values low + x % range, x of randint_words(range) words.
  virtual void randint(const Tensor& t, int64_t low, uint64_t range, PhiloxState state) = 0;
  // out [rows, num_samples] (i64, contiguous) drawn from probs [rows, n] (floating, any strides)
  // by the multinomial scheme above; core has checked the dtype, the shapes and num_samples. A row
  // that is no distribution to draw from is recorded as the CPU would throw it (the message of
  // IndexCheck::for_probabilities with probs_shape, the user's shape, at position = the row),
  // raised at the next synchronisation; its samples are 0.
  virtual void multinomial(const Tensor& out, const Tensor& probs, int64_t num_samples, bool replacement,
                           PhiloxState state, const Shape& probs_shape) = 0;
};

// Fill `t` (any strides, no overlapping elements) in logical order; no autograd checks (the
// public in-place ops in autograd/random_inplace.cpp make them).
void fill_uniform(const Tensor& t, double lo, double hi, const char* op);
void fill_normal(const Tensor& t, double mean, double std, const char* op);
void fill_randint(const Tensor& t, int64_t low, int64_t high, const char* op);
}  // namespace detail

}  // namespace tandem
