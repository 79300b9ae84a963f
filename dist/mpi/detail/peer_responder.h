// The mpi backend's prober (detail/peer_probe.h): each process runs a thread that answers the
// other ranks' questions about its groups on a communicator of its own, so a rank whose collective
// timed out can tell the ranks that never came from those that are in it with it, and ask all of
// them to dump their flight recorders. The thread checks for questions every 20 ms (MPI has no
// blocking receive that does not spin), which costs about a microsecond each time.
// Internal to the mpi backend.
#pragma once

#include <mpi.h>

namespace tandem::dist {

// Starts the thread on `comm` (a communicator of every rank, made for it) and installs the prober.
// Once per process, after MPI is initialised.
void start_peer_responder(MPI_Comm comm);
// Removes the prober and stops the thread (before MPI_Finalize); no throw.
void stop_peer_responder() noexcept;

}  // namespace tandem::dist
