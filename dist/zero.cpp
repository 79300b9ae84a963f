#include "dist/zero.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <numeric>
#include <type_traits>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/trace.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"
#include "nn/lr_scheduler.h"
#include "nn/utils.h"

namespace tandem::dist {

namespace {

constexpr const char* kName = "ZeroRedundancyOptimizer";
// A parameter at least this big is broadcast in place, alone: packing it would copy it twice and
// hold a temporary (which the allocator may keep resident: the state memory ZeRO saves).
constexpr int64_t kInPlaceBytes = int64_t{1} << 20;

template <class O>
constexpr bool is_sgd = std::is_same_v<O, optim::SGDOptions>;

std::vector<std::pair<std::string, double>> hyperparameters_of(const optim::OptimizerSpec& spec) {
  return std::visit(
      [](const auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, optim::AdamWOptions>) {
          return optim::AdamOptions(o).hyperparameters();
        } else {
          return o.hyperparameters();
        }
      },
      spec);
}

// The local optimizer: one group per ZeRO group (empty where this rank owns none of it).
std::unique_ptr<optim::Optimizer> make_local(const std::vector<ZeroParamGroup>& groups,
                                             const std::vector<TensorList>& local) {
  return std::visit(
      [&](const auto& first) -> std::unique_ptr<optim::Optimizer> {
        using O = std::decay_t<decltype(first)>;
        if constexpr (is_sgd<O>) {
          std::vector<optim::SGD::Group> g;
          for (size_t k = 0; k < groups.size(); ++k) g.push_back({local[k], std::get<O>(groups[k].spec)});
          return std::make_unique<optim::SGD>(std::move(g));
        } else {
          std::vector<optim::Adam::Group> g;
          for (size_t k = 0; k < groups.size(); ++k) g.push_back({local[k], optim::AdamOptions(std::get<O>(groups[k].spec))});
          if constexpr (std::is_same_v<O, optim::AdamOptions>) {
            return std::make_unique<optim::Adam>(std::move(g));
          } else {
            return std::make_unique<optim::AdamW>(std::move(g));
          }
        }
      },
      groups.front().spec);
}

// The elements of a [n] i64 vector, reduced with max over the group.
std::vector<int64_t> max_over_ranks(ProcessGroup& g, Device device, std::vector<int64_t> v) {
  Tensor t = from_vector<int64_t>(v, {static_cast<int64_t>(v.size())}).to(g.control_device(device));
  g.allreduce(t, ReduceOp::max)->wait();
  return t.to(kCPU).to_vector<int64_t>();
}

}  // namespace

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(const TensorList& params, const optim::OptimizerSpec& spec,
                                                 ProcessGroupPtr group, ZeroOptions options)
    : ZeroRedundancyOptimizer(std::vector<ZeroParamGroup>{{params, spec}}, std::move(group), options) {}

