// parallel_for's pool (see core/parallel.h).
#include "core/parallel.h"

#include <algorithm>
#include <exception>
#include <mutex>

#include "core/threads.h"

#if TANDEM_HAVE_OPENMP
// GNU OpenMP's entry points (declared here rather than through the compiler's omp.h).
extern "C" int omp_in_parallel();
extern "C" int omp_get_thread_num();
extern "C" int omp_get_num_threads();
extern "C" void omp_set_num_threads(int);
#endif

// 0: OpenBLAS is sequential, 1: it runs its own pthreads, 2: it runs on OpenMP.
extern "C" int openblas_get_parallel();

namespace tandem::detail {

namespace {

// Beside OpenBLAS's pthread build, two pools would share the cores: its threads yield-spin after
// each GEMM while ours spin after each loop, and an MLP step on two threads took 10 ms against 1.7
// with one pool. Then Tandem's kernels stay serial and only the GEMMs use the threads (CMake links
// OpenBLAS's OpenMP build when it is installed: tools/ci/deps.sh installs it).
bool shares_blas_pool() {
  static const bool shares = openblas_get_parallel() != 1;
  return shares;
}

thread_local int thread_cap = 0;  // set_thread_intra_op_cap's, for this thread; 0: none

}  // namespace

int parallel_chunk_count(int64_t n, int64_t grain) {
  const int64_t g = std::max<int64_t>(grain, 1);
  if (n < 2 * g) return 1;
#if TANDEM_HAVE_OPENMP
  // Nested: the outer loop already uses the threads.
  if (omp_in_parallel() || !shares_blas_pool()) return 1;
  return static_cast<int>(std::min<int64_t>(intra_op_threads(), n / g));
#else
  return 1;
#endif
}

void parallel_chunks(int64_t n, int chunks, ChunkFn fn, void* body) {
#if TANDEM_HAVE_OPENMP
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(chunks)
  {
    // The team may be smaller than asked (OMP_THREAD_LIMIT): chunks follow the team's size.
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    const int64_t begin = n * t / team, end = n * (t + 1) / team;
    try {
      if (begin < end) fn(body, begin, end);
    } catch (...) {
      std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
#else
  (void)chunks;
  fn(body, 0, n);
#endif
}

}  // namespace tandem::detail

namespace tandem {

int intra_op_threads() {
  const int n = get_num_threads();
  return detail::thread_cap > 0 ? std::min(n, detail::thread_cap) : n;
}

void set_thread_intra_op_cap(int n) {
  detail::thread_cap = std::max(n, 0);
#if TANDEM_HAVE_OPENMP
  // OpenBLAS's OpenMP build sizes its GEMM teams by the calling thread's OpenMP setting.
  omp_set_num_threads(intra_op_threads());
#endif
}

bool intra_op_parallel() {
#if TANDEM_HAVE_OPENMP
  return detail::shares_blas_pool();
#else
  return false;
#endif
}

}  // namespace tandem
