// ZeroRedundancyOptimizer: ZeRO stage 1, as PyTorch's torch.distributed.optim.ZeroRedundancyOptimizer.
// The parameters are partitioned over the ranks by size (largest first, each to the rank with the
// fewest elements so far: deterministic, the same on every rank); each rank keeps the optimizer
// state (momentum, Adam's moments) of its own partition only and steps only it; the updated
// parameters are then broadcast from their owners, in buckets, so every rank holds all of them
// again. Gradients are averaged as before (DDP): what shrinks is the optimizer state, to about
// 1/world_size on each rank. In use:
//
//   dist::DistributedDataParallel ddp(model, pg);
//   dist::ZeroRedundancyOptimizer opt(model->parameters(), optim::AdamWOptions{.lr = 3e-4}, pg);
//   for (...) {
//     opt.zero_grad();
//     loss(ddp(x)).backward();
//     opt.step();  // this rank's partition, then every partition broadcast from its owner
//   }
//   opt.consolidate_state_dict(0);  // collective: rank 0 gathers every partition's state
//   if (pg->rank() == 0) nn::save_safetensors(opt.state_dict(), "opt.safetensors");
//
// The state dict has the plain optimizer's format ("state.<i>.*" for parameter i of all of them), so a checkpoint written by N ranks, or by a plain
// optimizer, loads at any number of ranks: load_state_dict on every rank keeps its partition.
// Results equal DDP with the same optimizer exactly (the same arithmetic per parameter).
#pragma once

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "dist/join.h"
#include "dist/process_group.h"
#include "nn/optim.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

// One parameter group: its parameters and its optimizer's hyperparameters (every group of one
// ZeroRedundancyOptimizer runs the same optimizer: SGD, Adam or AdamW).
struct ZeroParamGroup {
  TensorList params;
  optim::OptimizerSpec spec;
};

struct ZeroOptions {
  // The updated parameters of less than 1 MiB are broadcast from each owner in flat buckets of
  // at most this size (one dtype and device each); bigger ones alone, in place (no copy).
  double bucket_cap_mb = 25;
  // PyTorch's overlap_with_ddp: each rank steps its parameters inside backward, as soon as DDP
  // has reduced their bucket (DDP runs the steps, as it runs apply_optimizer_in_backward's), so
  // the update overlaps the rest of backward; step() then only broadcasts the partitions. Build
  // the ZeroRedundancyOptimizer before the DistributedDataParallel that wraps its parameters
  // (DDP takes the steps over when it is made; step() says so otherwise). Gradients are dropped
  // after their step (.grad is none after backward). Call step() after every synchronised
  // backward (accumulate under no_sync): a parameter stepped by a second backward before it is
  // an error on every rank. Not under a Join.
  bool overlap_with_ddp = false;
};

class ZeroRedundancyOptimizer : public optim::Optimizer, public Joinable {
 public:
  // `spec`: the optimizer each rank runs on its partition (optim::SGDOptions, AdamOptions or
  // AdamWOptions), one group. `group` defaults to the world group. Every rank passes the same parameters
  // (count, shapes, dtypes), as DDP checks.
  ZeroRedundancyOptimizer(const TensorList& params, const optim::OptimizerSpec& spec, ProcessGroupPtr group = nullptr,
                          ZeroOptions options = {});
  // Several groups (e.g. weight decay on the matrices only); the state dict indexes the
  // parameters of all groups in order, as a plain optimizer with these groups does.
  ZeroRedundancyOptimizer(std::vector<ZeroParamGroup> groups, ProcessGroupPtr group = nullptr, ZeroOptions options = {});
  ~ZeroRedundancyOptimizer() override;

  // Steps this rank's partition (parameters whose gradient is undefined are skipped, as by the
  // plain optimizer), then broadcasts every partition from its owner. Collective. With
  // overlap_with_ddp the partition was stepped in backward: only the broadcasts are left.
  void step() override;

  size_t num_param_groups() const override { return groups_.size(); }
  const TensorList& group_params(size_t group) const override;
  double lr(size_t group = 0) const override;
  void set_lr(double lr) override;
  void set_lr(size_t group, double lr) override;

