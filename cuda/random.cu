// CUDA kernels of the random fills (core/random.h): uniform, normal and randint with the CPU's
// Philox-4x32-10 counter scheme. One thread per Philox block: it computes block b of the
// reserved range (seed, offset + b) once and writes the 4 (one word each) or 2 (two words each)
// elements that block feeds, each through the same transform of core/random.h the CPU applies
// to it, so element i depends only on (seed, offset, i) on both devices.
//
// Bit-identity with the CPU: the uniforms, randint and the f32/f16/bf16 normals round the same
// way on both devices (every `a + b * c` here is an unfused multiply and add, as the CPU compiles
// it without -march=native); f64 normals can differ in the last bits, where the device's double
// log/cos/sin differ from the host libm's by an ulp (and, rarely, such an ulp can move an f32
// normal across a rounding boundary).
#include <type_traits>

#include "core/detail/kernel_tables.h"
#include "core/random.h"
#include "cuda/detail/launch.h"
#include "cuda/detail/strided.cuh"

namespace tandem::cuda {

namespace {

using namespace geom;

// a + b * c, rounded after the multiply and after the add (never one fused multiply-add), as the
// CPU computes `lo + span * u`.
__device__ inline double add_mul(double a, double b, double c) { return __dadd_rn(a, __dmul_rn(b, c)); }

template <class T>
struct UniformGen {
  double lo, span;
  __device__ T operator()(const detail::PhiloxCounter& b, int w) const {
    if constexpr (std::is_same_v<T, float>) {
      return static_cast<float>(add_mul(lo, span, detail::uniform_f32(b.w[w])));
    } else if constexpr (std::is_same_v<T, double>) {
      return add_mul(lo, span, detail::uniform_f64(b.w[w], b.w[w + 1]));
    } else if constexpr (std::is_same_v<T, Half>) {
      return Half(static_cast<float>(add_mul(lo, span, detail::uniform_f16(b.w[w]))));
    } else {
      return BFloat16(static_cast<float>(add_mul(lo, span, detail::uniform_bf16(b.w[w]))));
    }
  }
};

template <class T>
struct NormalGen {
  double mean, std;
  __device__ T operator()(const detail::PhiloxCounter& b, int w) const {
    if constexpr (std::is_same_v<T, double>) {
      return add_mul(mean, std, detail::normal_f64_from_block(b, w / 2));
    } else {
      return static_cast<T>(static_cast<acc_t<T>>(add_mul(mean, std, detail::normal_from_block(b, w))));
    }
  }
};

template <class T>
struct RandintGen {
  int64_t low;
  uint64_t range;
  int words;
  __device__ T operator()(const detail::PhiloxCounter& b, int w) const {
    const uint64_t x = words == 1 ? b.w[w] : (static_cast<uint64_t>(b.w[w + 1]) << 32 | b.w[w]);
    const int64_t v = static_cast<int64_t>(static_cast<uint64_t>(low) + x % range);
    return static_cast<T>(static_cast<acc_t<T>>(v));
  }
};

// Element e = b * per_block + j takes word j * words of block b (words = 4 / per_block).
template <class T, bool kContiguous, class Gen>
__global__ void philox_fill_kernel(T* out, Dims dims, ElemStrides st, int64_t n, uint64_t seed, uint64_t offset,
                                   int words, Gen gen) {
  const int per_block = 4 / words;
  const int64_t nblocks = (n + per_block - 1) / per_block;
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < nblocks; b += int64_t(gridDim.x) * blockDim.x) {
    const detail::PhiloxCounter block = detail::philox_block(seed, offset + static_cast<uint64_t>(b));
    for (int j = 0; j < per_block; ++j) {
      const int64_t e = b * per_block + j;
      if (e >= n) break;
      const T v = gen(block, j * words);
      if constexpr (kContiguous) {
        out[e] = v;
      } else {
        out[offset_of(e, dims, st)] = v;
      }
    }
  }
}

template <class T, class Gen>
void launch_fill(const Tensor& t, PhiloxState state, int words, Gen gen, const char* op) {
  const int64_t n = t.numel();
  if (n == 0) return;
  DeviceGuard guard(t.device());
  cudaStream_t stream = current_stream(t.device());
  const int64_t nblocks = (n * words + 3) / 4;
  auto* out = static_cast<T*>(t.data_ptr());
  if (t.is_contiguous()) {
    philox_fill_kernel<T, true, Gen><<<blocks_for(nblocks), kBlockThreads, 0, stream>>>(
        out, Dims{}, ElemStrides{}, n, state.seed, state.offset, words, gen);
  } else {
    philox_fill_kernel<T, false, Gen><<<blocks_for(nblocks), kBlockThreads, 0, stream>>>(
        out, dims_of(t.shape(), op), strides_of(t.strides()), n, state.seed, state.offset, words, gen);
  }
  TANDEM_CUDA_CHECK_LAUNCH("philox_fill_kernel");
}

class CudaRandomKernels final : public detail::RandomDeviceKernels {
 public:
  void uniform(const Tensor& t, double lo, double hi, PhiloxState state) override {
    const char* op = "uniform";
    const int words = detail::float_words(t.dtype());
    TANDEM_DISPATCH_FLOATING(t.dtype(), op, [&] {
      launch_fill<scalar_t>(t, state, words, UniformGen<scalar_t>{lo, hi - lo}, op);
    });
  }
  void normal(const Tensor& t, double mean, double std, PhiloxState state) override {
    const char* op = "normal";
    const int words = detail::float_words(t.dtype());
    TANDEM_DISPATCH_FLOATING(t.dtype(), op, [&] {
      launch_fill<scalar_t>(t, state, words, NormalGen<scalar_t>{mean, std}, op);
    });
  }
  void randint(const Tensor& t, int64_t low, uint64_t range, PhiloxState state) override {
    const char* op = "randint";
    const int words = detail::randint_words(range);
    TANDEM_DISPATCH_ALL(t.dtype(), op, [&] {
      launch_fill<scalar_t>(t, state, words, RandintGen<scalar_t>{low, range, words}, op);
    });
  }
};

}  // namespace

void install_random_kernels() {
  static CudaRandomKernels table;
  register_device_kernels<detail::RandomDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
