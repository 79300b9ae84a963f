// The per-thread Philox generator and the CPU kernels of rand, randn, randint, the in-place fills
// and multinomial. Element i of every output is computed from block (offset + i * words / 4) only
// (multinomial: sample s of row r from element r * num_samples + s, two words each).
#include "core/random.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "core/detail/index.h"
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

namespace {

// Row r of probs [rows, n] (any strides) into out[r * num_samples ...] by the multinomial scheme
// of core/random.h. Throws for the first row that is no distribution to draw from.
template <class T>
void multinomial_cpu(const Tensor& out, const Tensor& probs, int64_t num_samples, bool replacement,
                     PhiloxState state, const Shape& probs_shape) {
  const int64_t rows = probs.size(0), n = probs.size(1);
  const int64_t chunk = multinomial_chunk(n), chunks = (n + chunk - 1) / chunk;
  const IndexCheck check = IndexCheck::for_probabilities("multinomial", probs_shape, num_samples);
  const T* p = static_cast<const T*>(probs.data_ptr());
  const int64_t rs = dim_step_bytes(probs, 0) / static_cast<int64_t>(sizeof(T));
  const int64_t cs = dim_step_bytes(probs, 1) / static_cast<int64_t>(sizeof(T));
  int64_t* o = static_cast<int64_t*>(out.data_ptr());
  std::vector<double> w(static_cast<size_t>(n)), local(static_cast<size_t>(n)), off(static_cast<size_t>(chunks) + 1);
  // The local sums of chunk c from w; the offsets from chunk `from` on.
  auto sum_chunk = [&](int64_t c) {
    double s = 0;
    for (int64_t j = c * chunk, end = std::min(n, j + chunk); j < end; ++j) local[j] = s = add_rn(s, w[j]);
  };
  auto sum_offsets = [&](int64_t from) {
    for (int64_t c = from; c < chunks; ++c) off[c + 1] = add_rn(off[c], local[std::min(n, (c + 1) * chunk) - 1]);
  };
  for (int64_t r = 0; r < rows; ++r) {
    int64_t nonzero = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double x = static_cast<double>(static_cast<acc_t<T>>(p[r * rs + j * cs]));
      if (!multinomial_weight_ok(x)) throw Error(index_error_message(check, IndexCheck::kBadProbability, r));
      nonzero += x > 0;
      w[j] = x;
    }
    for (int64_t c = 0; c < chunks; ++c) sum_chunk(c);
    off[0] = 0;
    sum_offsets(0);
    const double total = off[chunks];
    if (total == 0) throw Error(index_error_message(check, IndexCheck::kZeroSum, r));
    if (!multinomial_weight_ok(total)) throw Error(index_error_message(check, IndexCheck::kInfiniteSum, r));
    if (!replacement && nonzero < num_samples) throw Error(index_error_message(check, nonzero, r));
    for (int64_t s = 0; s < num_samples; ++s) {
      const double u = uniform_f64_at(state.seed, state.offset, static_cast<uint64_t>(r * num_samples + s));
      const int64_t j = multinomial_search(off.data(), local.data(), n, chunk, u);
      o[r * num_samples + s] = j;
      if (!replacement) {
        w[j] = 0;
        sum_chunk(j / chunk);
        sum_offsets(j / chunk);
      }
    }
  }
}

}  // namespace

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

Tensor multinomial(const Tensor& probs, int64_t num_samples, bool replacement) {
  const char* op = "multinomial";
  TANDEM_CHECK(probs.defined(), "[multinomial] got an undefined tensor");
  TANDEM_CHECK(probs.is_floating_point(), "[multinomial] probabilities must be floating, got {} (shape {})",
               probs.dtype(), probs.shape());
  TANDEM_CHECK(probs.dim() == 1 || probs.dim() == 2,
               "[multinomial] probabilities must be 1-D or 2-D (rows of categories), got shape {}", probs.shape());
  TANDEM_CHECK(num_samples > 0, "[multinomial] num_samples must be positive, got {}", num_samples);
  const int64_t n = probs.size(probs.dim() - 1);
  TANDEM_CHECK(replacement || num_samples <= n,
               "[multinomial] cannot draw {} samples without replacement from {} categories (probabilities of "
               "shape {})",
               num_samples, n, probs.shape());
  const Tensor rows = probs.dim() == 2 ? probs : make_view(probs, Shape{1, n}, Strides{0, probs.stride(0)},
                                                            probs.storage_offset());
  const int64_t count = checked_mul(rows.size(0), num_samples, op);
  Tensor out = make_empty(probs.dim() == 2 ? Shape{rows.size(0), num_samples} : Shape{num_samples}, i64,
                          probs.device(), op);
  const PhiloxState state = philox_reserve(philox_blocks(count, 2));
  if (count == 0) return out;
  if (!probs.is_cpu()) [[unlikely]] {
    kernels_for(probs, op).multinomial(out, rows, num_samples, replacement, state, probs.shape());
    return out;
  }
  TANDEM_DISPATCH_FLOATING(probs.dtype(), op, [&] {
    detail::multinomial_cpu<scalar_t>(out, rows, num_samples, replacement, state, probs.shape());
  });
  return out;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, TensorOptions opts) {
  TANDEM_CHECK(!opts.requires_grad || is_floating(opts.dtype),
               "[randint] only floating tensors can require grad, got {}", opts.dtype);
  Tensor t = new_random(shape, opts, "randint");
  detail::fill_randint(t, low, high, "randint");
  return finish(t, opts, "randint");
}

}  // namespace tandem