ZeroRedundancyOptimizer::ZeroRedundancyOptimizer(std::vector<ZeroParamGroup> groups, ProcessGroupPtr group,
                                                 ZeroOptions options)
    : Optimizer(kName), group_(std::move(group)), options_(options), groups_(std::move(groups)) {
  if (!group_) {
    TANDEM_CHECK(is_initialized(), "[{}] no process group given and dist::init() has not run", kName);
    group_ = world();
  }
  TANDEM_CHECK(!groups_.empty(), "[{}] got no parameter group", kName);
  TANDEM_CHECK(options_.bucket_cap_mb > 0, "[{}] bucket_cap_mb must be positive, got {}", kName, options_.bucket_cap_mb);
  for (size_t g = 0; g < groups_.size(); ++g) {
    TANDEM_CHECK(groups_[g].spec.index() == groups_[0].spec.index(),
                 "[{}] every group must use the same optimizer (SGD, Adam or AdamW); group {} differs from group 0",
                 kName, g);
    std::visit(
        [](const auto& o) {
          if constexpr (std::is_same_v<std::decay_t<decltype(o)>, optim::AdamWOptions>) {
            optim::AdamOptions(o).validate();
          } else {
            o.validate();
          }
        },
        groups_[g].spec);
    params_.insert(params_.end(), groups_[g].params.begin(), groups_[g].params.end());
  }
  TANDEM_CHECK(!params_.empty(), "[{}] got no parameters", kName);
  std::unordered_set<const TensorImpl*> seen;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    TANDEM_CHECK(p.defined(), "[{}] parameter {} is undefined", kName, i);
    TANDEM_CHECK(p.is_floating_point(), "[{}] can only optimize floating tensors, parameter {} is {}", kName, i,
                 p.dtype());
    TANDEM_CHECK(seen.insert(p.impl()).second, "[{}] parameter {} appears more than once", kName, i);
    index_of_.emplace(p.impl(), i);
  }
  // The same parameters on every rank: counts and element totals agree (one allreduce).
  int64_t total = 0;
  for (const Tensor& p : params_) total += p.numel();
  const auto n = static_cast<int64_t>(params_.size());
  const std::vector<int64_t> got = max_over_ranks(*group_, params_.front().device(), {n, total, -n, -total});
  TANDEM_CHECK(got[0] == -got[2] && got[1] == -got[3],
               "[{}] the ranks pass different parameters: between {} and {} tensors of {} to {} elements in all (rank "
               "{} has {} of {}); every rank must pass the same model's parameters",
               kName, -got[2], got[0], -got[3], got[1], group_->rank(), n, total);
  partition();
  std::vector<TensorList> local(groups_.size());
  size_t i = 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (size_t k = 0; k < groups_[g].params.size(); ++k, ++i)
      if (owner_[i] == group_->rank()) local[g].push_back(params_[i]);
  local_ = make_local(groups_, local);
  if (options_.overlap_with_ddp) register_overlap_steps();
  clip_watch_ = nn::utils::observe_gradient_clipping(
      params_, {.check = [this](const TensorList& clipped) { check_clip(clipped); },
                .done = [this](const TensorList& clipped, double max_norm, double norm_type) {
                  record_clip(clipped, max_norm, norm_type);
                }});
}

// Whether a clip is repeated: under a Join, on a rank still training (a joined rank is repeating).
bool ZeroRedundancyOptimizer::records_clips() const {
  const Join* join = join_context();
  return join != nullptr && !join->joined();
}

void ZeroRedundancyOptimizer::check_clip(const TensorList& clipped) const {
  if (!records_clips()) return;
  for (const Tensor& p : clipped)
    TANDEM_CHECK(index_of_.count(p.impl()),
                 "[{}] under a Join, clip_grad_norm_ may clip only this optimizer's parameters: it also clips the "
                 "gradient of a tensor of shape {} the optimizer does not hold, which a rank that has run out of "
                 "data cannot clip as the others do. Clip opt.parameters(), or clip outside the Join",
                 kName, p.shape());
}

void ZeroRedundancyOptimizer::record_clip(const TensorList& clipped, double max_norm, double norm_type) {
  if (!records_clips()) return;
  clips_.insert(clips_.end(), {max_norm, norm_type, static_cast<double>(clipped.size())});
  for (const Tensor& p : clipped) clips_.push_back(static_cast<double>(index_of_.at(p.impl())));
}

