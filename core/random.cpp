// The per-thread Philox generator and the CPU kernels of rand, randn, randint and the in-place
// fills. Element i of every output is computed from block (offset + i * words / 4) only.
#include "core/random.h"

#include <limits>

#include "core/detail/kernel_tables.h"
#include "core/detail/iter.h"

namespace tandem {

namespace {

// Per thread, so the ranks of the `threads` backend (and any user threads) draw independent,
// reproducible streams without locking.
thread_local PhiloxState generator;

// The device's kernels (throws "built without CUDA" in a CPU-only build).
detail::RandomDeviceKernels& kernels_for(const Tensor& t, const char* op) {
  return device_kernels<detail::RandomDeviceKernels>(t.device(), op);
}

// Writing random values through a broadcast (stride-0) view would silently give many elements
// one value; PyTorch refuses that, and so do we.
void require_no_overlap(const Tensor& t, const char* op) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    TANDEM_CHECK(t.size(d) <= 1 || t.stride(d) != 0,
                 "[{}] more than one element of the written-to tensor (shape {}, strides {}) refers to the same "
                 "memory location; call clone() first",
                 op, t.shape(), t.strides());
  }
}

// Calls gen(i) for every element in logical (row-major) order and stores the result.
template <class T, class Gen>
void fill_logical(const Tensor& t, Gen&& gen) {
  if (t.numel() == 0) return;
  if (t.is_contiguous()) {
    T* p = static_cast<T*>(t.data_ptr());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(gen(i));
    return;
  }
  int64_t idx = 0;
  for_each_run<1>(t.shape(), {&t}, [&](const StridedRun<1>& r) {
    char* p = r.ptr[0];
    for (int64_t k = 0; k < r.n; ++k, p += r.stride[0]) *reinterpret_cast<T*>(p) = static_cast<T>(gen(idx++));
  });
}

// The block for element i under a `words`-per-element layout, recomputed only when i crosses a
// block boundary (consecutive elements share a block).
struct BlockCache {
  PhiloxState state;
  int words;
  uint64_t cached = std::numeric_limits<uint64_t>::max();
  detail::PhiloxCounter block{};
  // Returns the block and sets `word` to the first word of element i inside it.
  const detail::PhiloxCounter& at(int64_t i, int& word) {
    uint64_t w = static_cast<uint64_t>(i) * words;
    uint64_t b = w / 4;
    word = static_cast<int>(w % 4);
    if (b != cached) {
      block = detail::philox_block(state.seed, state.offset + b);
      cached = b;
    }
    return block;
  }
};

}  // namespace

PhiloxState philox_reserve(uint64_t counters) {
  PhiloxState s = generator;
  generator.offset += counters;
  return s;
}

PhiloxState get_rng_state() { return generator; }
void set_rng_state(PhiloxState state) { generator = state; }

void manual_seed(uint64_t seed) { generator = PhiloxState{seed, 0}; }

