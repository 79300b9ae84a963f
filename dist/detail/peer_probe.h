// Asking the other ranks where they are, when a collective times out: which ranks never issued it
// (and what they did last), which issued something else under its number, which are in it with
// us, and which do not answer at all (stopped, hung with the process frozen, gone). The timeout
// errors name the missing ranks with it in every mode, not only with TANDEM_DIST_DEBUG=detail.
//
// A transport that can reach its peers outside the stuck collective provides the prober: the mpi
// backend answers from a thread of each process on a communicator of its own
// (mpi/detail/peer_responder.cpp). Without one (no MPI), probe_peers returns nothing and the errors
// say what the backend itself knows. Internal to dist.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::dist {

class FlightRecorder;
struct FlightEntry;

// One peer's answer about collective #seq of a group.
struct PeerAnswer {
  int rank = 0;           // in the group
  bool answered = false;  // within the wait
  bool knows_group = false;  // it has a group of that name (false: destroyed, or never made)
  int64_t last_issued = -1;  // its newest collective on the group
  bool has_at_seq = false;   // #seq is in its ring
  std::string at_seq_signature, at_seq_summary, at_seq_state;
  std::string last_summary, last_state;
  int64_t last_seq = -1;
};

struct PeerQuery {
  std::string group, backend;
  int rank = 0;                 // the asking rank, in the group
  std::vector<int> world_ranks;  // the group's ranks as the prober's transport numbers them
  uint64_t seq = 0;
  bool dump = false;  // ask the peers to write their flight recorder dumps too
  std::chrono::milliseconds wait{2000};
};

using PeerProber = std::vector<PeerAnswer> (*)(const PeerQuery&);
// The transport's prober (set once MPI is up; nullptr to remove it before MPI finalises).
void set_peer_prober(PeerProber prober);

struct PeerReport {
  std::string text;          // "rank 3 did not arrive (...); every other rank is in it"
  std::vector<int> missing;  // did not arrive, or did not answer
  bool mismatch = false;     // some rank issued another collective under the number
};

// Asks the group's peers about collective #seq (this rank's entry in `recorder` says what it is)
// and describes their answers; nothing without a prober, or for a group of one.
std::optional<PeerReport> probe_peers(const FlightRecorder& recorder, uint64_t seq);
// The description alone (tested without a transport). `mine`: this rank's entry of #seq, if any
// (its signature is compared, its summary, with the caller's tag, is shown).
PeerReport describe_peer_answers(const std::vector<PeerAnswer>& answers, uint64_t seq,
                                 const std::optional<FlightEntry>& mine, std::chrono::milliseconds wait);

}  // namespace tandem::dist