void ZeroRedundancyOptimizer::register_overlap_steps() {
  stepped_.assign(params_.size(), 0);
  has_step_.assign(params_.size(), 0);
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.requires_grad()) continue;  // frozen: never gets a gradient, never stepped
    TANDEM_CHECK(p.is_leaf(), "[{}] overlap_with_ddp: parameter {} (shape {}) is not a leaf", kName, i, p.shape());
    // Every rank marks the parameter stepped, its owner also steps it (the others get it from
    // the broadcast in step()): a second synchronised backward before step() is then an error on
    // every rank at the same parameter, where DDP + the plain optimizer would have accumulated.
    const bool mine = owner_[i] == group_->rank();
    has_step_[i] = 1;
    std::function<void()> step = [this, p, i, mine] {
      std::lock_guard lock(local_mutex_);
      TANDEM_CHECK(!stepped_[i],
                   "[{}] overlap_with_ddp: parameter {} (shape {}) was reduced again before step(): call step() after "
                   "every synchronised backward (accumulate gradients under no_sync)",
                   kName, i, p.shape());
      stepped_[i] = 1;
      if (mine) local_->step_only(p);
    };
    steps.push_back(std::make_shared<optim::InBackwardStep>(p, std::move(step), /*keep_grads=*/false));
  }
  overlap_ = optim::register_in_backward_steps(std::move(steps), kName);
}

ZeroRedundancyOptimizer::~ZeroRedundancyOptimizer() {
  if (overlap_) overlap_->remove();  // a step in flight ends first; none starts after
}

void ZeroRedundancyOptimizer::partition() {
  // Largest first, each to the rank with the fewest elements so far (the lowest on a tie), as
  // PyTorch's partition by size: every rank computes the same assignment.
  const int world = group_->size();
  std::vector<size_t> order(params_.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return params_[a].numel() > params_[b].numel(); });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  owner_.assign(params_.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_[i] = static_cast<int>(r);
    load[r] += params_[i].numel();
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    if (owner_[i] != group_->rank()) continue;
    local_params_.push_back(params_[i]);
    local_index_.push_back(i);
  }
}

const TensorList& ZeroRedundancyOptimizer::group_params(size_t group) const {
  TANDEM_CHECK(group < groups_.size(), "[{}] has {} parameter groups, not {}", kName, groups_.size(), group + 1);
  return groups_[group].params;
}

double ZeroRedundancyOptimizer::lr(size_t group) const {
  TANDEM_CHECK(group < groups_.size(), "[{}] has {} parameter groups, not {}", kName, groups_.size(), group + 1);
  return std::visit([](const auto& o) { return o.lr; }, groups_[group].spec);
}

void ZeroRedundancyOptimizer::set_lr(double lr) {
  for (size_t g = 0; g < groups_.size(); ++g) set_lr(g, lr);
}

void ZeroRedundancyOptimizer::set_lr(size_t group, double lr) { set_group_hyperparameter(group, "lr", lr); }

std::vector<std::pair<std::string, double>> ZeroRedundancyOptimizer::group_hyperparameters(size_t group) const {
  TANDEM_CHECK(group < groups_.size(), "[{}] has {} parameter groups, not {}", kName, groups_.size(), group + 1);
  return hyperparameters_of(groups_[group].spec);
}

void ZeroRedundancyOptimizer::set_group_hyperparameter(size_t group, const std::string& name, double value) {
  TANDEM_CHECK(group < groups_.size(), "[{}] has {} parameter groups, not {}", kName, groups_.size(), group + 1);
  std::visit(
      [&](auto& o) {
        using O = std::decay_t<decltype(o)>;
        if constexpr (std::is_same_v<O, optim::AdamWOptions>) {
          optim::AdamOptions a = o;
          a.set_hyperparameter(name, value);
          o = optim::AdamWOptions{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.amsgrad, a.maximize};
        } else {
          o.set_hyperparameter(name, value);
        }
      },
      groups_[group].spec);
  push_options();
}

void ZeroRedundancyOptimizer::push_options() {
  if (!local_) return;
  std::lock_guard lock(local_mutex_);  // overlap_with_ddp: not while a step in backward runs
  for (size_t g = 0; g < groups_.size(); ++g) {
    std::visit(
        [&](const auto& o) {
          using O = std::decay_t<decltype(o)>;
          if constexpr (is_sgd<O>) {
            static_cast<optim::SGD&>(*local_).param_groups().at(g).options = o;
          } else {
            static_cast<optim::Adam&>(*local_).param_groups().at(g).options = optim::AdamOptions(o);
          }
        },
        groups_[g].spec);
  }
}

