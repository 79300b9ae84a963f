#include "dist/init.h"

#include <cstdlib>
#include <map>
#include <mutex>

#include "core/backend.h"
#include "dist/mpi/mpi.h"
#include "dist/threads/threads.h"

namespace tandem::dist {

namespace {
struct Registered {
  BackendFactory make;
  std::function<bool()> usable;
};
struct State {
  std::mutex mutex;
  ProcessGroupPtr world;
  WorldInfo info;
  std::map<std::string, Registered> factories;
};
State& state() {
  static State* s = new State();  // outlives static destruction: groups may be freed late
  return *s;
}

// The nccl backend lives in the CUDA backend library, which registers it when core loads that
// library. Called without the state's lock held: the library's entry point registers through it.
void load_cuda_backend_library() { (void)has_backend(DeviceType::cuda); }

// "auto" under a launcher: nccl when it is registered and a device is usable here for every rank
// of the node (CPU tensors on an nccl group go over its MPI companion), else mpi.
bool auto_picks_nccl(const State& s) {
  auto it = s.factories.find("nccl");
  return it != s.factories.end() && it->second.usable && it->second.usable();
}

ProcessGroupPtr make_local_world(const InitOptions& o) {
  ThreadsOptions t;
  t.timeout = o.timeout;
  t.debug_checks = o.debug_checks;
  return make_thread_world(1, t)[0];
}
}  // namespace

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

void register_backend(const std::string& name, BackendFactory factory, std::function<bool()> usable) {
  TANDEM_CHECK(name != "mpi" && name != "threads" && name != "auto", "[dist] backend '{}' is built in", name);
  TANDEM_CHECK(factory != nullptr, "[dist] register_backend('{}'): no factory", name);
  std::lock_guard lock(state().mutex);
  state().factories[name] = {std::move(factory), std::move(usable)};
}

ProcessGroupPtr init(const InitOptions& options) {
  State& s = state();
  if (options.backend == "nccl" || (options.backend == "auto" && launched_by_mpi())) load_cuda_backend_library();
  std::lock_guard lock(s.mutex);
  std::string backend = options.backend;
  if (backend == "auto") {
    if (!launched_by_mpi()) {
      backend = "threads";
    } else {
      backend = auto_picks_nccl(s) ? "nccl" : "mpi";
    }
  }
  if (s.world) {
    TANDEM_CHECK(options.backend == "auto" || s.info.backend == backend,
                 "[dist] init: already initialised with backend {}, asked for {}", s.info.backend, backend);
    return s.world;
  }
  WorldInfo info;
  ProcessGroupPtr group;
  if (backend == "mpi") {
    MpiInfo m = mpi_info();
    group = make_mpi_world(options.timeout, options.debug_checks);
    info = {m.rank, m.size, m.local_rank, m.local_size, "mpi"};
  } else if (backend == "threads") {
    TANDEM_CHECK(!launched_by_mpi() || std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr ||
                     std::string(std::getenv("OMPI_COMM_WORLD_SIZE")) == "1",
                 "[dist] the threads backend keeps every rank in one process; under mpirun use backend mpi (or "
                 "dist::run_threads for ranks as threads)");
    group = make_local_world(options);
    info = {0, 1, 0, 1, "threads"};
  } else {
    auto it = s.factories.find(backend);
    if (it == s.factories.end()) {
      if (backend == "nccl") {
        const std::string why = backend_unavailable_reason(DeviceType::cuda);
        fail("[dist] the nccl backend needs a CUDA build with NCCL ({}); use backend mpi",
             why.empty() ? "this tandem's CUDA backend was built without NCCL" : why);
      }
      fail("[dist] unknown backend '{}' (available: auto, mpi, threads{})", backend,
           s.factories.empty() ? "" : ", registered ones");
    }
    group = it->second.make(options);
    TANDEM_CHECK(group != nullptr, "[dist] backend '{}' created no group", backend);
    info = {group->rank(), group->size(), 0, 1, backend};
    if (launched_by_mpi()) {
      MpiInfo m = mpi_info();
      info.local_rank = m.local_rank;
      info.local_size = m.local_size;
    }
  }
  s.world = group;
  s.info = info;
  return group;
}

bool is_initialized() {
  std::lock_guard lock(state().mutex);
  return state().world != nullptr;
}

ProcessGroupPtr world() {
  std::lock_guard lock(state().mutex);
  TANDEM_CHECK(state().world != nullptr, "[dist] no world group: call dist::init() first");
  return state().world;
}

WorldInfo world_info() {
  std::lock_guard lock(state().mutex);
  TANDEM_CHECK(state().world != nullptr, "[dist] no world group: call dist::init() first");
  return state().info;
}

void finalize() {
  ProcessGroupPtr world;
  {
    std::lock_guard lock(state().mutex);
    world.swap(state().world);
  }
  world.reset();
  mpi_finalize();
}

}  // namespace tandem::dist
