// The threads backend: N ranks as threads of one process, for tests of autograd plus
// communication. Semantics and errors are those of the mpi backend; in addition it always checks
// that every rank called the same collective with matching dtypes, shapes and splits (it has to:
// ranks read each other's memory), and a timeout names exactly the ranks that did not arrive.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "dist/process_group.h"

namespace tandem::dist {

struct ThreadsOptions {
  std::optional<Milliseconds> timeout;  // default: TANDEM_DIST_TIMEOUT or 300 s
  std::optional<bool> debug_checks;     // default: TANDEM_DIST_DEBUG=detail
};

// The world groups of n ranks living in this process: element r is rank r's group. Each group
// must be used from its own thread (collectives block only in Work::wait, but every rank has to
// issue its collectives for them to complete).
std::vector<ProcessGroupPtr> make_thread_world(int n, const ThreadsOptions& options = {});

// Runs fn(rank's group) on n threads, one per rank, and returns when all are done. When a rank
// throws, the others' pending collectives fail at once ("rank 2 failed: ...") instead of waiting
// for the timeout, and the first exception thrown is rethrown here.
void run_threads(int n, const std::function<void(ProcessGroup&)>& fn, const ThreadsOptions& options = {});

}  // namespace tandem::dist
