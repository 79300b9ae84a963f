#include "core/detail/matmul.h"

#include <cblas.h>

#include <climits>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/cpu/onednn.h"
#include "core/detail/checks.h"
#include "core/detail/copy.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/reduce.h"
#include "core/detail/wrapping.h"
#include "core/threads.h"

namespace tandem::detail {

bool blas_layout(int64_t rows, int64_t cols, int64_t s0, int64_t s1, bool& transposed, int64_t& ld) {
  // Size-1 dims have meaningless strides: normalise them first.
  const int64_t n0 = rows == 1 ? std::max<int64_t>(cols, 1) : s0;
  const int64_t n1 = cols == 1 ? 1 : s1;
  if (n1 == 1 && n0 >= std::max<int64_t>(cols, 1)) {
    transposed = false;
    ld = n0;
    return true;
  }
  const int64_t t0 = rows == 1 ? 1 : s0;
  const int64_t t1 = cols == 1 ? std::max<int64_t>(rows, 1) : s1;
  if (t0 == 1 && t1 >= std::max<int64_t>(rows, 1)) {
    transposed = true;
    ld = t1;
    return true;
  }
  return false;
}

namespace {

template <class D, class S>
void copy_matrix(D* dst, const S* src, int64_t rows, int64_t cols, int64_t s0, int64_t s1) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) dst[i * cols + j] = static_cast<D>(static_cast<acc_t<S>>(src[i * s0 + j * s1]));
}

void check_blas_size(int64_t v, const char* op) {
  TANDEM_CHECK(v <= INT_MAX, "[{}] a matrix dimension or stride of {} exceeds the BLAS limit {}", op, v, INT_MAX);
}

template <class T>
void blas_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t as0, int64_t as1, const T* b, int64_t bs0,
               int64_t bs1, T* c, int64_t ldc, bool accumulate, const char* op) {
  bool a_trans = false, b_trans = false;
  int64_t lda, ldb;
  std::vector<T> abuf, bbuf;
  if (!blas_layout(M, K, as0, as1, a_trans, lda)) {
    abuf.resize(M * K);
    copy_matrix(abuf.data(), a, M, K, as0, as1);
    a = abuf.data();
    a_trans = false;
    lda = K;
  }
  if (!blas_layout(K, N, bs0, bs1, b_trans, ldb)) {
    bbuf.resize(K * N);
    copy_matrix(bbuf.data(), b, K, N, bs0, bs1);
    b = bbuf.data();
    b_trans = false;
    ldb = N;
  }
  const CBLAS_TRANSPOSE ta = a_trans ? CblasTrans : CblasNoTrans, tb = b_trans ? CblasTrans : CblasNoTrans;
  for (int64_t v : {M, N, K, lda, ldb, ldc}) check_blas_size(v, op);
  const T beta = accumulate ? T(1) : T(0);
  // The first GEMM settles the intra-op thread count (TANDEM_NUM_THREADS, else the node's cores over
  // its ranks) into OpenBLAS, whose own default is every core: with two ranks on a node that would
  // be twice as many GEMM threads as cores. Later calls cost one atomic load.
  get_num_threads();
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, blasint(M), blasint(N), blasint(K), 1.0f, a, blasint(lda), b, blasint(ldb),
                beta, c, blasint(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, blasint(M), blasint(N), blasint(K), 1.0, a, blasint(lda), b, blasint(ldb),
                beta, c, blasint(ldc));
  }
}

