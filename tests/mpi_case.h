// The harness of the tests CTest runs under mpirun (test_dist_mpi, test_ddp_mpi, test_cuda_nccl's
// "[cuda_mpi]" cases): one case runs on every rank and the ranks agree on its verdict, so a
// failure on one rank fails the case on all of them instead of desynchronising the next one.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dist/dist.h"
#include "tandem.h"

namespace mpi_case {

// The mpi world through dist::init (so world_info() knows it), `timeout` per collective. Each
// test binary keeps one: `static ProcessGroupPtr w = mpi_case::init_world(...)`.
inline tandem::dist::ProcessGroupPtr init_world(std::chrono::milliseconds timeout) {
  tandem::dist::InitOptions o;
  o.backend = "mpi";
  o.timeout = timeout;
  return tandem::dist::init(o);
}

// 0, 1, ..., g.size() - 1: the ranks new_group needs for a copy of g.
inline std::vector<int> all_ranks(const tandem::dist::ProcessGroup& g) {
  std::vector<int> all;
  for (int k = 0; k < g.size(); ++k) all.push_back(k);
  return all;
}

// Runs fn on this rank, then agrees with the other ranks of `world` on whether any of them threw.
// With fresh_group_timeout, fn gets a new group of all of world's ranks with that timeout (made
// inside the try, so a failure to make it is the case's failure too), else world itself.
inline void run_case(const tandem::dist::ProcessGroupPtr& world,
                     const std::function<void(tandem::dist::ProcessGroupPtr)>& fn,
                     std::optional<std::chrono::milliseconds> fresh_group_timeout = std::nullopt) {
  using namespace tandem;
  std::string error;
  try {
    dist::ProcessGroupPtr g = world;
    if (fresh_group_timeout) {
      g = world->new_group(all_ranks(*world));
      g->set_timeout(*fresh_group_timeout);
    }
    fn(g);
  } catch (const std::exception& e) {
    error = e.what();
  }
  Tensor failed = from_vector<int32_t>({error.empty() ? 0 : 1});
  world->allreduce(failed, dist::ReduceOp::sum)->wait();
  INFO("rank " << world->rank() << " of " << world->size() << ": " << error);
  REQUIRE(error.empty());
  REQUIRE(failed.item<int32_t>() == 0);  // another rank failed: see its output
}

}  // namespace mpi_case