std::vector<std::string> ZeroRedundancyOptimizer::state_names() const {
  if (std::holds_alternative<optim::SGDOptions>(groups_.front().spec)) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

bool ZeroRedundancyOptimizer::counts_steps() const {
  return !std::holds_alternative<optim::SGDOptions>(groups_.front().spec);
}

int64_t ZeroRedundancyOptimizer::local_state_bytes() const {
  std::lock_guard lock(local_mutex_);  // overlap_with_ddp: not while a step in backward runs
  int64_t bytes = 0;
  for (const Tensor& p : local_params_)
    if (const optim::ParamState* st = local_->state(p))
      for (const auto& [name, t] : st->buffers) bytes += static_cast<int64_t>(t.nbytes());
  return bytes;
}

Device ZeroRedundancyOptimizer::join_device() const { return params_.front().device(); }

ProcessGroup& ZeroRedundancyOptimizer::join_group() {
  // Every rank makes the Join, so every rank raises here, before any collective.
  TANDEM_CHECK(!overlap_, "[{}] overlap_with_ddp does not work under a Join (the steps run inside DDP's "
               "reductions, which joined ranks only shadow)", kName);
  return *group_;
}

void ZeroRedundancyOptimizer::step() {
  Join* join = join_context();
  if (overlap_) {
    TANDEM_CHECK(join == nullptr, "[{}] overlap_with_ddp does not work under a Join", kName);
    for (const auto& s : overlap_->steps()) {
      if (s->taken_over()) continue;
      const auto i = std::find_if(params_.begin(), params_.end(),
                                  [&](const Tensor& p) { return p.impl() == s->parameter().impl(); }) -
                     params_.begin();
      fail("[{}] overlap_with_ddp: no DistributedDataParallel steps parameter {} (shape {}) in backward: make the "
           "DistributedDataParallel after the ZeroRedundancyOptimizer, over the same parameters",
           kName, i, s->parameter().shape());
    }
    {
      // A parameter frozen when this optimizer was made has no step in backward: if it trains
      // now, nobody would update it.
      std::lock_guard lock(local_mutex_);
      for (size_t i = 0; i < params_.size(); ++i) {
        TANDEM_CHECK(has_step_[i] || !params_[i].grad().defined(),
                     "[{}] overlap_with_ddp: parameter {} (shape {}) has a gradient but no step in backward (it did "
                     "not require grad when the optimizer was made)",
                     kName, i, params_[i].shape());
        stepped_[i] = 0;
      }
    }
    TANDEM_TRACE_SCOPE("zero step (overlapped)", "optim");
    state_.clear();  // a consolidated state is a snapshot: stale after the steps in backward
    consolidated_on_ = -1;
    NoGradGuard no_grad;
    broadcast_partitions();
    return;
  }
  step_partition_and_broadcast(join ? join->authority() : -1);
}

void ZeroRedundancyOptimizer::step_partition_and_broadcast(int hyperparameters_from) {
  TANDEM_TRACE_SCOPE("zero step", "optim");
  // A consolidated state is a snapshot: stale after this step.
  state_.clear();
  consolidated_on_ = -1;
  if (hyperparameters_from >= 0) sync_under_join(hyperparameters_from, /*replay_clips=*/join_context()->joined());
  clips_.clear();
  NoGradGuard no_grad;
  local_->step();
  broadcast_partitions();
}

void ZeroRedundancyOptimizer::join_attached() {
  // Every rank must hold the same schedulers (their positions travel in a message of that many
  // entries): checked once, on every rank alike, when the Join is made.
  const auto n = static_cast<int64_t>(schedulers().size());
  const std::vector<int64_t> got = max_over_ranks(*group_, join_device(), {n, -n});
  TANDEM_CHECK(got[0] == -got[1],
               "[{}] under a Join every rank must build the same learning-rate schedulers on the optimizer: the "
               "ranks hold between {} and {} (rank {} has {})",
               kName, -got[1], got[0], group_->rank(), n);
}

void ZeroRedundancyOptimizer::sync_under_join(int root, bool replay_clips) {
  // One message of a size every rank knows: [the groups' hyperparameters, the schedulers'
  // epochs, the length of the clips' description]; then that description, when there are clips.
  std::vector<double> head;
  for (const ZeroParamGroup& g : groups_)
    for (const auto& [name, v] : hyperparameters_of(g.spec)) head.push_back(v);
  const std::vector<optim::LRScheduler*>& schedulers = this->schedulers();
  for (const optim::LRScheduler* s : schedulers) head.push_back(static_cast<double>(s->last_epoch()));
  head.push_back(static_cast<double>(clips_.size()));
  const Device control = group_->control_device(join_device());
  CollectiveTag tag("zero hyperparameters");
  Tensor t = from_vector<double>(head, {static_cast<int64_t>(head.size())}).to(control);
  group_->broadcast(t, root)->wait();
  const std::vector<double> got = t.to(kCPU).to_vector<double>();
  std::vector<double> clips;
  if (const auto n = static_cast<int64_t>(got.back()); n > 0) {
    Tensor c = (group_->rank() == root ? from_vector<double>(clips_, {n}) : zeros({n}, f64)).to(control);
    group_->broadcast(c, root)->wait();
    clips = c.to(kCPU).to_vector<double>();
  }
  size_t k = 0;
  for (size_t g = 0; g < groups_.size(); ++g)
    for (const auto& [name, v] : hyperparameters_of(groups_[g].spec)) {
      if (got[k] != v) set_group_hyperparameter(g, name, got[k]);
      ++k;
    }
  for (optim::LRScheduler* s : schedulers) s->set_last_epoch(static_cast<int64_t>(got[k++]));
  if (!replay_clips) return;
  NoGradGuard no_grad;
  k = 0;
  while (k < clips.size()) {  // each call as the rank still training made it, on the same averages
    const double max_norm = clips[k], norm_type = clips[k + 1];
    const auto n = static_cast<size_t>(clips[k + 2]);
    k += 3;
    TensorList clipped;
    for (size_t j = 0; j < n; ++j) clipped.push_back(params_.at(static_cast<size_t>(clips[k++])));
    nn::utils::clip_grad_norm_(clipped, max_norm, norm_type);
  }
}

void ZeroRedundancyOptimizer::broadcast_partitions() {
  TANDEM_TRACE_SCOPE("zero broadcast", "dist");
  const int world = group_->size(), rank = group_->rank();
  if (world == 1) return;
  const auto cap = static_cast<int64_t>(options_.bucket_cap_mb * (1 << 20));
  struct Bucket {
    int root = 0;
    std::vector<size_t> params;
    Tensor flat;  // undefined: the one parameter is broadcast in place
    WorkPtr work;
  };
  std::deque<Bucket> pending;
  auto finish = [&](Bucket& b) {
    b.work->wait();
    if (!b.flat.defined() || b.root == rank) return;
    int64_t at = 0;
    for (size_t i : b.params) {
      const Tensor& p = params_[i];
      p.detach().copy_(b.flat.narrow(0, at, p.numel()).reshape(p.shape()));
      at += p.numel();
    }
  };
  auto issue = [&](Bucket b) {
    if (b.params.size() == 1 && params_[b.params[0]].is_contiguous()) {
      CollectiveTag tag("zero parameters of rank", static_cast<int64_t>(b.root));
      b.work = group_->broadcast(params_[b.params[0]].detach(), b.root);
    } else {
      int64_t n = 0;
      for (size_t i : b.params) n += params_[i].numel();
      const Tensor& first = params_[b.params[0]];
      b.flat = empty({n}, TensorOptions(first.dtype(), first.device()));
      if (b.root == rank) {
        int64_t at = 0;
        for (size_t i : b.params) {
          const Tensor& p = params_[i];
          b.flat.narrow(0, at, p.numel()).copy_(p.detach().reshape({p.numel()}));
          at += p.numel();
        }
      }
      CollectiveTag tag("zero parameters of rank", static_cast<int64_t>(b.root));
      b.work = group_->broadcast(b.flat, b.root);
    }
    pending.push_back(std::move(b));
    // At most two buckets in flight: the temporary buffers stay within two bucket caps.
    while (pending.size() > 2) {
      finish(pending.front());
      pending.pop_front();
    }
  };
  // Every owner's parameters in index order, packed into buckets of one dtype and device.
  for (int r = 0; r < world; ++r) {
    Bucket b;
    b.root = r;
    int64_t bytes = 0;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (owner_[i] != r) continue;
      const Tensor& p = params_[i];
      const auto nbytes = static_cast<int64_t>(p.nbytes());
      if (nbytes >= kInPlaceBytes && p.is_contiguous()) {  // no copy, no temporary: alone, in place
        Bucket alone;
        alone.root = r;
        alone.params.push_back(i);
        issue(std::move(alone));
        continue;
      }
      const bool fits = !b.params.empty() && params_[b.params[0]].dtype() == p.dtype() &&
                        params_[b.params[0]].device() == p.device() && bytes + nbytes <= cap;
      if (!b.params.empty() && !fits) {
        issue(std::move(b));
        b = Bucket{};
        b.root = r;
        bytes = 0;
      }
      b.params.push_back(i);
      bytes += nbytes;
    }
    if (!b.params.empty()) issue(std::move(b));
  }
  while (!pending.empty()) {
    finish(pending.front());
    pending.pop_front();
  }
}

