// Matrix products on CUDA: the batched GEMM of core/detail/matmul.h (core/cpu/matmul.cpp on the CPU)
// through cuBLAS.
//
// Core hands over a batch of row-major products C[i] = A[i] B[i] with arbitrary strides. cuBLAS is
// column-major, so each call computes C^T = B^T A^T: a row-major matrix with unit column stride
// is its own transpose in column-major order (op N), one with unit row stride is op T, and the
// leading dimensions carry over unchanged. An operand with neither unit stride is first gathered
// into a contiguous buffer (one kernel). Batch dims go to cublasGemmStridedBatchedEx; the ones
// that a single stride cannot describe, and the ones C is summed over (weight gradients of a
// broadcast operand), become a host loop of calls on the same stream, accumulating with beta = 1.
//
// f32 computes in f32 (TF32 tensor cores only when cuda::allow_tf32()), f16/bf16 take f32
// accumulation, f64 is f64; i32/i64 (which cuBLAS has not) use a plain kernel.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <mutex>
#include <vector>

#include "core/detail/kernel_tables.h"
#include "core/detail/matmul.h"
#include "core/tensor.h"
#include "cuda/detail/check.h"
#include "cuda/detail/launch.h"
#include "cuda/runtime.h"

namespace tandem::cuda {

namespace {

using detail::MatOperand;
using detail::BatchFold;
using detail::blas_layout;
using detail::fold_batch;
using detail::sums_over_batch;

// ---------------------------------------------------------------- cuBLAS handles and workspaces

constexpr int kMaxDevices = 64;

// cuBLAS's workspace size on `device` (PyTorch's defaults), asked once per device.
size_t workspace_bytes(int device) {
  static std::array<std::atomic<size_t>, kMaxDevices> known{};
  TANDEM_CHECK(device >= 0 && device < kMaxDevices, "[matmul] cuda:{} is beyond the {} devices supported", device,
               kMaxDevices);
  size_t bytes = known[device].load(std::memory_order_relaxed);
  if (bytes == 0) {
    int major = 0;
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    bytes = major >= 9 ? (size_t{32} << 20) : (size_t{8} << 20);
    known[device].store(bytes, std::memory_order_relaxed);
  }
  return bytes;
}

// cuBLAS's workspace is not kept anywhere: each product (a Gemm, below) takes one from the
// caching allocator on its stream and frees it when its GEMMs are queued. The allocator caches
// blocks per stream and reuses them only on that stream, so the next product on the stream gets
// the same block back (a set lookup, no cudaMalloc) and stream order makes the reuse safe; a
// short-lived stream's block goes back to the cache with everything else it allocated, and
// empty_cache() or an out-of-memory retry returns it to CUDA. Keeping one per (thread, stream),
// as before, held 32 MiB allocated for the thread's life per stream it ever ran a GEMM on; a cap
// (an LRU of a few streams) would bound that but still pin memory the allocator cannot reclaim.
//
// Handles are expensive to create and not thread-safe, so each thread leases one per device and
// returns it to this pool when it exits. The pool is never destroyed (no teardown-order trouble at
// exit); the handles stay valid for the process.
struct HandlePool {
  std::mutex mu;
  std::vector<cublasHandle_t> free[kMaxDevices];
};

HandlePool& handle_pool() {
  static auto* pool = new HandlePool;
  return *pool;
}

class ThreadHandles {
 public:
  ~ThreadHandles() {
    HandlePool& pool = handle_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    for (int d = 0; d < kMaxDevices; ++d)
      if (handles_[d] != nullptr) pool.free[d].push_back(handles_[d]);
  }

