// The mpi backend's process-wide state and vocabulary: start-up (MPI_Init_thread, or adopting an
// MPI the program already initialised), the lock every MPI call takes when MPI is only
// SERIALIZED, the live groups (so finalize stops them first), checked MPI calls, and the mapping
// of dtypes and reduce ops to MPI's, with user ops for f16/bf16 that combine in float element by
// element. Internal to the mpi backend (not installed).
#pragma once

#include <mpi.h>

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "dist/mpi/mpi.h"
#include "dist/process_group.h"

namespace tandem::dist {

// An MPI call that failed. Outside an operation (start-up, making communicators) its text is the
// message; inside one the group turns it into one that names the operation and what the peers
// did (MpiGroup::translate_failure), keeping MPI's words only where nothing better is known.
class MpiError : public Error {
 public:
  MpiError(std::string message, std::string mpi_text) : Error(std::move(message)), mpi_text_(std::move(mpi_text)) {}
  const std::string& mpi_text() const { return mpi_text_; }  // MPI's error string

 private:
  std::string mpi_text_;
};

// Throws MpiError "[mpi] <call> failed: <MPI's error string> (<file>:<line>)" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const char* call, const char* file, int line);
#define TANDEM_MPI_CHECK(...) ::tandem::dist::check_mpi((__VA_ARGS__), #__VA_ARGS__, __FILE__, __LINE__)

class MpiGroup;
class BrokenState;

// Process-wide MPI state: initialisation, the lock used when MPI is only SERIALIZED, and the live
// groups (so finalize can stop them first).
struct MpiRuntime {
  std::mutex init_mutex;
  bool initialized = false;
  bool finalized = false;
  bool we_initialized = false;
  bool serialized = false;
  MpiInfo info;
  // A copy of MPI_COMM_WORLD (made when Tandem initialises MPI) on which every rank checks in at
  // exit, so that a rank whose group broke can tell whether its peers will ever reach MPI_Finalize.
  MPI_Comm exit_comm = MPI_COMM_NULL;
  // Another copy, for the questions ranks whose collective timed out ask the others
  // (peer_responder.h); made with exit_comm, when there are peers.
  MPI_Comm probe_comm = MPI_COMM_NULL;
  std::mutex call_mutex;
  std::mutex groups_mutex;
  std::set<MpiGroup*> groups;
  // The live groups' broken states by name, for a peer's break notice (peer_responder.h): apart
  // from `groups`, whose mutex finalize holds while it stops the groups' threads, which the
  // notice must be able to end.
  std::mutex broken_mutex;
  std::multimap<std::string, std::weak_ptr<BrokenState>> broken_by_name;

  std::unique_lock<std::mutex> lock() {
    return serialized ? std::unique_lock<std::mutex>(call_mutex) : std::unique_lock<std::mutex>();
  }
};

MpiRuntime& mpi_runtime();  // never destroyed: groups may outlive static destruction

// Keeps `what` alive for good: the buffers of an operation that failed while MPI may still write
// into them (a receive of a late peer, a collective that cannot be cancelled). Its group is broken,
// so this happens at most once per failed operation.
void keep_forever(std::shared_ptr<void> what);
// Initialises MPI on first use (or adopts the program's MPI); throws once it was finalised.
void ensure_mpi_initialized();

// Whether the mpi groups run in caller-progress mode (QueuedGroup::set_caller_progress), decided
// once: TANDEM_DIST_PROGRESS=caller or thread, or by default (auto) caller when the rank has no
// core to spare for a communication thread: its affinity mask holds no more cores than its
// intra-op threads (a mask of every core is shared by the node's ranks: then no more than their
// threads together, plus fewer than one core each).
bool mpi_caller_progress();

MPI_Datatype mpi_type(Dtype d);  // f16/bf16 travel as their bit patterns (MPI_UINT16_T)
MPI_Op mpi_op(ReduceOp r, Dtype d);  // avg is a sum here: the caller divides
// v as an MPI count (an int), or "[mpi] <what> of <v> exceeds MPI's int count limit".
int mpi_int(int64_t v, const char* what);

}  // namespace tandem::dist
