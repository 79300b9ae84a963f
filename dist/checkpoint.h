// Checkpoints of a training run in one call each: save_checkpoint writes the model, the optimizer
// (a ZeroRedundancyOptimizer's state consolidated first), the learning-rate scheduler, the
// optimizers in backward, the step, the random generator and whatever else the loop keeps into
// one safetensors file; load_checkpoint puts them back, at any number of ranks.
//
//   dist::TrainingState state{.model = model.get(), .optimizer = &zero, .scheduler = &cosine};
//   ...
//   state.step = step;
//   state.extra.insert_or_assign("position", from_vector<int64_t>({epoch, batch}));
//   dist::save_checkpoint("run/checkpoint.safetensors", state, pg);   // every rank of pg
//   ...                                                               // later, any number of ranks:
//   dist::CheckpointInfo info = dist::load_checkpoint("run/checkpoint.safetensors", state);
//
// The file (nn/safetensors.h; written by rank 0, atomically): "model.<name>" (Module::state_dict),
// "optimizer.<key>" (the plain optimizer's format, whether a ZeroRedundancyOptimizer at N ranks or
// a plain optimizer wrote it: either loads into either), "lr_scheduler.<key>",
// "in_backward.<name>.<key>" (InBackwardOptimizers::state_dict, one per name), "extra.<name>",
// "checkpoint.step" and "checkpoint.world_size" (i64 [1]) and "checkpoint.rng" (i64 [2]: the
// generator's seed and offset, bit for bit). Its metadata: "tandem.format" "checkpoint",
// "tandem.format_version" "1", "tandem.parts" (the parts saved, comma-separated: model, optimizer,
// lr_scheduler, in_backward.<name>, rng) and "tandem.lr_scheduler" (the scheduler's class).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "dist/process_group.h"
#include "nn/lr_scheduler.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

// What a checkpoint holds. Any pointer may be null: that part is neither saved nor restored.
struct TrainingState {
  nn::Module* model = nullptr;
  optim::Optimizer* optimizer = nullptr;  // a ZeroRedundancyOptimizer: consolidated on rank 0 to save
  optim::LRScheduler* scheduler = nullptr;
  // apply_optimizer_in_backward's, each under a name (non-empty, no '.' or ',', unique).
  std::vector<std::pair<std::string, optim::InBackwardOptimizers*>> in_backward;
  int64_t step = 0;  // saved; set by load_checkpoint
  bool rng = true;   // the calling thread's generator state (core/random.h): rank 0's is saved
  // Whatever else the loop keeps (a data position, a vocabulary): saved under "extra."; on load it
  // becomes the file's "extra." entries (names without the prefix), whatever it held.
  nn::TensorDict extra;
};

// Collective: every rank of `group` calls it with the same parts (nullptr: the world group if
// dist::init() ran, else this process alone). A ZeroRedundancyOptimizer, which must communicate
// over `group` (the same ranks, in the same order), is consolidated on rank 0; rank 0 writes `path`
// (making its folder if need be); then every rank learns whether the write succeeded, so none runs
// ahead of a file it may resume from and a failed write ("[checkpoint] cannot write '<path>': ...")
// is an error on every rank.
void save_checkpoint(const std::string& path, const TrainingState& state, ProcessGroupPtr group = nullptr);

// What load_checkpoint read besides the parts: the step, and the number of ranks that saved it (so
// a loop can rescale its position in the data).
struct CheckpointInfo {
  int64_t step = 0;
  int world_size = 1;
};

// On every rank that restores (no communication: each reads `path`), or in one process: restores
// every part that is set. Everything is checked before anything changes: a file that is missing or
// not a checkpoint, a part set here that the file does not hold, a model or optimizer that does not
// fit its section, a scheduler of another class, are each a tandem::Error "[checkpoint] '<path>':
// ..." naming the part, and then nothing was restored. A ZeroRedundancyOptimizer keeps its
// partition of the state, whatever number of ranks saved it.
CheckpointInfo load_checkpoint(const std::string& path, TrainingState& state);

}  // namespace tandem::dist
