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
//
// multinomial (below the fills) follows the CPU's scheme of core/random.h: only f64 adds and
// multiplies in the CPU's order, so its samples are the CPU's exactly.
#include <type_traits>

#include "core/detail/index.h"
#include "core/detail/kernel_tables.h"
#include "core/random.h"
#include "cuda/detail/device_error.h"
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

// ---------------------------------------------------------------- multinomial

// One block per row (a grid-stride loop over the rows), summing as the CPU does (the scheme in
// core/random.h): its threads take the chunks' local sums in parallel, thread 0 the offsets. With
// replacement the threads then draw the row's samples in parallel; without, thread 0 draws them in
// turn, each draw summing its chunk and the offsets after it again, as the CPU's loop does. A row
// that is no distribution is recorded (deferred, at position = the row) and gets samples 0.
// Scratch per block, reused row after row: the local sums, the offsets, and without replacement
// the weights being drawn from.
template <class T>
__global__ void multinomial_kernel(int64_t* out, const T* probs, int64_t rows, int64_t n, int64_t row_step,
                                   int64_t col_step, int64_t samples, bool replacement, uint64_t seed,
                                   uint64_t offset, int64_t chunk, double* local_all, double* off_all,
                                   double* weights_all, ErrorSink sink) {
  const int64_t chunks = (n + chunk - 1) / chunk;
  double* local = local_all + blockIdx.x * n;
  double* off = off_all + blockIdx.x * (chunks + 1);
  double* w = replacement ? nullptr : weights_all + blockIdx.x * n;
  __shared__ int bad;
  __shared__ unsigned long long nonzero;
  __shared__ bool failed;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (threadIdx.x == 0) {
      bad = 0;
      nonzero = 0;
    }
    __syncthreads();
    const T* p = probs + r * row_step;
    unsigned long long mine = 0;
    bool my_bad = false;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      double s = 0;
      const int64_t end = (c + 1) * chunk < n ? (c + 1) * chunk : n;
      for (int64_t j = c * chunk; j < end; ++j) {
        const double x = static_cast<double>(static_cast<acc_t<T>>(p[j * col_step]));
        my_bad |= !detail::multinomial_weight_ok(x);
        mine += x > 0;
        if (w) w[j] = x;
        local[j] = s = detail::add_rn(s, x);
      }
      off[c + 1] = s;  // the chunk's total until thread 0 sums the offsets
    }
    if (my_bad) atomicExch(&bad, 1);
    if (mine) atomicAdd(&nonzero, mine);
    __syncthreads();
    if (threadIdx.x == 0) {
      int64_t verdict = 0;
      bool f = bad != 0;
      if (f) {
        verdict = detail::IndexCheck::kBadProbability;
      } else {
        off[0] = 0;
        for (int64_t c = 0; c < chunks; ++c) off[c + 1] = detail::add_rn(off[c], off[c + 1]);
        const double total = off[chunks];
        if (total == 0) {
          f = true;
          verdict = detail::IndexCheck::kZeroSum;
        } else if (!detail::multinomial_weight_ok(total)) {
          f = true;
          verdict = detail::IndexCheck::kInfiniteSum;
        } else if (!replacement && nonzero < static_cast<unsigned long long>(samples)) {
          f = true;
          verdict = static_cast<int64_t>(nonzero);
        }
      }
      failed = f;
      if (f) report_error(sink, verdict, r);
    }
    __syncthreads();
    int64_t* o = out + r * samples;
    if (failed) {
      for (int64_t s = threadIdx.x; s < samples; s += blockDim.x) o[s] = 0;
    } else if (replacement) {
      for (int64_t s = threadIdx.x; s < samples; s += blockDim.x) {
        const double u = detail::uniform_f64_at(seed, offset, static_cast<uint64_t>(r * samples + s));
        o[s] = detail::multinomial_search(off, local, n, chunk, u);
      }
    } else if (threadIdx.x == 0) {
      for (int64_t s = 0; s < samples; ++s) {
        const double u = detail::uniform_f64_at(seed, offset, static_cast<uint64_t>(r * samples + s));
        const int64_t j = detail::multinomial_search(off, local, n, chunk, u);
        o[s] = j;
        w[j] = 0;
        const int64_t first = j / chunk;
        double acc = 0;
        const int64_t end = (first + 1) * chunk < n ? (first + 1) * chunk : n;
        for (int64_t i = first * chunk; i < end; ++i) local[i] = acc = detail::add_rn(acc, w[i]);
        for (int64_t c = first; c < chunks; ++c) {
          const int64_t last = ((c + 1) * chunk < n ? (c + 1) * chunk : n) - 1;
          off[c + 1] = detail::add_rn(off[c], local[last]);
        }
      }
    }
    __syncthreads();  // the block's scratch is reused for its next row
  }
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
  void multinomial(const Tensor& out, const Tensor& probs, int64_t num_samples, bool replacement, PhiloxState state,
                   const Shape& probs_shape) override {
    const char* op = "multinomial";
    const int64_t rows = probs.size(0), n = probs.size(1);
    if (rows == 0) return;
    const Device device = probs.device();
    DeviceGuard guard(device);
    cudaStream_t stream = current_stream(device);
    const detail::IndexCheck check = detail::IndexCheck::for_probabilities(op, probs_shape, num_samples);
    const ErrorSink sink = error_sink(device.index, &check);
    const int64_t chunk = detail::multinomial_chunk(n), chunks = (n + chunk - 1) / chunk;
    // Rows in flight at once: as many as 64 MiB of scratch holds (at least one, at most 1024).
    const int64_t per_row = (replacement ? 1 : 2) * n + chunks + 1;
    int64_t blocks = (int64_t{64} << 20) / (8 * per_row);
    blocks = blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks);
    blocks = blocks > rows ? rows : blocks;
    Tensor local = make_empty(Shape{blocks * n}, f64, device, op);
    Tensor off = make_empty(Shape{blocks * (chunks + 1)}, f64, device, op);
    Tensor weights = replacement ? Tensor() : make_empty(Shape{blocks * n}, f64, device, op);
    const int64_t itemsize = static_cast<int64_t>(probs.element_size());
    const int64_t row_step = dim_step_bytes(probs, 0) / itemsize, col_step = dim_step_bytes(probs, 1) / itemsize;
    TANDEM_DISPATCH_FLOATING(probs.dtype(), op, [&] {
      multinomial_kernel<scalar_t><<<static_cast<unsigned>(blocks), kBlockThreads, 0, stream>>>(
          static_cast<int64_t*>(out.data_ptr()), static_cast<const scalar_t*>(probs.data_ptr()), rows, n, row_step,
          col_step, num_samples, replacement, state.seed, state.offset, chunk, static_cast<double*>(local.data_ptr()),
          static_cast<double*>(off.data_ptr()), replacement ? nullptr : static_cast<double*>(weights.data_ptr()),
          sink);
      TANDEM_CUDA_CHECK_LAUNCH("multinomial_kernel");
    });
  }
};

}  // namespace

void install_random_kernels() {
  static CudaRandomKernels table;
  register_device_kernels<detail::RandomDeviceKernels>(DeviceType::cuda, &table);
}

}  // namespace tandem::cuda