  // The thread's handle for `device` (current), bound to `stream` and to `workspace` (device
  // memory of the caller's that stays allocated until the GEMMs using it are queued on `stream`).
  cublasHandle_t get(int device, cudaStream_t stream, void* workspace, size_t workspace_size) {
    TANDEM_CHECK(device >= 0 && device < kMaxDevices, "[matmul] cuda:{} is beyond the {} devices supported", device,
                 kMaxDevices);
    cublasHandle_t& h = handles_[device];
    if (h == nullptr) {
      HandlePool& pool = handle_pool();
      {
        std::lock_guard<std::mutex> lock(pool.mu);
        if (!pool.free[device].empty()) {
          h = pool.free[device].back();
          pool.free[device].pop_back();
        }
      }
      if (h == nullptr) TANDEM_CUBLAS_CHECK(cublasCreate(&h));
    }
    // SetStream resets the workspace to cuBLAS's own pool, so the workspace is set after it.
    TANDEM_CUBLAS_CHECK(cublasSetStream(h, stream));
    TANDEM_CUBLAS_CHECK(cublasSetWorkspace(h, workspace, workspace_size));
    return h;
  }

 private:
  cublasHandle_t handles_[kMaxDevices] = {};
};

cublasHandle_t blas_handle(int device, cudaStream_t stream, void* workspace, size_t workspace_size) {
  thread_local ThreadHandles handles;
  return handles.get(device, stream, workspace, workspace_size);
}

// ---------------------------------------------------------------- kernels

constexpr int kMaxGatherDims = 16;

struct GatherGeometry {
  int nd = 0;
  int64_t sizes[kMaxGatherDims];
  int64_t strides[kMaxGatherDims];  // of the source, in elements
};

// dst (contiguous over g.sizes) = src read through g.strides; E is a same-size stand-in for the
// element type.
template <class E>
__global__ void gather_kernel(E* __restrict__ dst, const E* __restrict__ src, int64_t n, GatherGeometry g) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = i, off = 0;
    for (int d = g.nd - 1; d >= 0; --d) {
      const int64_t c = rem % g.sizes[d];
      rem /= g.sizes[d];
      off += c * g.strides[d];
    }
    dst[i] = src[off];
  }
}

// Integer GEMMs (no cuBLAS kernel): one thread per element of C.
template <class T>
__global__ void int_gemm_kernel(int64_t count, int64_t M, int64_t N, int64_t K, const T* __restrict__ A, int64_t as0,
                                int64_t as1, int64_t sa, const T* __restrict__ B, int64_t bs0, int64_t bs1, int64_t sb,
                                T* __restrict__ C, int64_t ldc, int64_t sc, bool accumulate) {
  const int64_t total = count * M * N;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = idx % N, t = idx / N;
    const int64_t i = t % M, bi = t / M;
    const T* a = A + bi * sa + i * as0;
    const T* b = B + bi * sb + j * bs1;
    T s = 0;
    for (int64_t k = 0; k < K; ++k) s += a[k * as1] * b[k * bs0];
    T* c = C + bi * sc + i * ldc + j;
    *c = accumulate ? *c + s : s;
  }
}

// ---------------------------------------------------------------- host side

// A batch dim with each operand's stride (0: broadcast for A and B, summed over for C).
struct BatchDim {
  int64_t size, sa, sb, sc;
};

// Size-1 dims dropped, neighbours merged where every stride chains.
std::vector<BatchDim> simplify(const Shape& batch, const Strides& sa, const Strides& sb, const Strides& sc) {
  std::vector<BatchDim> dims;
  for (size_t d = 0; d < batch.size(); ++d) {
    if (batch[d] == 1) continue;
    BatchDim cur{batch[d], sa[d], sb[d], sc[d]};
    if (!dims.empty()) {
      BatchDim& outer = dims.back();
      if (outer.sa == cur.sa * cur.size && outer.sb == cur.sb * cur.size && outer.sc == cur.sc * cur.size) {
        outer = {outer.size * cur.size, cur.sa, cur.sb, cur.sc};
        continue;
      }
    }
    dims.push_back(cur);
  }
  return dims;
}

struct Operand {
  const char* data;  // element [0, ..., 0]
  int64_t s0, s1;
};

class Gemm {
 public:
  Gemm(Device device, Dtype dtype, const char* op)
      : device_(device), dtype_(dtype), op_(op), esize_(itemsize(dtype)), stream_(current_stream(device)) {}

  void zero(void* c, int64_t numel) const {
    if (numel > 0) TANDEM_CUDA_CHECK(cudaMemsetAsync(c, 0, static_cast<size_t>(numel) * esize_, stream_));
  }