// One M x K by K x N product into C (row stride ldc, unit column stride).
template <class T>
void gemm_one(int64_t M, int64_t N, int64_t K, const T* a, int64_t as0, int64_t as1, const T* b, int64_t bs0,
              int64_t bs1, T* c, int64_t ldc, bool accumulate, const char* op) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    if (!accumulate)
      for (int64_t i = 0; i < M; ++i) std::fill(c + i * ldc, c + i * ldc + N, T(0));
    return;
  }
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    if constexpr (std::is_same_v<T, float>)
      if (onednn_f32_gemm(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op)) return;
    blas_gemm(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op);
  } else if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    // bf16 natively where the CPU multiplies it (oneDNN, AVX512_BF16); both routes sum in f32
    // and round C once, so they differ only in the order of the f32 sums.
    if constexpr (std::is_same_v<T, BFloat16>)
      if (onednn_bf16_gemm(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op)) return;
    // Through f32: convert, one sgemm, round back once.
    std::vector<float> af(M * K), bf(K * N), cf(M * N);
    copy_matrix(af.data(), a, M, K, as0, as1);
    copy_matrix(bf.data(), b, K, N, bs0, bs1);
    if (accumulate) copy_matrix(cf.data(), c, M, N, ldc, 1);
    blas_gemm<float>(M, N, K, af.data(), K, 1, bf.data(), N, 1, cf.data(), N, accumulate, op);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) c[i * ldc + j] = T(cf[i * N + j]);
  } else {
    // Integers: i-k-j order keeps the inner loop on contiguous rows of B and C; products and sums
    // wrap (core/detail/wrapping.h).
    for (int64_t i = 0; i < M; ++i) {
      T* crow = c + i * ldc;
      if (!accumulate) std::fill(crow, crow + N, T(0));
      for (int64_t k = 0; k < K; ++k) {
        const T aik = a[i * as0 + k * as1];
        const T* brow = b + k * bs0;
        for (int64_t j = 0; j < N; ++j) crow[j] = wrapping_add(crow[j], wrapping_mul(aik, brow[j * bs1]));
      }
    }
  }
}

// True when the batch dims, walked from the innermost, continue an (inner_stride, inner_size)
// dim: then batch x inner is a single strided dim.
bool chains(const Shape& batch, const Strides& strides, int64_t inner_stride, int64_t inner_size) {
  int64_t expected = inner_stride * inner_size;
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= batch[d];
  }
  return true;
}

bool all_broadcast(const Shape& batch, const Strides& strides) {
  for (size_t d = 0; d < batch.size(); ++d)
    if (batch[d] != 1 && strides[d] != 0) return false;
  return true;
}

// The operands of a matmul with PyTorch's 1-D promotion: a [K] acts as [1, K], b [K] as [K, 1].
struct MatmulGeometry {
  Shape batch;
  int64_t M = 1, N = 1, K = 1;
  MatOperand a, b;
  Shape out_shape;
  Strides out_batch_strides;  // contiguous output, batch dims then M, N
};

void check_pair(const Tensor& a, const Tensor& b, const char* op) {
  TANDEM_CHECK(a.defined() && b.defined(), "[{}] got an undefined tensor", op);
  check_same_device(op, {{"a", a}, {"b", b}});
  TANDEM_CHECK(a.dtype() == b.dtype(), "[{}] dtypes differ: a is {}, b is {} (convert one with .to())", op, a.dtype(),
               b.dtype());
  TANDEM_CHECK(a.dtype() != boolean, "[{}] bool tensors are not supported (shapes {} and {})", op, a.shape(),
               b.shape());
}

// batch strides of t's leading (rank - 2) dims aligned with `batch` (0 where broadcast).
Strides batch_strides_of(const Tensor& t, const Shape& batch) {
  Strides out(batch.size(), 0);
  const int64_t tb = t.dim() - 2;
  const size_t lead = batch.size() - static_cast<size_t>(std::max<int64_t>(tb, 0));
  for (int64_t i = 0; i < tb; ++i)
    if (t.size(i) != 1) out[lead + i] = t.stride(i);
  return out;
}

// A row or column dim of size 1 addresses nothing through its stride, so any value is valid for
// it. Taking the innermost batch stride there lets fold_batch fold the batch into that dim, as it
// does for a dense operand, whatever stride a view (t(), narrow(), unsqueeze()) left on it.
void settle_unit_strides(MatOperand& x, const Shape& batch, int64_t rows, int64_t cols) {
  for (size_t d = batch.size(); d-- > 0;) {
    if (batch[d] == 1) continue;
    if (rows == 1) x.s0 = x.batch_strides[d];
    if (cols == 1) x.s1 = x.batch_strides[d];
    return;
  }
}

