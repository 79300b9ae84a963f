// The DDP cases of ddp_case_table.h on the mpi backend. CTest runs this binary under `mpirun -np 2`
// and `-np 4` (tests/CMakeLists.txt); run alone it is a world of size 1. Each step of a case runs
// on a fresh sub-group, and the ranks agree on the verdict, so one rank's failure fails the case
// everywhere.
#include <catch2/catch.hpp>

#include <chrono>
#include <initializer_list>

#include "ddp_case_table.h"
#include "mpi_case.h"

using namespace tandem;
using namespace tandem::dist;
using namespace ddp_cases;

namespace {
ProcessGroupPtr mpi_world() {
  static ProcessGroupPtr w = mpi_case::init_world(std::chrono::seconds(60));
  return w;
}

std::chrono::seconds mpi_timeout(Wait w) {
  return std::chrono::seconds(w == Wait::breaks_group ? 3 : 60);
}

// A table case: each step on a fresh group of every rank (mpi_case.h).
void run_steps(std::initializer_list<Step> steps) {
  int k = 0;
  for (const Step& s : steps) {
    INFO("step " << ++k << " of " << steps.size());
    mpi_case::run_case(mpi_world(), s.run, mpi_timeout(s.wait));
  }
}
}  // namespace

#define TANDEM_DDP_MPI_CASE(threads_name, threads_tags, mpi_name, ...) \
  TEST_CASE(mpi_name, "[ddp_mpi]") { run_steps({__VA_ARGS__}); }
TANDEM_DDP_CASES(TANDEM_DDP_MPI_CASE)
#undef TANDEM_DDP_MPI_CASE
