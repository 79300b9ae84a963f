// The mpi backend: CPU tensors over MPI (device tensors staged through host copies).
//
// One communication thread per group runs the operations in issue order with nonblocking MPI
// calls, polled against the deadline, so a collective that does not complete raises a timeout
// instead of blocking forever. MPI is initialised with MPI_THREAD_MULTIPLE (or SERIALIZED, then
// every MPI call is serialised by a lock); every MPI return code is checked ("[mpi] ...").
// Allreduce uses recursive doubling (small, power-of-two groups) or a ring (large) over
// MPI_Isend/Irecv with Tandem's reduction loops, else MPI_Iallreduce with custom MPI ops for
// f16/bf16 that combine in float element by element.
#pragma once

#include <optional>

#include "dist/process_group.h"

namespace tandem::dist {

struct MpiInfo {
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)
  int local_size = 1;
  int thread_level = 0;  // MPI_THREAD_* provided
};

// Initialises MPI on first use (or adopts an MPI the program already initialised) and describes
// MPI_COMM_WORLD.
MpiInfo mpi_info();

// A group over MPI_COMM_WORLD. Every call creates a new group (collective: all ranks call it).
ProcessGroupPtr make_mpi_world(std::optional<Milliseconds> timeout = {}, std::optional<bool> debug_checks = {});

// Stops every MPI group's communication thread, frees their communicators and finalises MPI if
// Tandem initialised it. Runs at exit automatically; later MPI use is an error.
// MPI_Finalize waits for every rank. After a group of this process broke (a collective timed out
// or failed), this rank waits for the others to reach their exit only briefly (the timeout, at
// most 10 s): if one does not, it prints why to stderr and ends the whole job with MPI_Abort
// (non-zero status) rather than hang forever. A program that initialised MPI itself finalises it
// itself; it can ask its groups' is_broken() and call MPI_Abort.
void mpi_finalize();

}  // namespace tandem::dist