void ZeroRedundancyOptimizer::consolidate_state_dict(int to) {
  std::lock_guard lock(local_mutex_);  // overlap_with_ddp: not while a step in backward runs
  const int world = group_->size(), rank = group_->rank();
  TANDEM_CHECK(to >= 0 && to < world, "[{}] consolidate_state_dict: rank {} is not in the group of {} ranks", kName, to,
               world);
  TANDEM_TRACE_SCOPE("zero consolidate state", "dist");
  state_.clear();
  consolidated_on_ = to;
  const std::vector<std::string> names = state_names();
  NoGradGuard no_grad;
  for (int r = 0; r < world; ++r) {
    if (r != rank && rank != to) continue;
    std::vector<size_t> owned;
    for (size_t i = 0; i < params_.size(); ++i)
      if (owner_[i] == r) owned.push_back(i);
    if (r == rank && r == to) {  // this rank's own partition: copied
      for (size_t i : owned)
        if (const optim::ParamState* st = local_->state(params_[i])) {
          optim::ParamState& mine = state_[params_[i].impl()];
          mine.step = st->step;
          for (const auto& [name, t] : st->buffers) mine.buffers.insert(name, t.detach().clone());
        }
      continue;
    }
    // Per owned parameter: whether it has state, its step count, and a mask of the buffers present.
    const Device control = group_->control_device(join_device());
    Tensor meta = zeros({static_cast<int64_t>(3 * owned.size())}, TensorOptions(i64, control));
    if (r == rank) {  // the owner sends to `to`
      std::vector<int64_t> m;
      TensorList buffers;
      for (size_t i : owned) {
        const optim::ParamState* st = local_->state(params_[i]);
        int64_t mask = 0;
        for (size_t k = 0; st && k < names.size(); ++k) {
          if (!st->buffers.contains(names[k])) continue;
          mask |= int64_t{1} << k;
          const Tensor& p = params_[i];
          buffers.push_back(to_dtype(st->buffers.at(names[k]).detach(), p.dtype()).to(p.device()).contiguous());
        }
        m.insert(m.end(), {st ? 1 : 0, st ? st->step : 0, mask});
      }
      if (!m.empty()) meta.copy_(from_vector<int64_t>(m, {static_cast<int64_t>(m.size())}).to(control));
      group_->send(meta, to)->wait();
      std::vector<WorkPtr> works;
      for (const Tensor& t : buffers) works.push_back(group_->send(t, to));
      for (const WorkPtr& w : works) w->wait();
      continue;
    }
    // rank == to: receive r's partition.
    group_->recv(meta, r)->wait();
    const std::vector<int64_t> m = meta.to(kCPU).to_vector<int64_t>();
    std::vector<std::pair<optim::ParamState*, std::string>> into;
    TensorList received;
    std::vector<WorkPtr> works;
    for (size_t k = 0; k < owned.size(); ++k) {
      if (m[3 * k] == 0) continue;
      const Tensor& p = params_[owned[k]];
      optim::ParamState& st = state_[p.impl()];
      st.step = m[3 * k + 1];
      for (size_t b = 0; b < names.size(); ++b) {
        if (!(m[3 * k + 2] & (int64_t{1} << b))) continue;
        Tensor t = empty(p.shape(), TensorOptions(p.dtype(), p.device()));
        works.push_back(group_->recv(t, r));
        st.buffers.insert(names[b], t);
      }
    }
    for (const WorkPtr& w : works) w->wait();
  }
}

