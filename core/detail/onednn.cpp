// bf16 GEMM through oneDNN (see core/detail/onednn.h).
#include "core/detail/onednn.h"

#include <cstdlib>
#include <cstring>

#include "core/detail/matmul.h"
#include "core/error.h"
#include "core/parallel.h"

#if TANDEM_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.hpp>
#include <memory>
#include <mutex>
#include <unordered_map>

// GNU OpenMP's team size, which oneDNN's parallel regions use (declared here: omp.h is the
// compiler's, and clang's differs).
extern "C" int omp_get_max_threads();
extern "C" void omp_set_num_threads(int);
#endif

namespace tandem::detail {

#if TANDEM_HAVE_ONEDNN

namespace {

bool cpu_has_bf16_gemm() {
  if (const char* env = std::getenv("TANDEM_ONEDNN"); env && std::strcmp(env, "0") == 0) return false;
  try {
    // The ISA values are nested bit sets: a CPU has an ISA when it has all of its bits. Without
    // AVX512_BF16 oneDNN would emulate bf16 and lose to the f32 sgemm route.
    const auto want = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & want) == want;
  } catch (const dnnl::error&) {
    return false;
  }
}

// One primitive per problem shape, per thread (a primitive descriptor costs tens of microseconds
// to create: more than a small GEMM). Bounded: a program with ever-new shapes starts over.
struct GemmKey {
  int64_t M, N, K, as0, as1, bs0, bs1, ldc;
  bool accumulate;
  bool operator==(const GemmKey&) const = default;
};
struct GemmKeyHash {
  size_t operator()(const GemmKey& k) const {
    size_t h = std::hash<bool>()(k.accumulate);
    for (int64_t v : {k.M, k.N, k.K, k.as0, k.as1, k.bs0, k.bs1, k.ldc})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};
struct Gemm {
  dnnl::memory::desc a, b, c;
  dnnl::matmul matmul;  // empty: no bf16 kernel for this problem (the portable route, without asking again)
};
std::mutex creation_mutex;  // see thread_gemms

struct ThreadGemms {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::unordered_map<GemmKey, Gemm, GemmKeyHash> primitives;
  // Released under the creation lock too, at the thread's exit.
  ~ThreadGemms() {
    std::lock_guard lock(creation_mutex);
    primitives.clear();
    stream = dnnl::stream();
    engine = dnnl::engine();
  }
};
constexpr size_t kMaxCachedPrimitives = 256;

// Engines and primitives are created through oneDNN's process-wide state (its primitive cache,
// whose lock and entries are set up lazily inside libdnnl, where ThreadSanitizer sees no
// synchronisation): one creation at a time, under a lock of ours. Creations are rare: an engine per
// thread, a primitive per shape per thread.

ThreadGemms& thread_gemms() {
  thread_local std::unique_ptr<ThreadGemms> gemms;
  if (!gemms) {
    std::lock_guard lock(creation_mutex);
    gemms = std::make_unique<ThreadGemms>();
  }
  return *gemms;
}

// The matmul is empty when oneDNN has only its reference (scalar) kernel or none for this problem.
Gemm make_gemm(const dnnl::engine& engine, const GemmKey& k) {
  std::lock_guard lock(creation_mutex);
  using dt = dnnl::memory::data_type;
  Gemm g;
  g.a = dnnl::memory::desc({k.M, k.K}, dt::bf16, dnnl::memory::dims{k.as0, k.as1});
  g.b = dnnl::memory::desc({k.K, k.N}, dt::bf16, dnnl::memory::dims{k.bs0, k.bs1});
  g.c = dnnl::memory::desc({k.M, k.N}, dt::bf16, dnnl::memory::dims{k.ldc, 1});
  dnnl::primitive_attr attr;
  if (k.accumulate) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);  // C += A·B, summed in f32 before C's one rounding
    attr.set_post_ops(ops);
  }
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g.a, g.b, g.c), attr, engine);
    if (std::strncmp(pd.impl_info_str(), "ref", 3) != 0) g.matmul = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
  }
  return g;
}

}  // namespace

bool onednn_bf16_available() {
  static const bool available = cpu_has_bf16_gemm();
  return available;
}

bool onednn_bf16_gemm(int64_t M, int64_t N, int64_t K, const BFloat16* a, int64_t as0, int64_t as1,
                      const BFloat16* b, int64_t bs0, int64_t bs1, BFloat16* c, int64_t ldc, bool accumulate,
                      const char* op) {
  if (!onednn_bf16_available() || M <= 0 || N <= 0 || K <= 0) return false;
  // oneDNN's fast kernels read plain layouts (one unit stride per operand), as BLAS does; the
  // layout blas_layout gives also settles size-1 dims' strides, so equal problems share a key.
  bool a_trans, b_trans;
  int64_t lda, ldb;
  if (!blas_layout(M, K, as0, as1, a_trans, lda) || !blas_layout(K, N, bs0, bs1, b_trans, ldb)) return false;
  const GemmKey key{M,
                    N,
                    K,
                    a_trans ? 1 : lda,
                    a_trans ? lda : 1,
                    b_trans ? 1 : ldb,
                    b_trans ? ldb : 1,
                    ldc,
                    accumulate};
  ThreadGemms& gemms = thread_gemms();
  auto it = gemms.primitives.find(key);
  if (it == gemms.primitives.end()) {
    if (gemms.primitives.size() >= kMaxCachedPrimitives) {
      std::lock_guard lock(creation_mutex);
      gemms.primitives.clear();
    }
    it = gemms.primitives.emplace(key, make_gemm(gemms.engine, key)).first;
  }
  const Gemm& gemm = it->second;
  if (!gemm.matmul) return false;
  // oneDNN's OpenMP regions use the calling thread's team size: Tandem's intra-op thread count.
  const int threads = intra_op_threads();
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  try {
    dnnl::memory am(gemm.a, gemms.engine, const_cast<BFloat16*>(a));
    dnnl::memory bm(gemm.b, gemms.engine, const_cast<BFloat16*>(b));
    dnnl::memory cm(gemm.c, gemms.engine, c);
    gemm.matmul.execute(gemms.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
    gemms.stream.wait();
  } catch (const dnnl::error& e) {
    fail("[{}] oneDNN's bf16 matmul failed for A {}x{} · B {}x{}: {} (status {})", op, M, K, K, N, e.what(),
                 static_cast<int>(e.status));
  }
  return true;
}

#else  // no oneDNN: always the portable route

bool onednn_bf16_available() { return false; }

bool onednn_bf16_gemm(int64_t, int64_t, int64_t, const BFloat16*, int64_t, int64_t, const BFloat16*, int64_t, int64_t,
                      BFloat16*, int64_t, bool, const char*) {
  return false;
}

#endif

}  // namespace tandem::detail
