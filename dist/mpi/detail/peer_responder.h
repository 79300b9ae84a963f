// The mpi backend's prober (detail/peer_probe.h): each process runs a thread that answers the
// other ranks' questions about its groups on a communicator of its own, so a rank whose collective
// timed out can tell the ranks that never came from those that are in it with it, and ask all of
// them to dump their flight recorders. The thread checks for questions every 20 ms (MPI has no
// blocking receive that does not spin), which costs about a microsecond each time.
// Internal to the mpi backend.
//
// It also carries breaks: a rank whose group breaks (a collective failed there) tells the other
// ranks' responders, which mark their copy of the group broken, so a rank waiting in a collective
// that can no longer finish stops within moments with the reason, not at its deadline.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::dist {

// Starts the thread on `comm` (a communicator of every rank, made for it) and installs the prober.
// Once per process, after MPI is initialised.
void start_peer_responder(MPI_Comm comm);
// Removes the prober and stops the thread (before MPI_Finalize); no throw.
void stop_peer_responder() noexcept;

// Tells every other rank of group `group` (world_ranks: its ranks as MPI_COMM_WORLD numbers them)
// that it broke on rank `rank` at collective #seq, and why. No throw; nothing without a responder.
void notify_peers_of_break(const std::string& group, const std::vector<int>& world_ranks, int rank, int64_t seq,
                           const std::string& reason) noexcept;
// What a notice does on the receiving rank: marks its live groups named `group` broken (group.cpp).
void break_group_from_peer(const std::string& group, int from, int64_t seq, const std::string& reason);

}  // namespace tandem::dist