  // A contiguous copy of a [dims..., rows, cols] operand (its `which` strides of dims), for the
  // floating types when cuBLAS cannot read it in place; rewrites x and the dims' strides. The
  // buffer lives until this Gemm is gone, by then every GEMM reading it is enqueued.
  void make_readable(Operand& x, int64_t rows, int64_t cols, std::vector<BatchDim>& dims, int64_t BatchDim::*which) {
    if (!is_floating(dtype_)) return;  // the integer kernel reads any strides
    bool transposed;
    int64_t ld;
    if (blas_layout(rows, cols, x.s0, x.s1, transposed, ld)) return;
    GatherGeometry g;
    TANDEM_CHECK(dims.size() + 2 <= kMaxGatherDims, "[{}] more than {} batch dims on CUDA", op_, kMaxGatherDims - 2);
    int64_t n = rows * cols;
    for (const BatchDim& d : dims) {
      g.sizes[g.nd] = d.*which == 0 ? 1 : d.size;  // a broadcast dim stays broadcast
      g.strides[g.nd] = d.*which;
      n *= g.sizes[g.nd];
      ++g.nd;
    }
    g.sizes[g.nd] = rows;
    g.strides[g.nd++] = x.s0;
    g.sizes[g.nd] = cols;
    g.strides[g.nd++] = x.s1;
    Tensor buf = make_empty(Shape{n}, dtype_, device_, op_);
    const unsigned blocks = blocks_for(n);
    switch (esize_) {
      case 2:
        gather_kernel<<<blocks, kBlockThreads, 0, stream_>>>(static_cast<uint16_t*>(buf.data_ptr()),
                                                             reinterpret_cast<const uint16_t*>(x.data), n, g);
        break;
      case 4:
        gather_kernel<<<blocks, kBlockThreads, 0, stream_>>>(static_cast<uint32_t*>(buf.data_ptr()),
                                                             reinterpret_cast<const uint32_t*>(x.data), n, g);
        break;
      default:
        gather_kernel<<<blocks, kBlockThreads, 0, stream_>>>(static_cast<uint64_t*>(buf.data_ptr()),
                                                             reinterpret_cast<const uint64_t*>(x.data), n, g);
        break;
    }
    TANDEM_CUDA_CHECK_LAUNCH("matmul gather_kernel");
    int64_t stride = rows * cols;
    for (size_t d = dims.size(); d-- > 0;) {
      if (dims[d].*which == 0) continue;
      dims[d].*which = stride;
      stride *= dims[d].size;
    }
    x = {static_cast<const char*>(buf.data_ptr()), cols, 1};
    keep_.push_back(std::move(buf));
  }

