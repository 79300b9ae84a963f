// The intra-op thread count (see core/threads.h).
#include "core/threads.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <pthread.h>
#include <thread>

#include "core/error.h"

extern "C" void openblas_set_num_threads(int);

namespace tandem {

namespace {

int default_threads() {
  if (const char* env = std::getenv("TANDEM_NUM_THREADS")) {
    int n = std::atoi(env);
    if (n > 0) return n;
  }
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local = 1;
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE")) local = std::max(1, std::atoi(env));
  return std::max(1, cores / local);
}

std::once_flag threads_once;
std::atomic<int> num_threads{0};

// GNU OpenMP's pool does not survive fork(): the first parallel region of a child whose parent had
// run one waits for threads that were not copied. A forked child therefore drops to one thread (our
// loops, OpenBLAS, oneDNN) at its next kernel, as PyTorch does; set_num_threads may raise it again.
std::atomic<bool> forked_child{false};
void on_fork_child() { forked_child.store(true, std::memory_order_relaxed); }
[[maybe_unused]] const int fork_handler = pthread_atfork(nullptr, nullptr, on_fork_child);

}  // namespace

int get_num_threads() {
  if (forked_child.load(std::memory_order_relaxed)) [[unlikely]] {
    forked_child.store(false, std::memory_order_relaxed);
    set_num_threads(1);
  }
  std::call_once(threads_once, [] {
    if (num_threads.load() == 0) set_num_threads(default_threads());
  });
  return num_threads.load();
}

void set_num_threads(int n) {
  TANDEM_CHECK(n >= 1, "[set_num_threads] thread count must be >= 1, got {}", n);
  num_threads.store(n);
  openblas_set_num_threads(n);
}

}  // namespace tandem