nn::TensorDict ZeroRedundancyOptimizer::state_dict() const {
  TANDEM_CHECK(consolidated_on_ == group_->rank(),
               "[{}] state_dict() on rank {}: the state is sharded; call consolidate_state_dict({}) on every rank "
               "first (after the last step), then state_dict() on that rank{}",
               kName, group_->rank(), group_->rank(),
               consolidated_on_ >= 0 ? fmt::format(" (it was consolidated on rank {})", consolidated_on_) : "");
  return Optimizer::state_dict();
}

void ZeroRedundancyOptimizer::load_state_dict(const nn::TensorDict& sd) {
  Optimizer::load_state_dict(sd);  // checks everything against all parameters, then holds all their state
  // This rank's partition into the local optimizer, indexed as it knows its parameters.
  nn::TensorDict local;
  const bool steps = counts_steps();
  for (size_t j = 0; j < local_index_.size(); ++j) {
    const auto it = state_.find(params_[local_index_[j]].impl());
    if (it == state_.end()) continue;
    if (steps) local.insert(fmt::format("state.{}.step", j), scalar_tensor(static_cast<double>(it->second.step), f64));
    for (const auto& [name, t] : it->second.buffers) local.insert(fmt::format("state.{}.{}", j, name), t);
  }
  int64_t first = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const auto n = static_cast<int64_t>(local_->group_params(g).size());
    local.insert(fmt::format("param_groups.{}.params", g), arange(first, first + n, TensorOptions(i64)));
    first += n;
    for (const auto& [name, v] : hyperparameters_of(groups_[g].spec))
      local.insert(fmt::format("param_groups.{}.{}", g, name), scalar_tensor(v, f64));
  }
  {
    std::lock_guard lock(local_mutex_);  // overlap_with_ddp: not while a step in backward runs
    local_->load_state_dict(local);
  }
  state_.clear();
  consolidated_on_ = -1;
}

void ZeroRedundancyOptimizer::join_shadow(const JoinIteration& it) {
  if (!(it.flags & Join::kSynchronises)) return;
  TANDEM_CHECK(!overlap_, "[{}] overlap_with_ddp does not work under a Join", kName);
  // The step the ranks still training take after this iteration's reduction, on the gradients
  // the joinables before this one (DDP) left; then .grad is dropped, as their zero_grad() does.
  step_partition_and_broadcast(it.authority());
  zero_grad(/*set_to_none=*/true);
}

void ZeroRedundancyOptimizer::join_finish(int authority) {
  // The parameters and state already agree everywhere; the hyperparameters and schedulers a
  // schedule stepped after the last step on the ranks still training do not yet on the joined ones.
  if (authority >= 0 && group_->size() > 1) sync_under_join(authority, /*replay_clips=*/false);
  clips_.clear();
}

}  // namespace tandem::dist