MatmulGeometry matmul_geometry(const Tensor& a, const Tensor& b, const char* op) {
  check_pair(a, b, op);
  TANDEM_CHECK(a.dim() >= 1 && b.dim() >= 1, "[{}] both arguments need at least 1 dim, got a {} and b {}", op,
               a.shape(), b.shape());
  MatmulGeometry g;
  const int64_t ka = a.size(-1);
  const int64_t kb = b.dim() == 1 ? b.size(0) : b.size(-2);
  TANDEM_CHECK(ka == kb, "[{}] inner dimensions differ: a is {}, b is {}", op, a.shape(), b.shape());
  g.K = ka;
  g.M = a.dim() == 1 ? 1 : a.size(-2);
  g.N = b.dim() == 1 ? 1 : b.size(-1);
  // Batch dims broadcast as in NumPy.
  const int64_t ba = std::max<int64_t>(a.dim() - 2, 0), bb = std::max<int64_t>(b.dim() - 2, 0);
  const int64_t nb = std::max(ba, bb);
  g.batch = Shape(static_cast<size_t>(nb), 1);
  for (int64_t i = 0; i < nb; ++i) {
    int64_t da = i < nb - ba ? 1 : a.size(i - (nb - ba));
    int64_t db = i < nb - bb ? 1 : b.size(i - (nb - bb));
    TANDEM_CHECK(da == db || da == 1 || db == 1, "[{}] batch dimensions cannot be broadcast: a is {}, b is {}", op,
                 a.shape(), b.shape());
    g.batch[i] = da == 1 ? db : da;
  }
  g.a.data = a.data_ptr();
  g.a.batch_strides = batch_strides_of(a, g.batch);
  g.a.s0 = a.dim() == 1 ? g.K * a.stride(0) : a.stride(-2);
  g.a.s1 = a.stride(-1);
  g.b.data = b.data_ptr();
  g.b.batch_strides = batch_strides_of(b, g.batch);
  g.b.s0 = b.dim() == 1 ? b.stride(0) : b.stride(-2);
  g.b.s1 = b.dim() == 1 ? 1 : b.stride(-1);
  settle_unit_strides(g.a, g.batch, g.M, g.K);
  settle_unit_strides(g.b, g.batch, g.K, g.N);
  g.out_shape = g.batch;
  if (a.dim() > 1) g.out_shape.push_back(g.M);
  if (b.dim() > 1) g.out_shape.push_back(g.N);
  Shape full = g.batch;
  full.push_back(g.M);
  full.push_back(g.N);
  Strides cs = contiguous_strides(full);
  g.out_batch_strides = Strides(std::vector<int64_t>(cs.begin(), cs.begin() + nb));
  return g;
}

// Contiguous strides of `shape` (a [batch..., R, C] gradient buffer) restricted to its batch dims,
// aligned with `batch`; 0 where shape broadcast (size 1 or absent), so the GEMM sums into it.
Strides reducing_batch_strides(const Shape& shape, int64_t rank_without_batch, const Shape& batch) {
  Strides cs = contiguous_strides(shape);
  const int64_t tb = static_cast<int64_t>(shape.size()) - rank_without_batch;
  Strides out(batch.size(), 0);
  const size_t lead = batch.size() - static_cast<size_t>(tb);
  for (int64_t i = 0; i < tb; ++i)
    if (shape[i] == batch[lead + i] && shape[i] != 1) out[lead + i] = cs[i];
  return out;
}

// Rows of t (rank >= 1) with every leading dim folded into them: the row stride, or false when
// the leading dims do not fold without a copy. The leading dims are walked innermost first and
// size-1 dims are skipped, since their strides are arbitrary (views give them any value and
// is_contiguous() ignores them), so every tensor is_contiguous() accepts folds.
bool fold_rows(const Tensor& t, int64_t& s0) {
  if (t.numel() == 0) {  // no row is addressed, and an empty tensor's strides may be anything
    s0 = std::max<int64_t>(t.size(-1), 1);
    return true;
  }
  bool have_rows = false;
  int64_t expected = 0;
  for (int64_t d = t.dim() - 2; d >= 0; --d) {
    const int64_t n = t.size(d);
    if (n == 1) continue;
    if (!have_rows) {
      s0 = t.stride(d);
      have_rows = true;
    } else if (t.stride(d) != expected) {
      return false;
    }
    expected = t.stride(d) * n;
  }
  // At most one row: its stride addresses nothing; the dense row length keeps BLAS's ld valid.
  if (!have_rows) s0 = std::max<int64_t>(t.size(-1), 1);
  return true;
}

