// Starting the dist layer: init() reads the launcher and creates the world group, backends beyond
// the built-in ones register here, and a few free functions run collectives on the world group.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "dist/process_group.h"

namespace tandem::dist {

struct InitOptions {
  // "auto": under mpirun/srun, nccl when this build has it and every rank of the node has a GPU,
  // else mpi (finding out loads the CUDA backend library where one was built; "mpi" never does);
  // without a launcher, a world of size 1 in this process. Or "mpi", "threads" (size 1 only),
  // "nccl".
  std::string backend = "auto";
  std::optional<Milliseconds> timeout;  // default: TANDEM_DIST_TIMEOUT or 300 s
  std::optional<bool> debug_checks;     // default: TANDEM_DIST_DEBUG=detail
  // nccl: Work::wait blocks the host until the collective has finished, instead of ordering the
  // caller's stream after it (PyTorch's TORCH_NCCL_BLOCKING_WAIT; for debugging). Default:
  // TANDEM_NCCL_BLOCKING_WAIT=1. A barrier's wait always blocks the host, as in PyTorch.
  std::optional<bool> nccl_blocking_wait;
};

struct WorldInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this node (MPI shared-memory split)
  int local_size = 1;
  std::string backend;
};

// Creates the world group (once; later calls return it and must ask for the same backend).
ProcessGroupPtr init(const InitOptions& options = {});
bool is_initialized();
ProcessGroupPtr world();  // the group init() created
WorldInfo world_info();
// Drops the world group and finalises MPI if Tandem initialised it (also done at exit). After a
// broken group, ends the job with MPI_Abort if a rank does not reach its exit (see mpi_finalize).
void finalize();

// True when the environment shows a launcher (Open MPI's mpirun, PMIx, Slurm's PMI).
bool launched_by_mpi();

// Backends beyond mpi and threads plug in here (the CUDA backend library registers "nccl" when it
// is loaded). `usable`, when given, tells "auto" whether this backend can serve the launched job
// (it must not throw); a backend without it is never picked by "auto".
using BackendFactory = std::function<ProcessGroupPtr(const InitOptions&)>;
void register_backend(const std::string& name, BackendFactory factory, std::function<bool()> usable = {});

// Collectives on the world group.
inline WorkPtr allreduce(const Tensor& t, ReduceOp op = ReduceOp::sum) { return world()->allreduce(t, op); }
inline WorkPtr broadcast(const Tensor& t, int root = 0) { return world()->broadcast(t, root); }
inline WorkPtr barrier() { return world()->barrier(); }

}  // namespace tandem::dist
