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

TEST_CASE("leaks mpi: 1,000 DDP constructions and destructions", "[leaks_mpi]") {
  mpi_case::run_case(mpi_world(), leak_cases::ddp_constructions);
}

TEST_CASE("leaks mpi: 1,000 sub-group creations", "[leaks_mpi]") {
  mpi_case::run_case(mpi_world(), leak_cases::subgroup_creations);
}