// t with its leading dims folded into rows of stride s0, copied first when they do not fold.
Tensor folded_rows(const Tensor& t, int64_t& s0, const char* op) {
  if (fold_rows(t, s0)) return t;
  Tensor c = materialize(t, op);
  TANDEM_CHECK(fold_rows(c, s0), "[{}] internal: the contiguous copy of a tensor of shape {} (strides {}) has strides {} "
               "that do not fold into rows", op, t.shape(), t.strides(), c.strides());
  return c;
}

// Saturates at INT64_MAX: an empty tensor's leading sizes may multiply past it (the result's
// allocation then names the overflow, unless the result is empty too).
int64_t leading_numel(const Tensor& t) {
  int64_t n = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i)
    if (__builtin_mul_overflow(n, t.size(i), &n)) return INT64_MAX;
  return n;
}

}  // namespace

bool sums_over_batch(const Shape& batch, const Strides& c_batch_strides) {
  for (size_t d = 0; d < batch.size(); ++d)
    if (batch[d] != 1 && c_batch_strides[d] == 0) return true;
  return false;
}

BatchFold fold_batch(const Shape& batch, int64_t M, int64_t N, int64_t K, const MatOperand& a, const MatOperand& b,
                     const Strides& c_batch_strides) {
  // B shared by the whole batch, A's and C's batch dims continuing their rows: M * nb rows.
  if (!sums_over_batch(batch, c_batch_strides) && all_broadcast(batch, b.batch_strides) &&
      chains(batch, a.batch_strides, a.s0, M) && chains(batch, c_batch_strides, N, M))
    return BatchFold::into_rows;
  // C summed over the whole batch (weight gradients), A's and B's batch dims continuing the
  // contraction: K * nb terms.
  if (all_broadcast(batch, c_batch_strides) && chains(batch, a.batch_strides, a.s1, K) &&
      chains(batch, b.batch_strides, b.s0, K))
    return BatchFold::into_contraction;
  return BatchFold::none;
}

void batched_gemm(Device device, Dtype dtype, const Shape& batch, int64_t M, int64_t N, int64_t K,
                  const MatOperand& a, const MatOperand& b, void* c, const Strides& c_batch_strides, int64_t c_numel,
                  bool accumulate, const char* op) {
  if (!device.is_cpu()) {
    device_kernels<MatmulDeviceKernels>(device, op)
        .batched_gemm(device, dtype, batch, M, N, K, a, b, c, c_batch_strides, c_numel, accumulate, op);
    return;
  }
  const int64_t nb = numel_of(batch);
  if (M == 0 || N == 0) return;
  if (nb == 0 || K == 0) {
    // An empty sum: zeros. A and B hold no element, so their strides are not looked at (an empty
    // tensor's may be near INT64_MAX: the address rule, core/shape.h). All-zero bits are 0 in
    // every dtype.
    if (!accumulate && c_numel > 0) std::memset(c, 0, static_cast<size_t>(c_numel) * itemsize(dtype));
    return;
  }
  const bool c_reduces = sums_over_batch(batch, c_batch_strides);
  const BatchFold fold = fold_batch(batch, M, N, K, a, b, c_batch_strides);
  TANDEM_DISPATCH_NUMERIC(dtype, op, [&] {
    using T = scalar_t;
    const T* A = static_cast<const T*>(a.data);
    const T* B = static_cast<const T*>(b.data);
    T* C = static_cast<T*>(c);
    if (fold == BatchFold::into_rows) {
      gemm_one<T>(M * nb, N, K, A, a.s0, a.s1, B, b.s0, b.s1, C, N, accumulate, op);
      return;
    }
    if (fold == BatchFold::into_contraction) {
      gemm_one<T>(M, N, K * nb, A, a.s0, a.s1, B, b.s0, b.s1, C, N, accumulate, op);
      return;
    }
    bool acc = accumulate;
    if (c_reduces && !accumulate) {
      std::fill(C, C + c_numel, T(0));
      acc = true;
    }
    const size_t nd = batch.size();
    std::vector<int64_t> ctr(nd, 0);
    int64_t ao = 0, bo = 0, co = 0;
    for (int64_t i = 0; i < nb; ++i) {
      gemm_one<T>(M, N, K, A + ao, a.s0, a.s1, B + bo, b.s0, b.s1, C + co, N, acc, op);
      for (size_t d = nd; d-- > 0;) {
        ao += a.batch_strides[d];
        bo += b.batch_strides[d];
        co += c_batch_strides[d];
        if (++ctr[d] < batch[d]) break;
        ao -= a.batch_strides[d] * batch[d];
        bo -= b.batch_strides[d] * batch[d];
        co -= c_batch_strides[d] * batch[d];
        ctr[d] = 0;
      }
    }
  });
}

