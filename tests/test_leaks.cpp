// Resource leaks on the threads backend (leak_cases.h): 1,000 DDP constructions and 1,000
// sub-group creations leave threads, file descriptors and RSS where they started.
#include <catch2/catch.hpp>

#include "leak_cases.h"

using namespace tandem;
using namespace tandem::dist;

namespace {
void on_threads(int n, const std::function<void(ProcessGroupPtr)>& fn) {
  ThreadsOptions o;
  o.timeout = std::chrono::seconds(60);
  run_threads(n, [&](ProcessGroup& g) { fn(ddp_cases::borrow(g)); }, o);
}
}  // namespace

TEST_CASE("leaks threads: 1,000 DDP constructions and destructions", "[leaks]") {
  REQUIRE_NOTHROW(on_threads(2, leak_cases::ddp_constructions));
}

TEST_CASE("leaks threads: 1,000 sub-group creations", "[leaks]") {
  REQUIRE_NOTHROW(on_threads(2, leak_cases::subgroup_creations));
}
