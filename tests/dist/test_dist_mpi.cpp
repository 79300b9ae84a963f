// The dist checks of dist_cases.h on the mpi backend. CTest runs this binary under
// `mpirun -np 2` and `-np 4` (see tests/CMakeLists.txt); run alone it is a world of size 1.
// Each case runs on a fresh copy of the world group, and the ranks agree on the verdict, so a
// failure on one rank fails the case on all of them instead of desynchronising the next one.
#include <catch2/catch.hpp>

#include "dist_cases.h"
#include "mpi_case.h"
#include "tandem.h"

using namespace tandem;
using namespace tandem::dist;
using namespace dist_cases;

namespace {
ProcessGroupPtr mpi_world() {
  static ProcessGroupPtr w = mpi_case::init_world(std::chrono::seconds(30));
  return w;
}

// Each case on a fresh group of every rank (mpi_case.h), 20 s per collective; dist_cases' checks
// take the group by reference.
void run_case(const std::function<void(ProcessGroup&)>& fn) {
  mpi_case::run_case(mpi_world(), [&](ProcessGroupPtr g) { fn(*g); }, std::chrono::seconds(20));
}
}  // namespace

TEST_CASE("dist mpi: world", "[dist_mpi]") {
  ProcessGroupPtr w = mpi_world();
  WorldInfo info = world_info();
  REQUIRE(info.backend == "mpi");
  REQUIRE(w->backend() == "mpi");
  REQUIRE(info.size == w->size());
  REQUIRE(info.local_rank >= 0);
  REQUIRE(info.local_rank < info.local_size);
  if (const char* env = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK")) REQUIRE(info.local_rank == std::atoi(env));
}

TEST_CASE("dist mpi: allreduce x op x dtype", "[dist_mpi]") { run_case([](ProcessGroup& g) { allreduce_all(g); }); }
TEST_CASE("dist mpi: allreduce_coalesced", "[dist_mpi]") { run_case([](ProcessGroup& g) { allreduce_coalesced_all(g); }); }
TEST_CASE("dist mpi: broadcast", "[dist_mpi]") { run_case([](ProcessGroup& g) { broadcast_all(g); }); }
TEST_CASE("dist mpi: allgather", "[dist_mpi]") { run_case([](ProcessGroup& g) { allgather_all(g); }); }
TEST_CASE("dist mpi: reduce_scatter", "[dist_mpi]") { run_case([](ProcessGroup& g) { reduce_scatter_all(g); }); }
TEST_CASE("dist mpi: all_to_all", "[dist_mpi]") { run_case([](ProcessGroup& g) { all_to_all_all(g); }); }
TEST_CASE("dist mpi: barrier, send and recv", "[dist_mpi]") { run_case([](ProcessGroup& g) { barrier_and_p2p(g); }); }
TEST_CASE("dist mpi: continuations", "[dist_mpi]") { run_case([](ProcessGroup& g) { work_continuations(g); }); }
TEST_CASE("dist mpi: sub-groups", "[dist_mpi]") {
  run_case([](ProcessGroup& g) {
    sub_groups(g);
    // A group of 3 (not a power of two) takes the MPI_Iallreduce path with the f16/bf16 user ops.
    if (g.size() >= 3) {
      ProcessGroupPtr three = g.new_group({0, 1, 2});
      if (three) allreduce_all(*three, {1, 13});
    }
  });
}
TEST_CASE("dist mpi: argument errors", "[dist_mpi]") { run_case([](ProcessGroup& g) { argument_errors(g); }); }
TEST_CASE("dist mpi: mismatch detection", "[dist_mpi]") { run_case([](ProcessGroup& g) { mismatch_detection(g); }); }
TEST_CASE("dist mpi: a small allreduce with a late peer returns at once, and completes in order", "[dist_mpi]") {
  run_case([](ProcessGroup& g) { late_peer(g); });
}

TEST_CASE("dist mpi: caller progress: pending collectives advance when polled, in issue order", "[dist_mpi]") {
  run_case([](ProcessGroup& g) { caller_progress(g); });
}

TEST_CASE("dist mpi: a BlockingIssueGuard finishes each collective before the call returns", "[dist_mpi]") {
  run_case([](ProcessGroup& g) { blocking_issue(g); });
}

TEST_CASE("dist mpi: timeouts", "[dist_mpi]") {
  run_case([](ProcessGroup& g) {
    timeout_reporting(g, false);
    timeout_reporting(g, true);
  });
}