Tensor matmul_kernel(const Tensor& a, const Tensor& b, const char* op) {
  MatmulGeometry g = matmul_geometry(a, b, op);
  Tensor out = make_empty(g.out_shape, a.dtype(), a.device(), op);
  batched_gemm(a.device(), a.dtype(), g.batch, g.M, g.N, g.K, g.a, g.b, out.data_ptr(), g.out_batch_strides,
               out.numel(), false, op);
  return out;
}

Tensor mm_kernel(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), "[mm] got an undefined tensor");
  TANDEM_CHECK(a.dim() == 2, "[mm] a must be 2-D, got shape {}", a.shape());
  TANDEM_CHECK(b.dim() == 2, "[mm] b must be 2-D, got shape {}", b.shape());
  return matmul_kernel(a, b, "mm");
}

Tensor bmm_kernel(const Tensor& a, const Tensor& b) {
  TANDEM_CHECK(a.defined() && b.defined(), "[bmm] got an undefined tensor");
  TANDEM_CHECK(a.dim() == 3, "[bmm] a must be 3-D, got shape {}", a.shape());
  TANDEM_CHECK(b.dim() == 3, "[bmm] b must be 3-D, got shape {}", b.shape());
  TANDEM_CHECK(a.size(0) == b.size(0), "[bmm] batch sizes differ: a is {}, b is {}", a.shape(), b.shape());
  return matmul_kernel(a, b, "bmm");
}

Tensor linear_kernel(const Tensor& x_in, const Tensor& weight, const Tensor& bias) {
  const char* op = "linear";
  check_pair(x_in, weight, op);
  TANDEM_CHECK(weight.dim() == 2, "[linear] weight must be 2-D [out_features, in_features], got shape {}",
               weight.shape());
  TANDEM_CHECK(x_in.dim() >= 1, "[linear] input must have at least 1 dim, got shape {}", x_in.shape());
  const int64_t in = weight.size(1), out_f = weight.size(0);
  TANDEM_CHECK(x_in.size(-1) == in, "[linear] input has {} features (shape {}) but weight {} expects {}",
               x_in.size(-1), x_in.shape(), weight.shape(), in);
  if (bias.defined()) {
    TANDEM_CHECK(bias.dtype() == x_in.dtype(), "[linear] bias has dtype {} but input has {}", bias.dtype(),
                 x_in.dtype());
    check_same_device(op, {{"input", x_in}, {"bias", bias}});
    TANDEM_CHECK(bias.dim() == 1 && bias.size(0) == out_f, "[linear] bias must have shape [{}], got {}", out_f,
                 bias.shape());
  }
  int64_t xs0;
  const Tensor x = folded_rows(x_in, xs0, op);
  const int64_t rows = leading_numel(x);
  Shape out_shape(std::vector<int64_t>(x.shape().begin(), x.shape().end() - 1));
  out_shape.push_back(out_f);
  Tensor out = make_empty(out_shape, x.dtype(), x.device(), op);
  if (bias.defined() && rows > 0 && !out.is_cpu()) {
    detail::copy(out, bias, op);  // broadcast over the rows; the GEMM then adds x W^T with beta = 1
  } else if (bias.defined() && rows > 0) {
    // Pre-fill every row with the bias; the GEMM then adds x W^T with beta = 1.
    TANDEM_DISPATCH_NUMERIC(x.dtype(), op, [&] {
      using T = scalar_t;
      T* o = static_cast<T*>(out.data_ptr());
      const T* bp = static_cast<const T*>(bias.data_ptr());
      const int64_t bs = bias.stride(0);
      for (int64_t j = 0; j < out_f; ++j) o[j] = bp[j * bs];
      for (int64_t r = 1; r < rows; ++r) std::memcpy(o + r * out_f, o, out_f * sizeof(T));
    });
  }
  MatOperand xa{x.data_ptr(), {}, xs0, x.stride(-1)};
  MatOperand wt{weight.data_ptr(), {}, weight.stride(1), weight.stride(0)};  // W^T, no copy
  batched_gemm(x.device(), x.dtype(), {}, rows, out_f, in, xa, wt, out.data_ptr(), {}, out.numel(), bias.defined(),
               op);
  return out;
}