  // count products C[i] = A[i] B[i] (+ C[i] when accumulate), operand i at data + i * stride.
  void strided_batched(int64_t count, int64_t M, int64_t N, int64_t K, const Operand& a, int64_t sa, const Operand& b,
                       int64_t sb, char* c, int64_t sc, bool accumulate) {
    if (count == 0 || M == 0 || N == 0) return;
    if (!is_floating(dtype_)) return int_gemm(count, M, N, K, a, sa, b, sb, c, sc, accumulate);
    bool ta = false, tb = false;
    int64_t lda, ldb;
    const bool ok_a = blas_layout(M, K, a.s0, a.s1, ta, lda), ok_b = blas_layout(K, N, b.s0, b.s1, tb, ldb);
    TANDEM_CHECK(ok_a && ok_b, "[{}] internal: GEMM operand not readable by cuBLAS", op_);
    const cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    for (int64_t v : {M, N, K, lda, ldb, count})
      TANDEM_CHECK(v <= INT_MAX, "[{}] a matrix dimension or stride of {} exceeds the cuBLAS limit {}", op_, v,
                   INT_MAX);
    cudaDataType_t type;
    cublasComputeType_t compute;
    switch (dtype_) {
      case f32:
        type = CUDA_R_32F;
        compute = allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
        break;
      case f64:
        type = CUDA_R_64F;
        compute = CUBLAS_COMPUTE_64F;
        break;
      case f16:
        type = CUDA_R_16F;
        compute = CUBLAS_COMPUTE_32F;
        break;
      default:
        type = CUDA_R_16BF;
        compute = CUBLAS_COMPUTE_32F;
        break;
    }
    // alpha and beta have the compute type's precision.
    const float alpha_f = 1.0f, beta_f = accumulate ? 1.0f : 0.0f;
    const double alpha_d = 1.0, beta_d = accumulate ? 1.0 : 0.0;
    const void* alpha = dtype_ == f64 ? static_cast<const void*>(&alpha_d) : &alpha_f;
    const void* beta = dtype_ == f64 ? static_cast<const void*>(&beta_d) : &beta_f;
    void* ws = workspace();
    cublasHandle_t h = blas_handle(device_.index, stream_, ws, workspace_size_);
    // Column-major C^T (N x M) = B^T (N x K) A^T (K x M).
    const int m = int(N), n = int(M), k = int(K);
    if (count == 1) {
      TANDEM_CUBLAS_CHECK(cublasGemmEx(h, opb, opa, m, n, k, alpha, b.data, type, int(ldb), a.data, type, int(lda),
                                       beta, c, type, m, compute, CUBLAS_GEMM_DEFAULT));
    } else {
      TANDEM_CUBLAS_CHECK(cublasGemmStridedBatchedEx(h, opb, opa, m, n, k, alpha, b.data, type, int(ldb), sb, a.data,
                                                     type, int(lda), sa, beta, c, type, m, sc, int(count), compute,
                                                     CUBLAS_GEMM_DEFAULT));
    }
  }

  size_t esize() const { return esize_; }

 private:
  // On the current stream (stream_), like every other buffer of the product: freed with this Gemm,
  // once every GEMM using it is queued, it is reused only by later work on stream_.
  void* workspace() {
    if (!workspace_.defined()) {
      workspace_size_ = workspace_bytes(device_.index);
      workspace_ = make_empty(Shape{static_cast<int64_t>(workspace_size_ / 8)}, i64, device_, op_);
    }
    return workspace_.data_ptr();
  }

  void int_gemm(int64_t count, int64_t M, int64_t N, int64_t K, const Operand& a, int64_t sa, const Operand& b,
                int64_t sb, char* c, int64_t sc, bool accumulate) const {
    const unsigned blocks = blocks_for(count * M * N);
    if (dtype_ == i32) {
      int_gemm_kernel<<<blocks, kBlockThreads, 0, stream_>>>(
          count, M, N, K, reinterpret_cast<const int32_t*>(a.data), a.s0, a.s1, sa,
          reinterpret_cast<const int32_t*>(b.data), b.s0, b.s1, sb, reinterpret_cast<int32_t*>(c), N, sc, accumulate);
    } else {
      int_gemm_kernel<<<blocks, kBlockThreads, 0, stream_>>>(
          count, M, N, K, reinterpret_cast<const int64_t*>(a.data), a.s0, a.s1, sa,
          reinterpret_cast<const int64_t*>(b.data), b.s0, b.s1, sb, reinterpret_cast<int64_t*>(c), N, sc, accumulate);
    }
    TANDEM_CUDA_CHECK_LAUNCH("matmul int_gemm_kernel");
  }

  Device device_;
  Dtype dtype_;
  const char* op_;
  size_t esize_;
  cudaStream_t stream_;
  std::vector<Tensor> keep_;
  // cuBLAS's workspace for this product's GEMMs, taken at the first one (see blas_handle).
  Tensor workspace_;
  size_t workspace_size_ = 0;
};

