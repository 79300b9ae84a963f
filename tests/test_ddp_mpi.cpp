// The DDP cases of ddp_cases.h on the mpi backend. CTest runs this binary under `mpirun -np 2`
// and `-np 4` (tests/CMakeLists.txt); run alone it is a world of size 1. Each case runs on a fresh
// sub-group, and the ranks agree on the verdict, so one rank's failure fails the case everywhere.
#include <catch2/catch.hpp>

#include "ddp_cases.h"
#include "ddp_hardening_cases.h"
#include "ddp_modes_cases.h"
#include "mpi_case.h"

using namespace tandem;
using namespace tandem::dist;
using namespace ddp_cases;

namespace {
ProcessGroupPtr mpi_world() {
  static ProcessGroupPtr w = mpi_case::init_world(std::chrono::seconds(60));
  return w;
}

// Each case on a fresh group of every rank (mpi_case.h), 60 s per collective.
void run_case(const std::function<void(ProcessGroupPtr)>& fn) {
  mpi_case::run_case(mpi_world(), fn, std::chrono::seconds(60));
}
}  // namespace

TEST_CASE("ddp mpi: equivalence with one process", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) { all_equivalence(g, /*quick=*/g->size() > 2); });
}
TEST_CASE("ddp mpi: no_sync", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) {
    no_sync_accumulation(g, false);
    no_sync_accumulation(g, true);
  });
}
TEST_CASE("ddp mpi: broadcast_buffers", "[ddp_mpi]") { run_case(buffers); }
TEST_CASE("ddp mpi: buffers with no_sync", "[ddp_mpi]") { run_case(buffers_with_no_sync); }
TEST_CASE("ddp mpi: unused parameter error", "[ddp_mpi]") { run_case(unused_everywhere_is_an_error); }
TEST_CASE("ddp mpi: construction errors", "[ddp_mpi]") { run_case(construction_errors); }
TEST_CASE("ddp mpi: ignored parameters", "[ddp_mpi]") { run_case(ignored_parameters); }
TEST_CASE("ddp mpi: overlap and launch order", "[ddp_mpi]") { run_case(overlap_order); }
TEST_CASE("ddp mpi: rebuilt buckets agree", "[ddp_mpi]") { run_case(rebuild_agreement); }
TEST_CASE("ddp mpi: comm hooks", "[ddp_mpi]") { run_case(comm_hooks); }
TEST_CASE("ddp mpi: second DDP after a failed backward", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) {
    hooks_after_failed_backward(g, false);
    hooks_after_failed_backward(g, true);
  });
}
TEST_CASE("ddp mpi: static_graph", "[ddp_mpi]") { run_case(static_graph_all); }
TEST_CASE("ddp mpi: reducer rules", "[ddp_mpi]") { run_case(reducer_rules); }
TEST_CASE("ddp mpi: a graph that changes under static_graph", "[ddp_mpi]") {
  for (bool start_using : {true, false})
    mpi_case::run_case(mpi_world(), [start_using](ProcessGroupPtr g) { static_graph_changes(g, start_using); },
                       std::chrono::seconds(3));
}
TEST_CASE("ddp mpi: delayed-allreduce parameters", "[ddp_mpi]") {
  run_case(delayed_allreduce_all);
  run_case(delayed_unused_on_some_ranks);
}
TEST_CASE("ddp mpi: optimizer in backward", "[ddp_mpi]") {
  run_case(in_backward_all);
  run_case(in_backward_hook_and_errors);
}
TEST_CASE("ddp mpi: mixed precision", "[ddp_mpi]") {
  run_case(mixed_precision_all);
  run_case(mixed_precision_buffers_and_errors);
  run_case(in_backward_mixed_precision_all);
  run_case(delayed_with_mixed_precision_all);
}
TEST_CASE("ddp mpi: no_sync after a dropped forward", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) {
    no_sync_after_dropped_forward(g, false);
    no_sync_after_dropped_forward(g, true);
  });
}
TEST_CASE("ddp mpi: two forwards without static_graph", "[ddp_mpi]") { run_case(two_forwards_without_static_graph); }
TEST_CASE("ddp mpi: the delayed allreduce follows DDP's backward", "[ddp_mpi]") {
  run_case(delayed_follows_ddps_backward);
  run_case(delayed_after_dropped_forward);
}
TEST_CASE("ddp mpi: mixed precision on a rank whose backward fires no hook", "[ddp_mpi]") {
  run_case(mixed_precision_rank_without_hooks);
}
TEST_CASE("ddp mpi: delayed parameters unused everywhere", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) {
    delayed_globally_unused(g, false);
    delayed_globally_unused(g, true);
  });
}
TEST_CASE("ddp mpi: a second DDP while the first lives", "[ddp_mpi]") { run_case(second_ddp_all); }
TEST_CASE("ddp mpi: destroyed with a reduction in flight", "[ddp_mpi]") { run_case(destroy_with_reduction_in_flight); }
TEST_CASE("ddp mpi: mixed precision, delayed .grad and call's inputs", "[ddp_mpi]") {
  run_case(delayed_grad_kept_under_mixed_precision);
  run_case(call_casts_inputs);
}
TEST_CASE("ddp mpi: check_reducer_finalized after a failed backward, and training after it", "[ddp_mpi]") {
  run_case([](ProcessGroupPtr g) {
    check_after_failed_backward(g, false);
    check_after_failed_backward(g, true);
    mixed_precision_after_failed_backward(g, false);
    mixed_precision_after_failed_backward(g, true);
  });
}
TEST_CASE("ddp mpi: under mixed precision a side backward does not end DDP's iteration", "[ddp_mpi]") {
  run_case(mixed_precision_side_backward);
}
TEST_CASE("ddp mpi: a delayed parameter that changes under static_graph", "[ddp_mpi]") {
  mpi_case::run_case(mpi_world(), delayed_static_graph_changes, std::chrono::seconds(3));
}