Tensor addmm_kernel(const Tensor& bias, const Tensor& a, const Tensor& b) {
  const char* op = "addmm";
  check_pair(a, b, op);
  TANDEM_CHECK(bias.defined(), "[addmm] bias is an undefined tensor");
  TANDEM_CHECK(a.dim() == 2, "[addmm] a must be 2-D, got shape {}", a.shape());
  TANDEM_CHECK(b.dim() == 2, "[addmm] b must be 2-D, got shape {}", b.shape());
  TANDEM_CHECK(a.size(1) == b.size(0), "[addmm] inner dimensions differ: a is {}, b is {}", a.shape(), b.shape());
  TANDEM_CHECK(bias.dtype() == a.dtype(), "[addmm] bias has dtype {} but a and b have {}", bias.dtype(), a.dtype());
  check_same_device(op, {{"bias", bias}, {"a", a}, {"b", b}});
  Shape out_shape{a.size(0), b.size(1)};
  TANDEM_CHECK(bias.dim() <= 2 && broadcast_shapes(bias.shape(), out_shape, op) == out_shape,
               "[addmm] bias of shape {} cannot be broadcast to the result shape {}", bias.shape(), out_shape);
  Tensor out = make_empty(out_shape, a.dtype(), a.device(), op);
  strided_copy(out, bias, op);  // bias broadcast; the GEMM adds a b to it (beta = 1)
  MatOperand A{a.data_ptr(), {}, a.stride(0), a.stride(1)};
  MatOperand B{b.data_ptr(), {}, b.stride(0), b.stride(1)};
  batched_gemm(a.device(), a.dtype(), {}, a.size(0), b.size(1), a.size(1), A, B, out.data_ptr(), {}, out.numel(), true,
               op);
  return out;
}

