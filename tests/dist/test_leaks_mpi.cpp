// Resource leaks on the mpi backend (leak_cases.h), under mpirun -np 2 (tests/CMakeLists.txt).
#include <catch2/catch.hpp>

#include "leak_cases.h"
#include "mpi_case.h"

using namespace tandem;
using namespace tandem::dist;

namespace {
ProcessGroupPtr mpi_world() {
  static ProcessGroupPtr w = mpi_case::init_world(std::chrono::seconds(60));
  return w;
}
}  // namespace

#define TANDEM_LEAK_MPI_CASE(name, fn) \
  TEST_CASE("leaks mpi: " name, "[leaks_mpi]") { mpi_case::run_case(mpi_world(), fn); }
TANDEM_LEAK_CASES(TANDEM_LEAK_MPI_CASE)
#undef TANDEM_LEAK_MPI_CASE