  // The rank that owns parameters()[i], and this rank's partition.
  int owner(size_t index) const { return owner_.at(index); }
  const TensorList& local_parameters() const { return local_params_; }
  // The optimizer state this rank holds, in bytes (its partition's).
  int64_t local_state_bytes() const;
  ProcessGroup& process_group() { return *group_; }

  // Collective: rank `to` gathers the state of every partition; then state_dict() there returns
  // the whole state in the plain optimizer's format. Elsewhere state_dict() is an error.
  void consolidate_state_dict(int to = 0);
  nn::TensorDict state_dict() const override;
  // On every rank, with the whole state (a plain optimizer's state dict, or a consolidated one
  // from any number of ranks): checked first, then each rank keeps its partition's state.
  void load_state_dict(const nn::TensorDict& state_dict) override;

  // Joinable: a joined rank steps its partition with the gradients DDP's shadow reduction wrote
  // (the same averages the others read, upcast into the f32 masters under mixed precision) and
  // takes part in the broadcasts, so every rank's parameters and state stay those of one run.
  // Before each step it takes from a rank still training what that rank's loop did and its own
  // no longer does: the hyperparameters (a schedule's learning rate), where the schedulers built
  // on this optimizer are (optim::Optimizer::schedulers()), and the clip_grad_norm_ calls made on
  // this optimizer's gradients since the last step, which it repeats before stepping. At the end
  // every rank's hyperparameters and schedulers are those of a rank that trained last.
  ProcessGroup& join_group() override;  // refuses overlap_with_ddp: a Join fails at construction
  Device join_device() const override;
  void join_attached() override;  // collective: every rank holds the same schedulers
  void join_shadow(const JoinIteration& iteration) override;
  void join_finish(int authority) override;

 protected:
  std::vector<std::pair<std::string, double>> group_hyperparameters(size_t group) const override;
  void set_group_hyperparameter(size_t group, const std::string& name, double value) override;
  std::vector<std::string> state_names() const override;
  bool counts_steps() const override;

 private:
  void partition();
  void register_overlap_steps();  // overlap_with_ddp
  void push_options();                 // the groups' hyperparameters into the local optimizer
  void step_partition_and_broadcast(int hyperparameters_from);
  // Under a Join: the hyperparameters, schedulers' positions and clip_grad_norm_ calls of `root`,
  // a rank still training; a joined rank repeats the clips (replay_clips).
  void sync_under_join(int root, bool replay_clips);
  bool records_clips() const;
  void check_clip(const TensorList& clipped) const;  // refuses a clip a joined rank could not repeat
  void record_clip(const TensorList& clipped, double max_norm, double norm_type);
  void broadcast_partitions();

  ProcessGroupPtr group_;
  ZeroOptions options_;
  std::vector<ZeroParamGroup> groups_;
  TensorList params_;                 // every group's, in order
  std::vector<int> owner_;
  TensorList local_params_;
  std::vector<size_t> local_index_;  // local parameter j is params_[local_index_[j]]
  std::unordered_map<const TensorImpl*, size_t> index_of_;  // params_[i] -> i
  std::unique_ptr<optim::Optimizer> local_;
  int consolidated_on_ = -1;  // the rank whose state_ holds the consolidated state (-1: none)
  // overlap_with_ddp: local_'s steps of one parameter each, run by DDP's reduction (on whichever
  // thread completes it) while set_lr may run on the caller's; one at a time.
  mutable std::mutex local_mutex_;
  std::vector<char> has_step_;  // overlap_with_ddp: parameter i has a step in backward (it required grad)
  std::vector<char> stepped_;  // overlap_with_ddp: parameter i was stepped since the last step() (local_mutex_)
  std::unique_ptr<optim::InBackwardRegistration> overlap_;  // before local_ goes: declared after it
  // Under a Join, on a rank still training: its clip_grad_norm_ calls on these parameters since
  // its last step, as [max_norm, norm_type, n, n parameter indices] each.
  std::vector<double> clips_;
  HookHandle clip_watch_;  // records them; removed first, so it never sees a half-destroyed object
};

}  // namespace tandem::dist
