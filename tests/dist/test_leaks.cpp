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

#define TANDEM_LEAK_THREADS_CASE(name, fn) \
  TEST_CASE("leaks threads: " name, "[leaks]") { REQUIRE_NOTHROW(on_threads(2, fn)); }
TANDEM_LEAK_CASES(TANDEM_LEAK_THREADS_CASE)
#undef TANDEM_LEAK_THREADS_CASE