std::array<Tensor, 2> matmul_backward(const Tensor& grad, const Tensor& a, const Tensor& b, bool need_a, bool need_b) {
  const char* op = "matmul_backward";
  MatmulGeometry geo = matmul_geometry(a, b, op);
  TANDEM_CHECK(grad.shape() == geo.out_shape, "[{}] gradient has shape {}, expected {}", op, grad.shape(),
               geo.out_shape);
  TANDEM_CHECK(grad.dtype() == a.dtype(), "[{}] gradient has dtype {}, expected {}", op, grad.dtype(), a.dtype());
  check_same_device(op, {{"gradient", grad}, {"a", a}, {"b", b}});
  // The gradient as [batch..., M, N], with the same 1-D promotion as the forward.
  const size_t nb = geo.batch.size();
  MatOperand g{grad.data_ptr(), Strides(std::vector<int64_t>(grad.strides().begin(), grad.strides().begin() + nb)),
               a.dim() > 1 ? grad.stride(nb) : 0, b.dim() > 1 ? grad.strides().back() : 0};
  settle_unit_strides(g, geo.batch, geo.M, geo.N);
  std::array<Tensor, 2> out;
  if (need_a) {
    // grad_a = g b^T: [M, N] x [N, K]
    Tensor ga = make_empty(a.shape(), a.dtype(), a.device(), op);
    Strides cb = a.dim() == 1 ? Strides(nb, 0) : reducing_batch_strides(a.shape(), 2, geo.batch);
    batched_gemm(a.device(), a.dtype(), geo.batch, geo.M, geo.K, geo.N, g, geo.b.transposed(), ga.data_ptr(), cb,
                 ga.numel(), false, op);
    out[0] = ga;
  }
  if (need_b) {
    // grad_b = a^T g: [K, M] x [M, N]
    Tensor gb = make_empty(b.shape(), b.dtype(), b.device(), op);
    Strides cb = b.dim() == 1 ? Strides(nb, 0) : reducing_batch_strides(b.shape(), 2, geo.batch);
    batched_gemm(b.device(), b.dtype(), geo.batch, geo.K, geo.N, geo.M, geo.a.transposed(), g, gb.data_ptr(), cb,
                 gb.numel(), false, op);
    out[1] = gb;
  }
  return out;
}

std::array<Tensor, 3> linear_backward(const Tensor& grad, const Tensor& x_in, const Tensor& weight, bool need_x,
                                      bool need_w, bool need_b) {
  const char* op = "linear_backward";
  TANDEM_CHECK(grad.defined(), "[{}] got an undefined gradient", op);
  check_same_device(op, {{"gradient", grad}, {"input", x_in}, {"weight", weight}});
  const int64_t in = weight.size(1), out_f = weight.size(0);
  int64_t gs0;
  const Tensor g = folded_rows(grad, gs0, op);
  const int64_t rows = leading_numel(g);
  MatOperand ga{g.data_ptr(), {}, gs0, g.stride(-1)};
  std::array<Tensor, 3> out;
  if (need_x) {
    // grad_x = g W: [rows, out] x [out, in]
    Tensor gx = make_empty(x_in.shape(), x_in.dtype(), x_in.device(), op);
    MatOperand w{weight.data_ptr(), {}, weight.stride(0), weight.stride(1)};
    batched_gemm(g.device(), g.dtype(), {}, rows, in, out_f, ga, w, gx.data_ptr(), {}, gx.numel(), false, op);
    out[0] = gx;
  }
  if (need_w) {
    // grad_W = g^T x: [out, rows] x [rows, in], one GEMM whatever the leading dims.
    int64_t xs0;
    const Tensor x = folded_rows(x_in, xs0, op);
    Tensor gw = make_empty(weight.shape(), weight.dtype(), weight.device(), op);
    MatOperand xa{x.data_ptr(), {}, xs0, x.stride(-1)};
    batched_gemm(g.device(), g.dtype(), {}, out_f, in, rows, ga.transposed(), xa, gw.data_ptr(), {}, gw.numel(), false,
                 op);
    out[1] = gw;
  }
  if (need_b) {
    Tensor g2 = make_view(g, Shape{rows, out_f}, Strides{gs0, g.stride(-1)}, g.storage_offset());
    out[2] = sum_kernel(g2, plan_reduction(g2, Shape{0}, false, op));
  }
  return out;
}

template <class T>
void host_gemm(int64_t M, int64_t N, int64_t K, const T* a, int64_t as0, int64_t as1, const T* b, int64_t bs0,
               int64_t bs1, T* c, int64_t ldc, bool accumulate, const char* op) {
  gemm_one(M, N, K, a, as0, as1, b, bs0, bs1, c, ldc, accumulate, op);
}
template void host_gemm<float>(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t,
                               int64_t, float*, int64_t, bool, const char*);
template void host_gemm<double>(int64_t, int64_t, int64_t, const double*, int64_t, int64_t, const double*, int64_t,
                                int64_t, double*, int64_t, bool, const char*);

}  // namespace tandem::detail