namespace detail {

void fill_uniform(const Tensor& t, double lo, double hi, const char* op) {
  TANDEM_CHECK(t.is_floating_point(), "[{}] expected a floating dtype, got {}", op, t.dtype());
  TANDEM_CHECK(lo <= hi && std::isfinite(lo) && std::isfinite(hi), "[{}] expects finite lo <= hi, got lo={} hi={}",
               op, lo, hi);
  require_no_overlap(t, op);
  const double span = hi - lo;
  const int words = detail::float_words(t.dtype());
  if (!t.is_cpu()) [[unlikely]] {
    detail::RandomDeviceKernels& k = kernels_for(t, op);
    k.uniform(t, lo, hi, philox_reserve(philox_blocks(t.numel(), words)));
    return;
  }
  BlockCache cache{philox_reserve(philox_blocks(t.numel(), words)), words};
  int w = 0;
  switch (t.dtype()) {
    case f32:
      fill_logical<float>(t, [&](int64_t i) {
        return lo + span * detail::uniform_f32(cache.at(i, w).w[w]);
      });
      break;
    case f64:
      fill_logical<double>(t, [&](int64_t i) {
        const auto& b = cache.at(i, w);
        return lo + span * detail::uniform_f64(b.w[w], b.w[w + 1]);
      });
      break;
    case f16:
      fill_logical<Half>(t, [&](int64_t i) {
        return static_cast<float>(lo + span * detail::uniform_f16(cache.at(i, w).w[w]));
      });
      break;
    case bf16:
      fill_logical<BFloat16>(t, [&](int64_t i) {
        return static_cast<float>(lo + span * detail::uniform_bf16(cache.at(i, w).w[w]));
      });
      break;
    default: fail("[{}] expected a floating dtype, got {}", op, t.dtype());
  }
}

void fill_normal(const Tensor& t, double mean, double std, const char* op) {
  TANDEM_CHECK(t.is_floating_point(), "[{}] expected a floating dtype, got {}", op, t.dtype());
  TANDEM_CHECK(std >= 0 && std::isfinite(std) && std::isfinite(mean),
               "[{}] expects a finite mean and std >= 0, got mean={} std={}", op, mean, std);
  require_no_overlap(t, op);
  const int words = detail::float_words(t.dtype());
  if (!t.is_cpu()) [[unlikely]] {
    detail::RandomDeviceKernels& k = kernels_for(t, op);
    k.normal(t, mean, std, philox_reserve(philox_blocks(t.numel(), words)));
    return;
  }
  BlockCache cache{philox_reserve(philox_blocks(t.numel(), words)), words};
  int w = 0;
  if (t.dtype() == f64) {
    fill_logical<double>(t, [&](int64_t i) {
      const auto& b = cache.at(i, w);
      return mean + std * detail::normal_f64_from_block(b, w / 2);
    });
    return;
  }
  TANDEM_DISPATCH_FLOATING(t.dtype(), op, [&] {
    fill_logical<scalar_t>(t, [&](int64_t i) {
      const auto& b = cache.at(i, w);
      return static_cast<acc_t<scalar_t>>(mean + std * detail::normal_from_block(b, w));
    });
  });
}

void fill_randint(const Tensor& t, int64_t low, int64_t high, const char* op) {
  TANDEM_CHECK(high > low, "[{}] high ({}) must be greater than low ({})", op, high, low);
  if (t.dtype() == i32) {
    TANDEM_CHECK(low >= std::numeric_limits<int32_t>::min() && high - 1 <= std::numeric_limits<int32_t>::max(),
                 "[{}] range [{}, {}) does not fit dtype i32", op, low, high);
  } else if (t.dtype() == boolean) {
    TANDEM_CHECK(low >= 0 && high <= 2, "[{}] range [{}, {}) does not fit dtype bool", op, low, high);
  }
  require_no_overlap(t, op);
  // The unsigned difference is exact for any int64 pair with high > low.
  const uint64_t range = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  const int words = detail::randint_words(range);
  if (!t.is_cpu()) [[unlikely]] {
    detail::RandomDeviceKernels& k = kernels_for(t, op);
    k.randint(t, low, range, philox_reserve(philox_blocks(t.numel(), words)));
    return;
  }
  BlockCache cache{philox_reserve(philox_blocks(t.numel(), words)), words};
  int w = 0;
  // Modulo reduction, as PyTorch does; its bias is below range / 2^32 (or / 2^64).
  auto draw = [&](int64_t i) -> int64_t {
    const auto& b = cache.at(i, w);
    uint64_t x = words == 1 ? b.w[w] : (static_cast<uint64_t>(b.w[w + 1]) << 32 | b.w[w]);
    return static_cast<int64_t>(static_cast<uint64_t>(low) + x % range);
  };
  TANDEM_DISPATCH_ALL(t.dtype(), op, [&] {
    fill_logical<scalar_t>(t, [&](int64_t i) {
      return static_cast<acc_t<scalar_t>>(draw(i));
    });
  });
}

}  // namespace detail

namespace {
// Generated where it lives: the element values do not depend on the device.
Tensor new_random(const Shape& shape, const TensorOptions& opts, const char* op) {
  backend_for(opts.device, op);
  return make_empty(shape, opts.dtype, opts.device, op);
}

Tensor finish(Tensor t, const TensorOptions& opts, const char* op) {
  if (opts.requires_grad) t.requires_grad_();
  return t;
}
}  // namespace

Tensor rand(const Shape& shape, TensorOptions opts) {
  TANDEM_CHECK(is_floating(opts.dtype), "[rand] expected a floating dtype, got {}", opts.dtype);
  Tensor t = new_random(shape, opts, "rand");
  detail::fill_uniform(t, 0, 1, "rand");
  return finish(t, opts, "rand");
}

Tensor randn(const Shape& shape, TensorOptions opts) {
  TANDEM_CHECK(is_floating(opts.dtype), "[randn] expected a floating dtype, got {}", opts.dtype);
  Tensor t = new_random(shape, opts, "randn");
  detail::fill_normal(t, 0, 1, "randn");
  return finish(t, opts, "randn");
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts) {
  TANDEM_CHECK(!opts.requires_grad || is_floating(opts.dtype),
               "[randint] only floating tensors can require grad, got {}", opts.dtype);
  Tensor t = new_random(shape, opts, "randint");
  detail::fill_randint(t, low, high, "randint");
  return finish(t, opts, "randint");
}

}  // namespace tandem