class CudaMatmulKernels final : public detail::MatmulDeviceKernels {
 public:
  void batched_gemm(Device device, Dtype dtype, const Shape& batch, int64_t M, int64_t N, int64_t K,
                    const MatOperand& a_in, const MatOperand& b_in, void* c_ptr, const Strides& c_batch_strides,
                    int64_t c_numel, bool accumulate, const char* op) override {
    TANDEM_CHECK(dtype != boolean, "[{}] bool tensors are not supported", op);
    if (M == 0 || N == 0) return;
    DeviceGuard guard(device);
    Gemm gemm(device, dtype, op);
    const size_t es = gemm.esize();
    char* c = static_cast<char*>(c_ptr);
    Operand a{static_cast<const char*>(a_in.data), a_in.s0, a_in.s1};
    Operand b{static_cast<const char*>(b_in.data), b_in.s0, b_in.s1};
    const int64_t nb = numel_of(batch);
    if (nb == 0 || K == 0) {
      if (!accumulate) gemm.zero(c, c_numel);  // empty sums
      return;
    }
    const bool c_reduces = sums_over_batch(batch, c_batch_strides);
    const BatchFold fold = fold_batch(batch, M, N, K, a_in, b_in, c_batch_strides);  // as core's batched_gemm
    std::vector<BatchDim> none;

    // B shared by the whole batch: stack the batch into the rows of one GEMM.
    if (fold == BatchFold::into_rows) {
      gemm.make_readable(a, M * nb, K, none, &BatchDim::sa);
      gemm.make_readable(b, K, N, none, &BatchDim::sb);
      gemm.strided_batched(1, M * nb, N, K, a, 0, b, 0, c, 0, accumulate);
      return;
    }
    // C summed over the whole batch (weight gradients): stack the batch into the contraction.
    if (fold == BatchFold::into_contraction) {
      gemm.make_readable(a, M, K * nb, none, &BatchDim::sa);
      gemm.make_readable(b, K * nb, N, none, &BatchDim::sb);
      gemm.strided_batched(1, M, N, K * nb, a, 0, b, 0, c, 0, accumulate);
      return;
    }

    std::vector<BatchDim> dims = simplify(batch, a_in.batch_strides, b_in.batch_strides, c_batch_strides);
    gemm.make_readable(a, M, K, dims, &BatchDim::sa);
    gemm.make_readable(b, K, N, dims, &BatchDim::sb);
    bool acc = accumulate;
    if (c_reduces && !accumulate) {
      gemm.zero(c, c_numel);
      acc = true;
    }
    // One dim C is not summed over goes to the strided-batched call (the largest); the rest, in
    // order on one stream, are a host loop, so products summed into one C[i] never race.
    int inner = -1;
    for (size_t d = 0; d < dims.size(); ++d)
      if (dims[d].sc != 0 && (inner < 0 || dims[d].size > dims[inner].size)) inner = int(d);
    const int64_t count = inner < 0 ? 1 : dims[inner].size;
    const int64_t sa = inner < 0 ? 0 : dims[inner].sa, sb = inner < 0 ? 0 : dims[inner].sb,
                  sc = inner < 0 ? 0 : dims[inner].sc;
    std::vector<BatchDim> outer;
    for (size_t d = 0; d < dims.size(); ++d)
      if (int(d) != inner) outer.push_back(dims[d]);
    std::vector<int64_t> ctr(outer.size(), 0);
    int64_t ao = 0, bo = 0, co = 0;
    int64_t calls = 1;
    for (const BatchDim& d : outer) calls *= d.size;
    for (int64_t i = 0; i < calls; ++i) {
      gemm.strided_batched(count, M, N, K, {a.data + ao * int64_t(es), a.s0, a.s1}, sa,
                           {b.data + bo * int64_t(es), b.s0, b.s1}, sb, c + co * int64_t(es), sc, acc);
      for (size_t d = outer.size(); d-- > 0;) {
        ao += outer[d].sa;
        bo += outer[d].sb;
        co += outer[d].sc;
        if (++ctr[d] < outer[d].size) break;
        ao -= outer[d].sa * outer[d].size;
        bo -= outer[d].sb * outer[d].size;
        co -= outer[d].sc * outer[d].size;
        ctr[d] = 0;
      }
    }
  }
};

}  // namespace

void install_matmul_kernels() {
  static CudaMatmulKernels kernels;
  register_device_kernels<detail::MatmulDeviceKernels>(DeviceType::cuda, &kernels);
}

}  // namespace tandem::cuda
