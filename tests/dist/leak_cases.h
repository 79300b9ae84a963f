// Resource leaks across many constructions: DDP instances and sub-groups made and destroyed a
// thousand times must leave the process's thread count, open file descriptors and resident memory
// where they were. Shared by test_leaks (threads backend) and test_leaks_mpi (mpirun -np 2)
// through TANDEM_LEAK_CASES below.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "core/detail/sanitizers.h"
#include "ddp_cases.h"

namespace leak_cases {

using namespace tandem;
using namespace tandem::dist;
using ddp_cases::expect;

inline int entries_in(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n;
}

struct Resources {
  int threads = 0;
  int fds = 0;  // includes the one opendir holds while counting, on both sides of a comparison
  double rss_mib = 0;
};

inline Resources resources_now() {
  Resources r;
  r.threads = entries_in("/proc/self/task");
  r.fds = entries_in("/proc/self/fd");
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  r.rss_mib = static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
  return r;
}

// Threads that a destroyed group joined are gone at once; a detached one may take a moment.
inline Resources settled(const Resources& want) {
  Resources now = resources_now();
  for (int i = 0; i < 100 && (now.threads > want.threads || now.fds > want.fds); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    now = resources_now();
  }
  return now;
}

// Under ASan freed memory waits in a quarantine (256 MiB by default) and TSan keeps shadow and
// history for every allocation, so RSS grows there whatever the code does; LeakSanitizer checks
// for leaks in those builds instead, and the thread and descriptor counts still hold.
inline constexpr bool kUnderSanitizer = TANDEM_ASAN || TANDEM_TSAN;

// `iteration` runs `warm_up` times (caches, pools and lazily made threads fill up), then 1,000
// more between two snapshots taken on every rank with the ranks in step. RSS may move by a
// couple of MiB (allocator arenas), threads and descriptors not at all.
template <class Fn>
void expect_no_growth(ProcessGroup& g, const std::string& what, Fn&& iteration, int count = 1000, int warm_up = 50) {
  for (int i = 0; i < warm_up; ++i) iteration(i);
  g.barrier()->wait();
  const Resources before = resources_now();
  for (int i = 0; i < count; ++i) iteration(warm_up + i);
  g.barrier()->wait();
  const Resources after = settled(before);
  expect(after.threads <= before.threads, "{} (rank {}): {} threads before {} iterations, {} after", what, g.rank(),
         before.threads, count, after.threads);
  expect(after.fds <= before.fds, "{} (rank {}): {} open file descriptors before, {} after", what, g.rank(),
         before.fds, after.fds);
  if (!kUnderSanitizer)
    expect(after.rss_mib <= before.rss_mib + 4.0, "{} (rank {}): RSS {:.1f} MiB before {} iterations, {:.1f} after",
           what, g.rank(), before.rss_mib, count, after.rss_mib);
}

// A small model wrapped, trained one step and unwrapped, a thousand times.
inline void ddp_constructions(ProcessGroupPtr g) {
  manual_seed(1);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(8, 16));
  model->push_back(std::make_shared<nn::Tanh>());
  model->push_back(std::make_shared<nn::Linear>(16, 4));
  const Tensor x = ddp_cases::inputs(g->rank() * 4, 4, 8, f32);
  const Tensor y = ddp_cases::targets(g->rank() * 4, 4, 4, f32);
  expect_no_growth(*g, "DDP construction", [&](int) {
    DistributedDataParallel ddp(model, g);
    nn::mse_loss(ddp(x), y).backward();
    ddp.check_reducer_finalized();
    for (const Tensor& p : model->parameters()) p.set_grad(Tensor());
  });
}

// A sub-group of every rank, used once and dropped, a thousand times.
inline void subgroup_creations(ProcessGroupPtr g) {
  std::vector<int> all;
  for (int r = 0; r < g->size(); ++r) all.push_back(r);
  expect_no_growth(*g, "sub-group creation", [&](int i) {
    ProcessGroupPtr sub = g->new_group(all);
    Tensor t = full({4}, static_cast<double>(i));
    sub->allreduce(t)->wait();
    expect(t.to(f64).sum().item<double>() == 4.0 * i * g->size(), "sub-group {}: wrong allreduce", i);
  });
}

}  // namespace leak_cases

// X(name, fn): the cases both runners instantiate, named "leaks threads: <name>" in test_leaks
// (2 thread ranks) and "leaks mpi: <name>" in test_leaks_mpi.
#define TANDEM_LEAK_CASES(X)                                                   \
  X("1,000 DDP constructions and destructions", leak_cases::ddp_constructions) \
  X("1,000 sub-group creations", leak_cases::subgroup_creations)
