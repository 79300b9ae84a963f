// Intra-op parallelism for CPU kernels: parallel_for splits a loop over [0, n) into contiguous
// chunks run on get_num_threads() threads (GNU OpenMP's pool, the runtime PyTorch and oneDNN use
// on Linux, so the three share one set of threads instead of oversubscribing the cores).
//
// Chunks are decided from n, the grain and the thread count only, and each index is computed by
// exactly one chunk, so a kernel whose indices are independent (elementwise maps, optimizer
// updates, per-row softmax) gives the same bits at any thread count. Loops shorter than two grains
// run serially on the calling thread: tiny ops pay one comparison.
#pragma once

#include <cstdint>
#include <type_traits>
#include <utility>

namespace tandem {

// Whether parallel_for splits loops here: Tandem was built with OpenMP and the OpenBLAS loaded is
// not its pthread build (whose threads would contend with the pool: CMake prefers OpenBLAS's OpenMP
// build). When false every loop runs serially and only GEMMs use the threads.
bool intra_op_parallel();

// The threads the calling thread's loops use: get_num_threads(), capped for this thread by
// set_thread_intra_op_cap. dist::run_threads gives each of its n rank threads get_num_threads() / n
// (at least 1), so n ranks in one process do not each start a team of every core.
int intra_op_threads();
void set_thread_intra_op_cap(int n);  // 0 lifts the cap

// PyTorch's grain for elementwise loops: below 32768 elements a fork/join costs more than it saves.
constexpr int64_t kDefaultGrain = 32768;

// The grain, in units (rows, channels, planes), for a loop whose units hold elems_per_unit
// elements each: about kDefaultGrain elements per chunk, and at least one unit.
constexpr int64_t units_per_grain(int64_t elems_per_unit) {
  return elems_per_unit >= kDefaultGrain ? 1 : kDefaultGrain / (elems_per_unit > 0 ? elems_per_unit : 1);
}

namespace detail {
using ChunkFn = void (*)(void* body, int64_t begin, int64_t end);
// Runs fn(body, b, e) over chunks of [0, n), on the OpenMP pool when chunks > 1. An exception
// thrown by a chunk is rethrown on the calling thread after every chunk has finished.
void parallel_chunks(int64_t n, int chunks, ChunkFn fn, void* body);
int parallel_chunk_count(int64_t n, int64_t grain);
}  // namespace detail

// body(begin, end) for contiguous chunks covering [0, n), each at least `grain` long (except when
// n itself is shorter). Serial inside another parallel_for's chunk.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& body) {
  if (n <= 0) return;
  // Short loops (most ops of a small model) decide here, inline, and pay one comparison.
  const int chunks = n < 2 * grain ? 1 : detail::parallel_chunk_count(n, grain);
  if (chunks <= 1) {
    body(int64_t{0}, n);
    return;
  }
  using Body = std::remove_reference_t<F>;
  detail::parallel_chunks(
      n, chunks, [](void* b, int64_t begin, int64_t end) { (*static_cast<Body*>(b))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

}  // namespace tandem
