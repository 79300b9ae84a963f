#include "dist/checkpoint.h"

#include <cxxabi.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <system_error>
#include <typeinfo>

#include "autograd/ops.h"
#include "core/random.h"
#include "core/trace.h"
#include "dist/init.h"
#include "dist/zero.h"
#include "nn/safetensors.h"

namespace tandem::dist {
namespace {

constexpr const char* kFormat = "checkpoint";
constexpr const char* kVersion = "1";

std::string join(const std::vector<std::string>& items, const char* sep = ", ") {
  return fmt::format("{}", fmt::join(items, sep));
}

std::vector<std::string> split_parts(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// The scheduler's class, e.g. "CosineAnnealingLR": what a checkpoint's scheduler must match.
std::string scheduler_kind(const optim::LRScheduler& s) {
  const char* mangled = typeid(s).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : mangled;
  const std::string ours = "tandem::optim::";
  if (name.starts_with(ours)) name = name.substr(ours.size());
  return name;
}

// The world group, or none: this process alone.
ProcessGroupPtr resolve(ProcessGroupPtr group) {
  if (group) return group;
  return is_initialized() ? world() : nullptr;
}

// Names of in-backward parts become file prefixes and entries of the "parts" list.
void check_in_backward_names(const TrainingState& state, const std::string& what) {
  std::set<std::string> seen;
  for (const auto& [name, optimizers] : state.in_backward) {
    TANDEM_CHECK(!name.empty() && name.find_first_of(".,") == std::string::npos,
                 "[checkpoint] {}: the optimizers in backward need a name without '.' or ',', got '{}'", what, name);
    TANDEM_CHECK(seen.insert(name).second, "[checkpoint] {}: two optimizers in backward are named '{}'", what, name);
    TANDEM_CHECK(optimizers != nullptr, "[checkpoint] {}: the optimizers in backward '{}' are null", what, name);
  }
}

// Where the small status tensor of save_checkpoint lives: the group's control device for the
// parameters' device (an nccl group communicates device memory only).
Device state_device(const TrainingState& state) {
  TensorList params;
  if (state.model) params = state.model->parameters();
  if (params.empty() && state.optimizer) params = state.optimizer->parameters();
  return params.empty() ? kCPU : params.front().device();
}

nn::TensorDict build(const TrainingState& state, int world_size, nn::Metadata& metadata) {
  nn::TensorDict all;
  std::vector<std::string> parts;
  auto put = [&](const std::string& prefix, const nn::TensorDict& part) {
    for (const auto& [name, t] : part) all.insert(prefix + name, t);
  };
  if (state.model) {
    put("model.", state.model->state_dict());
    parts.emplace_back("model");
  }
  if (state.optimizer) {
    put("optimizer.", state.optimizer->state_dict());
    parts.emplace_back("optimizer");
  }
  if (state.scheduler) {
    put("lr_scheduler.", state.scheduler->state_dict());
    parts.emplace_back("lr_scheduler");
    metadata["tandem.lr_scheduler"] = scheduler_kind(*state.scheduler);
  }
  for (const auto& [name, optimizers] : state.in_backward) {
    put("in_backward." + name + ".", optimizers->state_dict());
    parts.push_back("in_backward." + name);
  }
  put("extra.", state.extra);
  all.insert("checkpoint.step", from_vector<int64_t>({state.step}));
  all.insert("checkpoint.world_size", from_vector<int64_t>({static_cast<int64_t>(world_size)}));
  if (state.rng) {
    const PhiloxState rng = get_rng_state();
    all.insert("checkpoint.rng",
               from_vector<int64_t>({static_cast<int64_t>(rng.seed), static_cast<int64_t>(rng.offset)}));
    parts.emplace_back("rng");
  }
  // insert_or_assign of std::string values: GCC 12 warns (-Wrestrict, a false positive) about
  // assigning a const char* into a map's string.
  metadata.insert_or_assign("tandem.format", std::string(kFormat));
  metadata.insert_or_assign("tandem.format_version", std::string(kVersion));
  metadata.insert_or_assign("tandem.parts", join(parts, ","));
  return all;
}

// A file's entries by section.
struct Sections {
  nn::TensorDict model, optimizer, scheduler, extra, checkpoint;
  std::map<std::string, nn::TensorDict> in_backward;
};

Sections split_sections(const std::string& path, const nn::TensorDict& all) {
  Sections s;
  auto take = [](const std::string& key, const std::string& prefix, nn::TensorDict& into, const Tensor& t) {
    if (!key.starts_with(prefix)) return false;
    into.insert(key.substr(prefix.size()), t);
    return true;
  };
  for (const auto& [key, t] : all) {
    if (take(key, "model.", s.model, t) || take(key, "optimizer.", s.optimizer, t) ||
        take(key, "lr_scheduler.", s.scheduler, t) || take(key, "extra.", s.extra, t) ||
        take(key, "checkpoint.", s.checkpoint, t))
      continue;
    const std::string ib = "in_backward.";
    const size_t dot = key.starts_with(ib) ? key.find('.', ib.size()) : std::string::npos;
    TANDEM_CHECK(dot != std::string::npos && dot > ib.size() && dot + 1 < key.size(),
                 "[checkpoint] '{}': unexpected entry '{}' (not in a section of a checkpoint)", path, key);
    s.in_backward[key.substr(ib.size(), dot - ib.size())].insert(key.substr(dot + 1), t);
  }
  return s;
}

// One integer entry of the "checkpoint." section, or `count` of them.
std::vector<int64_t> integers(const std::string& path, const Sections& s, const std::string& name, int64_t count) {
  const Tensor* t = s.checkpoint.find(name);
  TANDEM_CHECK(t && t->defined() && !t->is_floating_point() && t->numel() == count,
               "[checkpoint] '{}': 'checkpoint.{}' must hold {} integer{}{}", path, name, count, count == 1 ? "" : "s",
               t && t->defined() ? fmt::format(", got {} of shape {}", t->dtype(), t->shape()) : ", and is missing");
  return t->to(i64).to_vector<int64_t>();
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainingState& state, ProcessGroupPtr group) {
  TANDEM_TRACE_SCOPE("checkpoint save", "dist");
  const ProcessGroupPtr g = resolve(std::move(group));
  const int rank = g ? g->rank() : 0, size = g ? g->size() : 1;
  const std::string what = fmt::format("save '{}'", path);
  // Checked on every rank alike before any communication, so a bad call fails everywhere.
  check_in_backward_names(state, what);
  for (const auto& [name, t] : state.extra)
    TANDEM_CHECK(!name.empty() && t.defined(), "[checkpoint] {}: extra entry '{}' is empty or undefined", what, name);
  if (auto* zero = dynamic_cast<ZeroRedundancyOptimizer*>(state.optimizer)) {
    const ProcessGroup& zg = zero->process_group();
    TANDEM_CHECK(zg.size() == size && zg.rank() == rank,
                 "[checkpoint] {}: the ZeroRedundancyOptimizer communicates over another group (rank {} of {}) than "
                 "the checkpoint's (rank {} of {}): pass its group to save_checkpoint",
                 what, zg.rank(), zg.size(), rank, size);
    zero->consolidate_state_dict(0);  // collective: rank 0 gathers every partition
  }
  std::string error;
  if (rank == 0) {
    try {
      nn::Metadata metadata;
      const nn::TensorDict all = build(state, size, metadata);
      // The folder, where it is missing; if it cannot be made, the write below says why.
      const std::filesystem::path folder = std::filesystem::path(path).parent_path();
      std::error_code ec;
      if (!folder.empty()) std::filesystem::create_directories(folder, ec);
      nn::save_safetensors(path, all, metadata);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  bool failed = !error.empty();
  if (g && size > 1) {
    // Every rank waits for rank 0's verdict: none runs ahead of a file it may resume from, and a
    // failed write is an error everywhere rather than a hang at the next collective.
    Tensor status = from_vector<int64_t>({failed ? 1 : 0}).to(g->control_device(state_device(state)));
    g->allreduce(status, ReduceOp::max)->wait();
    failed = status.to(kCPU).item<int64_t>() != 0;
  }
  TANDEM_CHECK(!failed, "[checkpoint] cannot write '{}': {}", path,
               error.empty() ? std::string("rank 0 failed (its error says why)") : error);
}

CheckpointInfo load_checkpoint(const std::string& path, TrainingState& state) {
  TANDEM_TRACE_SCOPE("checkpoint load", "dist");
  std::error_code ec;
  TANDEM_CHECK(std::filesystem::exists(path, ec), "[checkpoint] '{}' does not exist", path);
  nn::Metadata metadata;
  nn::TensorDict all;
  try {
    all = nn::load_safetensors(path, &metadata);
  } catch (const std::exception& e) {
    fail("[checkpoint] cannot read '{}': {}", path, e.what());
  }
  auto meta = [&](const char* key) {
    const auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : it->second;
  };
  TANDEM_CHECK(meta("tandem.format") == kFormat,
               "[checkpoint] '{}' is not a checkpoint (its metadata has no tandem.format \"{}\"): write one with "
               "dist::save_checkpoint{}",
               path, kFormat,
               all.contains("train.position")
                   ? " (this one was written by an older train, which saved its sections by hand: resume it with "
                     "that version, or start afresh)"
                   : "");
  TANDEM_CHECK(meta("tandem.format_version") == kVersion,
               "[checkpoint] '{}' has checkpoint format version '{}'; this build reads {}", path,
               meta("tandem.format_version"), kVersion);
  const std::vector<std::string> parts = split_parts(meta("tandem.parts"));
  const Sections s = split_sections(path, all);
  const int64_t step = integers(path, s, "step", 1)[0];
  const int64_t world_size = integers(path, s, "world_size", 1)[0];
  TANDEM_CHECK(world_size >= 1, "[checkpoint] '{}': 'checkpoint.world_size' is {}", path, world_size);

  // ---- Phase 1: checks that change nothing. Every part that is set must be in the file, and the
  // parts whose load cannot be tried without changing them (the model, the scheduler) are checked
  // here as their load_state_dict checks them, so their loads in phase 3 cannot fail.
  auto require = [&](const std::string& part, const std::string& what) {
    TANDEM_CHECK(std::find(parts.begin(), parts.end(), part) != parts.end(),
                 "[checkpoint] '{}' holds no {}: it was saved with the parts [{}]", path, what, join(parts));
  };
  check_in_backward_names(state, fmt::format("load '{}'", path));
  if (state.model) {
    require("model", "model ('model.')");
    try {
      state.model->check_state_dict(s.model, /*strict=*/true);
    } catch (const Error& e) {
      fail("[checkpoint] '{}': the model ({}) does not fit the file's 'model.' section: {}", path,
           state.model->type_name(), e.what());
    }
  }
  if (state.optimizer) require("optimizer", "optimizer state ('optimizer.')");
  if (state.scheduler) {
    require("lr_scheduler", "LR scheduler ('lr_scheduler.')");
    const std::string kind = scheduler_kind(*state.scheduler);
    TANDEM_CHECK(meta("tandem.lr_scheduler") == kind,
                 "[checkpoint] '{}': the LR scheduler is a {}, the file holds a {}'s state", path, kind,
                 meta("tandem.lr_scheduler"));
    try {
      state.scheduler->check_state_dict(s.scheduler);
    } catch (const Error& e) {
      fail("[checkpoint] '{}': the LR scheduler ({}) does not fit the file's 'lr_scheduler.' section: {}", path,
           kind, e.what());
    }
  }
  for (const auto& [name, optimizers] : state.in_backward)
    require("in_backward." + name, fmt::format("optimizers in backward '{}' ('in_backward.{}.')", name, name));
  PhiloxState rng;
  if (state.rng) {
    require("rng", "random generator state ('checkpoint.rng')");
    const std::vector<int64_t> r = integers(path, s, "rng", 2);
    rng = {static_cast<uint64_t>(r[0]), static_cast<uint64_t>(r[1])};
  }

  // ---- Phase 2: the parts that check a state dict only while loading it, and change nothing when
  // it does not fit: the optimizers in backward, then the optimizer. Each in-backward part's state
  // is kept before it loads (state_dict aliases the buffers that load_state_dict replaces, never
  // writes), and put back when a later one of these fails; the optimizer goes last, so nothing that
  // may still fail follows it.
  const nn::TensorDict empty;
  auto section_of = [&](const std::string& name) -> const nn::TensorDict& {
    const auto it = s.in_backward.find(name);
    return it == s.in_backward.end() ? empty : it->second;
  };
  std::vector<std::pair<optim::InBackwardOptimizers*, nn::TensorDict>> loaded;
  auto put_back = [&] {
    for (auto it = loaded.rbegin(); it != loaded.rend(); ++it) it->first->load_state_dict(it->second);
  };
  for (const auto& [name, optimizers] : state.in_backward) {
    nn::TensorDict before = optimizers->state_dict();
    try {
      optimizers->load_state_dict(section_of(name));
    } catch (const std::exception& e) {
      put_back();
      fail("[checkpoint] '{}': the optimizers in backward '{}' do not fit the file's 'in_backward.{}.' section: {}",
           path, name, name, e.what());
    }
    loaded.emplace_back(optimizers, std::move(before));
  }
  if (state.optimizer) {
    try {
      state.optimizer->load_state_dict(s.optimizer);
    } catch (const std::exception& e) {
      put_back();
      fail("[checkpoint] '{}': the optimizer ({}) does not fit the file's 'optimizer.' section: {}", path,
           state.optimizer->name(), e.what());
    }
  }

  // ---- Phase 3: what was checked in phase 1 and cannot fail now. The scheduler after the
  // optimizer: its rates for the loaded epoch replace the learning rates the optimizer's state set.
  if (state.model) state.model->load_state_dict(s.model, /*strict=*/true);
  if (state.scheduler) state.scheduler->load_state_dict(s.scheduler);
  if (state.rng) set_rng_state(rng);
  state.extra = s.extra;
  state.step = step;
  return {step, static_cast<int>(world_size)};
}

}  // namespace tandem::dist
