#include "dist/mpi/detail/runtime.h"

#include <memory>
#include <mutex>
#include <vector>

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/threads.h"

#include "dist/detail/flight_recorder.h"
#include "dist/detail/reduce_kernels.h"
#include "dist/mpi/detail/peer_responder.h"

namespace tandem::dist {

void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) [[likely]] return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  const std::string mpi_text(text, static_cast<size_t>(len));
  throw MpiError(fmt::format("[mpi] {} failed: {} ({}:{})", call, mpi_text, file, line), mpi_text);
}

MpiRuntime& mpi_runtime() {
  static MpiRuntime* r = new MpiRuntime();
  return *r;
}

void keep_forever(std::shared_ptr<void> what) {
  static std::mutex mu;
  static auto* kept = new std::vector<std::shared_ptr<void>>();  // never destroyed, on purpose
  std::lock_guard lock(mu);
  kept->push_back(std::move(what));
}

void ensure_mpi_initialized() {
  MpiRuntime& rt = mpi_runtime();
  std::lock_guard lock(rt.init_mutex);
  TANDEM_CHECK(!rt.finalized, "[mpi] MPI was already finalised (dist::finalize or program exit)");
  if (rt.initialized) return;
  int already = 0;
  TANDEM_MPI_CHECK(MPI_Initialized(&already));
  int provided = 0;
  if (already) {
    TANDEM_MPI_CHECK(MPI_Query_thread(&provided));
  } else {
    TANDEM_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    rt.we_initialized = true;
    std::atexit(mpi_finalize);
  }
  TANDEM_CHECK(provided >= MPI_THREAD_SERIALIZED,
               "[mpi] the MPI library provides thread level {} but Tandem's communication threads need "
               "MPI_THREAD_SERIALIZED ({}) or MPI_THREAD_MULTIPLE ({})", provided, MPI_THREAD_SERIALIZED,
               MPI_THREAD_MULTIPLE);
  rt.serialized = provided < MPI_THREAD_MULTIPLE;
  TANDEM_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  MpiInfo& info = rt.info;
  info.thread_level = provided;
  TANDEM_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &info.rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &info.size));
  MPI_Comm node = MPI_COMM_NULL;
  TANDEM_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, info.rank, MPI_INFO_NULL, &node));
  TANDEM_MPI_CHECK(MPI_Comm_rank(node, &info.local_rank));
  TANDEM_MPI_CHECK(MPI_Comm_size(node, &info.local_size));
  TANDEM_MPI_CHECK(MPI_Comm_free(&node));
  if (rt.we_initialized) {
    // Made now, while every rank is here: at exit a collective that creates it could block.
    TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &rt.exit_comm));  // inherits MPI_ERRORS_RETURN
    // Only where MPI takes calls from any thread at any time: under SERIALIZED the responder's
    // polls would have to share the lock with calls that block (a communicator's creation).
    if (info.size > 1 && !rt.serialized) {
      TANDEM_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &rt.probe_comm));
      start_peer_responder(rt.probe_comm);
    }
  }
  set_flight_process_rank(info.rank);
  rt.initialized = true;
}

bool mpi_caller_progress() {
  static const bool caller = [] {
    const char* env = std::getenv("TANDEM_DIST_PROGRESS");
    const std::string mode = env ? env : "";
    if (mode == "caller") return true;
    if (mode == "thread") return false;
    TANDEM_CHECK(mode.empty() || mode == "auto", "[dist] TANDEM_DIST_PROGRESS must be auto, caller or thread, got '{}'",
                 mode);
    cpu_set_t mask;
    CPU_ZERO(&mask);
    if (sched_getaffinity(0, sizeof mask, &mask) != 0) return false;
    const int cores = CPU_COUNT(&mask);
    const long online = sysconf(_SC_NPROCESSORS_ONLN);
    // Unbound (a mask of every core): the node's ranks share it.
    const int sharing = cores >= online ? std::max(1, mpi_runtime().info.local_size) : 1;
    const int spare = cores - sharing * get_num_threads();
    return spare < sharing;
  }();
  return caller;
}

MPI_Datatype mpi_type(Dtype d) {
  switch (d) {
    case f32: return MPI_FLOAT;
    case f64: return MPI_DOUBLE;
    case i32: return MPI_INT32_T;
    case i64: return MPI_INT64_T;
    case boolean: return MPI_C_BOOL;
    case f16:
    case bf16: return MPI_UINT16_T;  // bit patterns; only Tandem's user ops reduce them
  }
  return MPI_DATATYPE_NULL;
}

namespace {

// MPI user ops for the 2-byte floats: combine element by element in float.
template <class T, ReduceOp R>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  detail::reduce_into(static_cast<T*>(inout), static_cast<const T*>(in), *len, R);
}

struct HalfOps {
  MPI_Op ops[2][5];  // [f16, bf16][ReduceOp]
};

HalfOps& half_ops() {
  static HalfOps* ops = [] {
    auto* h = new HalfOps();
    auto make = [](MPI_User_function* f) {
      MPI_Op op;
      TANDEM_MPI_CHECK(MPI_Op_create(f, 1, &op));
      return op;
    };
    h->ops[0][0] = make(&half_op<Half, ReduceOp::sum>);
    h->ops[0][1] = h->ops[0][0];
    h->ops[0][2] = make(&half_op<Half, ReduceOp::min>);
    h->ops[0][3] = make(&half_op<Half, ReduceOp::max>);
    h->ops[0][4] = make(&half_op<Half, ReduceOp::product>);
    h->ops[1][0] = make(&half_op<BFloat16, ReduceOp::sum>);
    h->ops[1][1] = h->ops[1][0];
    h->ops[1][2] = make(&half_op<BFloat16, ReduceOp::min>);
    h->ops[1][3] = make(&half_op<BFloat16, ReduceOp::max>);
    h->ops[1][4] = make(&half_op<BFloat16, ReduceOp::product>);
    return h;
  }();
  return *ops;
}

}  // namespace

MPI_Op mpi_op(ReduceOp r, Dtype d) {
  if (d == f16 || d == bf16) return half_ops().ops[d == f16 ? 0 : 1][static_cast<int>(r)];
  if (d == boolean) return (r == ReduceOp::sum || r == ReduceOp::max) ? MPI_LOR : MPI_LAND;
  switch (r) {
    case ReduceOp::sum:
    case ReduceOp::avg: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::product: return MPI_PROD;
  }
  return MPI_OP_NULL;
}

int mpi_int(int64_t v, const char* what) {
  TANDEM_CHECK(v <= INT_MAX, "[mpi] {} of {} exceeds MPI's int count limit", what, v);
  return static_cast<int>(v);
}

MpiInfo mpi_info() {
  ensure_mpi_initialized();
  return mpi_runtime().info;
}

}  // namespace tandem::dist
