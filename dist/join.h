// Join: training with uneven inputs, as PyTorch's torch.distributed.algorithms.Join. Ranks whose
// data ends early leave their loop and, inside the join, shadow the collectives the others still
// issue (DDP's bucket reductions with zero gradients, the used map, buffer broadcasts, a bucket
// rebuild), so no rank hangs; when every rank is done they leave together and the final model is
// broadcast from a rank that trained to the end. In use:
//
//   dist::DistributedDataParallel ddp(model, group);
//   {
//     dist::Join join({&ddp});                 // {.throw_on_early_termination = true} to stop all instead
//     for (auto& batch : loader) {             // this rank's batches, as many as it has
//       opt.zero_grad();
//       nn::cross_entropy(ddp(batch.x), batch.y).backward();
//       opt.step();
//     }
//     join.join();                             // or let the destructor do it
//   }
//
// How the ranks agree: under a Join, each synchronising joinable's iteration (DDP: every forward
// in grad mode) starts with one small allreduce of a world-sized vector in which every rank still
// training sets its own entry to what the iteration will do (reduce buckets or not, broadcast
// buffers, rebuild buckets); joined ranks add zeros. Every rank then knows which ranks still train
// and what to shadow, and when the vector is all zeros every rank has joined.
//
// An error on a rank still training (a misuse DDP reports, a failed backward) is raised there; the
// joined ranks, waiting in that iteration's collectives, fail at the group's timeout, naming them.
//
// The summed gradient is divided by the initial world size (PyTorch's default: every sample
// weighs the same), or, with divide_by_initial_world_size=false, by the ranks that still trained
// in that iteration. Only the model is synchronised at the end: an optimizer outside the joinables
// keeps the state of the last step it took on each rank.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "dist/process_group.h"

namespace tandem::dist {

// The caller tag of the announcement collective (dist/flight_recorder.h), and the rule an error
// adds when a collective met it on another rank (a collective of the user's own in the loop).
inline constexpr const char* kJoinAnnouncementTag = "join announcement";
inline constexpr const char* kJoinShadowRule =
    "Under a dist::Join a rank that has run out of data shadows only the joinables' collectives (DDP's, a "
    "ZeroRedundancyOptimizer's); a collective of your own inside the loop (a loss or metric allreduce) meets its "
    "announcement instead. Sum such a metric and its count on each rank and reduce them once after join()";

struct JoinOptions {
  // Instead of shadowing: every rank raises at the first iteration where some rank has joined.
  bool throw_on_early_termination = false;
  // The summed gradient over the initial world size (true) or over the ranks still training.
  bool divide_by_initial_world_size = true;
};

// One iteration as the ranks still training announced it.
struct JoinIteration {
  int64_t index = 0;        // iterations announced since the Join began
  std::vector<int> active;  // the ranks still training, ascending (empty: every rank has joined)
  uint32_t flags = 0;       // what the announcing joinable does this iteration (its own bits)
  int world_size = 1;
  // The rank whose state the others take (buffers broadcast from it): the highest still
  // training, as PyTorch's DDP picks it (_find_common_rank(rank, True), an allreduce of the max).
  int authority() const { return active.back(); }
  // The divisor of this iteration's summed gradient.
  double divisor(const JoinOptions& options) const {
    return options.divide_by_initial_world_size ? world_size : static_cast<double>(active.size());
  }
};

class Join;

// Something Join drives: DDP, a ZeroRedundancyOptimizer. Its collectives per iteration must be
// the same on every rank still training, and a joined rank must be able to issue them alone.
class Joinable {
 public:
  virtual ~Joinable() = default;
  // The group the joinable communicates over (all joinables of one Join share it).
  virtual ProcessGroup& join_group() = 0;
  // Where its tensors live (the announcements go to the group's control device for it).
  virtual Device join_device() const { return kCPU; }
  // When a Join attaches it: throws if it cannot run under one.
  virtual void join_attached() {}
  // Whether it announces the iterations (DDP does): such a joinable must be listed first, since
  // the others' collectives follow its own within an iteration.
  virtual bool join_announces() const { return false; }
  // On a joined rank: the collectives one iteration of the ranks still training issues, in their
  // order, with this rank's contribution neutral (zero gradients).
  virtual void join_shadow(const JoinIteration& iteration) = 0;
  // Once every rank has joined: make this rank's state that of `authority`, a rank that trained
  // in the last iteration (-1: no iteration ran).
  virtual void join_finish(int authority) = 0;

 protected:
  // The Join this joinable is attached to (set while one is open), for the announcing joinable.
  Join* join_context() const { return join_; }

 private:
  friend class Join;
  Join* join_ = nullptr;
};

class Join {
 public:
  // `joinables` in the order their collectives run within an iteration (DDP first); the first
  // announces the iterations. Each may be attached to one Join at a time, and must outlive it.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  // Joins (join()) unless an exception is propagating, as PyTorch's context manager skips the
  // join when the loop raised; an error of the join itself (throw_on_early_termination, a failed
  // rank) is thrown from here when join() was not called.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank's inputs are exhausted: shadow the others' iterations until every rank has joined,
  // then synchronise the final state. Once.
  void join();

  // For the announcing joinable, at the start of each of its iterations on a rank still training,
  // before any of the iteration's collectives: `flags` into this rank's entry; returns the
  // iteration as every rank sees it. Throws, on every rank alike, for throw_on_early_termination,
  // and when the ranks still training disagree about the flags.
  JoinIteration announce(uint32_t flags);

  const JoinOptions& options() const { return options_; }
  bool joined() const { return joined_; }

  // The highest rank still training in the last iteration that had one (-1 before any): the rank
  // whose state (parameters and buffers at the end, a learning-rate schedule) the others take.
  int authority() const { return last_authority_; }

  // Bits every announcement may carry; a joinable's own flags use the bits above kReservedBits.
  static constexpr uint32_t kActive = 1u << 0;        // set by announce()
  static constexpr uint32_t kSynchronises = 1u << 1;  // ends in a gradient reduction (an optimizer step follows)
  static constexpr uint32_t kReservedBits = 2;

 private:
  JoinIteration exchange(uint32_t mine);
  void detach() noexcept;

  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  ProcessGroup* group_ = nullptr;
  int64_t iterations_ = 0;
  int last_authority_ = -1;  // the highest rank still training in the last iteration that had any
  bool joined_ = false;
  int uncaught_at_start_ = 0;
};

}  // namespace tandem::dist
