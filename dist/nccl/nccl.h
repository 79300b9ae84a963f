// The nccl backend: CUDA tensors over NCCL, part of the CUDA backend library (Tandem::cuda, built
// when Tandem is built with CUDA; the group itself needs NCCL to be found: TANDEM_WITH_NCCL). The
// library registers it with dist::init when it is loaded; "auto" picks it under mpirun when a
// device is usable.
//
// Each group owns an NCCL communicator on one device and a non-blocking comm stream. A collective
// is launched from the calling thread: an event recorded on the caller's current stream orders the
// comm stream after everything issued before the call, the NCCL call goes on the comm stream, and a
// completion event follows it; the host never waits for the collective while issuing (only for
// NCCL to enqueue it, bounded: see below). A watchdog thread per group
// polls the completion events (cudaEventQuery) and ncclCommGetAsyncError against each
// collective's deadline: a Work completes when its event has fired (so after wait() every stream
// sees the result), and on a timeout or an asynchronous NCCL error the communicator is aborted,
// the Work fails naming the collective, its sequence number and the group, and the group is broken.
// The communicators are non-blocking (ncclConfig_t::blocking = 0): creating one, and enqueueing a
// collective (NCCL connects to the peers before a first collective), happen in the background and
// are polled against the same timeout, so a rank that never comes makes the others fail with an
// error instead of holding their threads inside NCCL. Every break is recorded for the exit path:
// see mpi_finalize (dist/mpi/mpi.h).
//
// CPU tensors handed to an nccl group go to its companion group over the same ranks (mpi under a
// launcher, else a world of size 1), which also bootstraps NCCL (rank 0's ncclUniqueId is
// broadcast over it), builds sub-groups and carries the TANDEM_DIST_DEBUG=detail fingerprints.
#pragma once

#include "dist/init.h"

namespace tandem::dist {

// True when this Tandem has the nccl backend, a CUDA device is usable here and, under a launcher,
// this node has a device for each of its ranks (what backend "auto" asks; never throws).
bool nccl_available();

// The world group over NCCL (collective: every launched rank calls it). Under mpirun each rank's
// communicator lives on the device its local rank picks (local_rank % device count), which becomes
// the current device; without a launcher it is a world of size 1 on the current device. Throws
// "[dist] the nccl backend needs a CUDA build ..." when built without NCCL.
ProcessGroupPtr make_nccl_world(const InitOptions& options = {});

}  // namespace tandem::dist
