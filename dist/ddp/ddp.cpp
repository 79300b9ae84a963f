#include "dist/ddp/ddp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <set>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/trace.h"
#include "dist/ddp/detail/delayed_allreduce.h"
#include "dist/ddp/detail/param_shadows.h"
#include "dist/ddp/detail/reducer.h"
#include "dist/flight_recorder.h"
#include "dist/init.h"

namespace tandem::dist {

namespace {

// One rank's model as integers: [count, then per parameter: requires_grad, dtype, ndim, dims...].
std::vector<int64_t> model_signature(const std::vector<std::pair<std::string, Tensor>>& params) {
  std::vector<int64_t> sig{static_cast<int64_t>(params.size())};
  for (const auto& [name, t] : params) {
    sig.push_back(t.requires_grad() ? 1 : 0);
    sig.push_back(static_cast<int64_t>(t.dtype()));
    sig.push_back(t.dim());
    for (int64_t d : t.shape()) sig.push_back(d);
  }
  return sig;
}

struct ParamSig {
  bool requires_grad;
  Dtype dtype;
  Shape shape;
  std::string str() const { return fmt::format("{} {}{}", shape, dtype, requires_grad ? "" : " (requires_grad=false)"); }
  bool operator==(const ParamSig&) const = default;
};

std::vector<ParamSig> decode_signature(const int64_t* sig) {
  std::vector<ParamSig> out(static_cast<size_t>(sig[0]));
  size_t at = 1;
  for (ParamSig& p : out) {
    p.requires_grad = sig[at++] != 0;
    p.dtype = static_cast<Dtype>(sig[at++]);
    int64_t ndim = sig[at++];
    Shape s;
    for (int64_t k = 0; k < ndim; ++k) s.push_back(sig[at++]);
    p.shape = s;
  }
  return out;
}

}  // namespace

// Which parameters the buckets manage, which the delayed reduction, which no one (frozen or
// ignored), and what every rank must agree on.
struct DistributedDataParallel::Partition {
  std::vector<Reducer::Param> managed;           // bucketed, registration order
  std::vector<DelayedAllreduce::Param> delayed;  // delay_all_reduce_named_params
  Tensor hook_param;                             // param_to_hook_all_reduce
  std::vector<std::pair<std::string, Tensor>> signature;  // every parameter not ignored
};

// The steps, in order: argument errors first (before any collective, so that every rank fails the
// same way at once), then the one sync of construction, then the machinery: the mixed-precision
// shadows, the delayed reduction, the bucket reducer.
DistributedDataParallel::DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroupPtr group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TANDEM_CHECK(module_ != nullptr, "[ddp] the module is null");
  if (!group_) {
    TANDEM_CHECK(is_initialized(), "[ddp] no process group given and dist::init() has not run");
    group_ = world();
  }
  if (options_.bucket_cap_mb) {
    TANDEM_CHECK(*options_.bucket_cap_mb > 0, "[ddp] bucket_cap_mb must be positive, got {}", *options_.bucket_cap_mb);
  }
  Partition parts = partition_parameters();
  const std::optional<Dtype> reduce_dtype = check_mixed_precision(parts);
  {
    TANDEM_TRACE_SCOPE("ddp construction sync", "ddp");
    verify_same_model_across_ranks(parts.signature);
    broadcast_states(options_.broadcast_buffers);
  }
  if (options_.mixed_precision) make_shadows(parts);
  if (!parts.delayed.empty()) set_up_delayed(parts, reduce_dtype);
  if (parts.managed.empty()) {  // every parameter is delayed: no buckets at all
    delayed_->on_adopt(adoption_steps());
    return;
  }
  set_up_reducer(parts, reduce_dtype);
}

DistributedDataParallel::Partition DistributedDataParallel::partition_parameters() {
  const auto params = module_->named_parameters();
  const auto buffers = module_->named_buffers();
  for (const std::string& name : options_.ignored_parameters) {
    TANDEM_CHECK(params.contains(name) || buffers.contains(name),
                 "[ddp] ignored name '{}' is neither a parameter nor a buffer of the module", name);
  }
  Partition parts;
  for (const auto& [name, t] : params) {
    if (ignored(name)) continue;
    parts.signature.emplace_back(name, t);
    if (!t.requires_grad()) continue;
    parts.managed.push_back({name, t});
    names_.push_back(name);
  }
  TANDEM_CHECK(!parts.managed.empty(),
               "[ddp] DDP is not needed when a module has no parameter that requires a gradient ({} has none that is "
               "not ignored)",
               module_->type_name());
  const auto& delayed_names = options_.delay_all_reduce_named_params;
  TANDEM_CHECK(delayed_names.empty() == options_.param_to_hook_all_reduce.empty(),
               "[ddp] delay_all_reduce_named_params and param_to_hook_all_reduce go together: got {} delayed "
               "parameters and hook parameter '{}'",
               delayed_names.size(), options_.param_to_hook_all_reduce);
  for (const std::string& name : delayed_names) {
    auto it = std::find_if(parts.managed.begin(), parts.managed.end(),
                           [&](const Reducer::Param& p) { return p.name == name; });
    TANDEM_CHECK(it != parts.managed.end(),
                 "[ddp] delay_all_reduce_named_params names '{}', which is not a parameter DDP manages (one that "
                 "requires a gradient and is not ignored)",
                 name);
    parts.delayed.push_back({it->name, it->tensor});
    parts.managed.erase(it);
  }
  if (!options_.param_to_hook_all_reduce.empty()) {
    const Tensor* found = params.find(options_.param_to_hook_all_reduce);
    TANDEM_CHECK(found && found->requires_grad() && !ignored(options_.param_to_hook_all_reduce),
                 "[ddp] param_to_hook_all_reduce '{}' is not a parameter of the module that requires a gradient and "
                 "is not ignored",
                 options_.param_to_hook_all_reduce);
    parts.hook_param = *found;
  }
  return parts;
}

std::optional<Dtype> DistributedDataParallel::check_mixed_precision(const Partition& parts) const {
  if (!options_.mixed_precision) return std::nullopt;
  const MixedPrecision& mp = *options_.mixed_precision;
  auto low = [](std::optional<Dtype> d) { return d && (*d == f16 || *d == bf16); };
  TANDEM_CHECK(low(mp.param_dtype), "[ddp] mixed_precision.param_dtype must be f16 or bf16, got {}",
               mp.param_dtype ? fmt::format("{}", *mp.param_dtype) : std::string("none"));
  TANDEM_CHECK(!mp.reduce_dtype || low(mp.reduce_dtype) || *mp.reduce_dtype == f32,
               "[ddp] mixed_precision.reduce_dtype must be f16, bf16 or f32, got {}", *mp.reduce_dtype);
  TANDEM_CHECK(!mp.buffer_dtype || is_floating(*mp.buffer_dtype),
               "[ddp] mixed_precision.buffer_dtype must be a floating dtype, got {}", *mp.buffer_dtype);
  const Dtype reduce_dtype = mp.reduce_dtype.value_or(*mp.param_dtype);
  for (const auto& d : parts.delayed)
    TANDEM_CHECK(d.tensor.dtype() == f32 || d.tensor.dtype() == f64,
                 "[ddp] mixed_precision keeps f32 (or f64) masters, but parameter '{}' is {}", d.name, d.tensor.dtype());
  for (const auto& m : parts.managed) {
    TANDEM_CHECK(m.tensor.dtype() == f32 || m.tensor.dtype() == f64,
                 "[ddp] mixed_precision keeps f32 (or f64) masters, but parameter '{}' is {}", m.name, m.tensor.dtype());
    TANDEM_CHECK(!options_.gradient_as_bucket_view || reduce_dtype == m.tensor.dtype(),
                 "[ddp] gradient_as_bucket_view needs buckets in the masters' dtype ({}), but mixed_precision "
                 "reduces in {}: set reduce_dtype to {} or turn gradient_as_bucket_view off",
                 m.tensor.dtype(), reduce_dtype, m.tensor.dtype());
  }
  return reduce_dtype;
}

// Optimizer in backward: DDP steps each managed parameter after its reduction (the local hook no
// longer does), and applying one after this point is an error.
std::shared_ptr<optim::InBackwardStep> DistributedDataParallel::take_over(const Tensor& p) {
  optim::claim_gradient(p, "DistributedDataParallel");
  claims_.params.push_back(p);
  auto step = optim::take_over_in_backward_step(p, "DistributedDataParallel");
  optimizer_in_backward_ = optimizer_in_backward_ || step != nullptr;
  return step;
}

// Mixed precision: one shadow per parameter, bucketed ones first (index i is the reducer's
// parameter i), then the delayed ones, then the frozen ones (cast and restored, no gradient).
void DistributedDataParallel::make_shadows(const Partition& parts) {
  const MixedPrecision& mp = *options_.mixed_precision;
  TensorList shadowed;
  for (const auto& m : parts.managed) shadowed.push_back(m.tensor);
  for (const auto& d : parts.delayed) shadowed.push_back(d.tensor);
  for (const auto& [name, t] : parts.signature)
    if (!t.requires_grad() && is_floating(t.dtype())) shadowed.push_back(t);
  std::unordered_map<const TensorImpl*, size_t> entry_of;
  for (size_t i = 0; i < shadowed.size(); ++i) entry_of.emplace(shadowed[i].impl(), i);
  shadows_ = std::make_unique<ParamShadows>(std::move(shadowed), *mp.param_dtype, options_.gradient_as_bucket_view);
  overlap_casts_with_forward(entry_of);
  if (mp.buffer_dtype)
    for (const Tensor& b : synced_buffers())
      if (is_floating(b.dtype())) cast_in_place(b, *mp.buffer_dtype);
}

// How a reduction reads and writes gradients under mixed precision, its parameter i being shadow
// `first + i`.
GradientTransforms DistributedDataParallel::shadow_transforms(size_t first) const {
  ParamShadows* s = shadows_.get();
  return GradientTransforms{
      [s, first](size_t i, const Tensor& g) { return s->gradient_to_reduce(first + i, g); },
      [s, first](size_t i, const Tensor& reduced) { s->set_reduced(first + i, reduced); },
      [s, first](size_t i, const Tensor& reduced) { s->finish_param(first + i, reduced); }};
}

void DistributedDataParallel::set_up_delayed(Partition& parts, std::optional<Dtype> reduce_dtype) {
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps;
  for (const auto& d : parts.delayed) steps.push_back(take_over(d.tensor));
  std::vector<int> all(static_cast<size_t>(group_->size()));
  std::iota(all.begin(), all.end(), 0);
  DelayedAllreduceOptions dopt;
  dopt.find_unused_parameters = options_.find_unused_parameters;
  dopt.static_graph = options_.static_graph;
  dopt.reduce_dtype = reduce_dtype;
  if (shadows_) dopt.transforms = shadow_transforms(parts.managed.size());  // after the bucketed ones
  dopt.own_watch = parts.managed.empty();  // no bucket reducer to follow
  delayed_ = std::make_unique<DelayedAllreduce>(std::move(parts.delayed), parts.hook_param,
                                                options_.param_to_hook_all_reduce, group_->new_group(all),
                                                std::move(dopt));
  delayed_->set_in_backward_steps(std::move(steps));
  if (shadows_) {
    // The masters come back only after the delayed reduction has handed its results over.
    shadows_->finish_after([d = delayed_.get()] { return d->finalize_pending(); });
  }
}

// When DDP's backward is adopted: the delayed reduction joins it, and under mixed precision the
// way back to the masters is queued even if this rank's backward fires no parameter's hook.
std::function<void()> DistributedDataParallel::adoption_steps() {
  return [this] {
    if (delayed_ && reducer_) delayed_->join_current_backward();
    if (shadows_) shadows_->queue_finish();
  };
}

void DistributedDataParallel::set_up_reducer(Partition& parts, std::optional<Dtype> reduce_dtype) {
  ReducerOptions ro;
  ro.find_unused_parameters = options_.find_unused_parameters;
  ro.gradient_as_bucket_view = options_.gradient_as_bucket_view;
  ro.static_graph = options_.static_graph;
  if (options_.bucket_cap_mb) {
    ro.bucket_bytes = static_cast<size_t>(*options_.bucket_cap_mb * 1024.0 * 1024.0);
    ro.bucket_bytes = std::max<size_t>(ro.bucket_bytes, 1);
    ro.first_bucket_bytes = ro.bucket_bytes;
  }
  ro.reduce_dtype = reduce_dtype;
  std::vector<std::shared_ptr<optim::InBackwardStep>> steps;
  for (const auto& m : parts.managed) steps.push_back(take_over(m.tensor));
  reducer_ = std::make_unique<Reducer>(std::move(parts.managed), group_, ro);
  if (optimizer_in_backward_) reducer_->set_in_backward_steps(std::move(steps));
  if (shadows_) reducer_->set_gradient_transforms(shadow_transforms(0));
  reducer_->on_adopt(adoption_steps());
}

DistributedDataParallel::~DistributedDataParallel() {
  // Detach first: a reduction still in flight (a backward that threw after a launch) calls into
  // the shadows and the optimizers, which go with the members below.
  try {
    remove_autograd_hooks();
  } catch (...) {
  }
}

void DistributedDataParallel::Claims::release() noexcept {
  for (const Tensor& p : params) {
    optim::give_back_in_backward_step(p);  // the parameters' own hooks step them again
    optim::unclaim_gradient(p);
  }
  params.clear();
}

bool DistributedDataParallel::ignored(const std::string& name) const {
  return std::find(options_.ignored_parameters.begin(), options_.ignored_parameters.end(), name) !=
         options_.ignored_parameters.end();
}

void DistributedDataParallel::verify_same_model_across_ranks(
    const std::vector<std::pair<std::string, Tensor>>& params) {
  const int n = group_->size();
  if (n == 1) return;
  const Device dev = group_->control_device(params.empty() ? kCPU : params.front().second.device());
  std::vector<int64_t> sig = model_signature(params);
  Tensor len = from_vector<int64_t>({static_cast<int64_t>(sig.size())}).to(dev);
  Tensor lens = zeros({n}, TensorOptions(i64, dev));
  group_->allgather_into(lens, len)->wait();
  lens = lens.to(kCPU);
  const int64_t* l = static_cast<const int64_t*>(lens.data_ptr());
  const int64_t longest = *std::max_element(l, l + n);
  sig.resize(static_cast<size_t>(longest), 0);
  Tensor all = zeros({n * longest}, TensorOptions(i64, dev));
  group_->allgather_into(all, from_vector<int64_t>(sig).to(dev))->wait();
  all = all.to(kCPU);
  const int64_t* a = static_cast<const int64_t*>(all.data_ptr());
  const std::vector<ParamSig> ref = decode_signature(a);
  for (int r = 1; r < n; ++r) {
    const std::vector<ParamSig> other = decode_signature(a + r * longest);
    const size_t common = std::min(ref.size(), other.size());
    for (size_t i = 0; i < common; ++i) {
      if (!(ref[i] == other[i])) {
        fail("[ddp] the model differs across ranks: parameter {} ('{}' on rank {}) is {} on rank 0 but {} on "
             "rank {}. Every rank must build the same model",
             i, i < params.size() ? params[i].first : std::string("?"), group_->rank(), ref[i].str(), other[i].str(),
             r);
      }
    }
    if (ref.size() != other.size()) {
      fail("[ddp] the model differs across ranks: rank 0 has {} parameters but rank {} has {}. Every rank must build "
           "the same model",
           ref.size(), r, other.size());
    }
  }
}

std::vector<Tensor> DistributedDataParallel::synced_buffers() const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : module_->named_buffers())
    if (!ignored(name)) out.push_back(t);
  return out;
}

// Rank `root`'s values into every rank's tensors: all broadcasts issued, then all waited for.
static void broadcast_from(ProcessGroup& group, const std::vector<Tensor>& tensors, int root, const char* tag) {
  CollectiveTag tagged(tag);
  std::vector<WorkPtr> works;
  for (const Tensor& t : tensors) works.push_back(group.broadcast(t, root));
  for (const WorkPtr& w : works) w->wait();
}

void DistributedDataParallel::broadcast_states(bool include_buffers) {
  if (group_->size() == 1) return;
  std::vector<Tensor> states;
  for (const auto& [name, t] : module_->named_parameters())
    if (!ignored(name)) states.push_back(t);
  if (include_buffers)
    for (const Tensor& b : synced_buffers()) states.push_back(b);
  broadcast_from(*group_, states, 0, "ddp initial states");
}

// On a device with a side stream, one cast batch per module (the parameters it registers itself,
// in registration order, which is the order forward usually reaches them); each module's
// pre-forward hook waits for the batches of every parameter it registers, a tied one included.
void DistributedDataParallel::overlap_casts_with_forward(const std::unordered_map<const TensorImpl*, size_t>& entry_of) {
  std::vector<std::vector<size_t>> batches;
  std::unordered_map<size_t, size_t> batch_of;  // entry -> batch
  std::vector<std::pair<std::shared_ptr<nn::Module>, std::vector<size_t>>> waits;
  for (const auto& [name, m] : module_->named_modules()) {
    std::vector<size_t> own, wait_for;
    for (const auto& [pname, p] : m->named_parameters(/*recurse=*/false)) {
      auto it = entry_of.find(p.impl());
      if (it == entry_of.end()) continue;  // ignored, or not floating
      auto [at, fresh] = batch_of.emplace(it->second, batches.size());
      if (fresh) {
        own.push_back(it->second);
      } else if (std::find(wait_for.begin(), wait_for.end(), at->second) == wait_for.end()) {
        wait_for.push_back(at->second);
      }
    }
    if (!own.empty()) {
      wait_for.push_back(batches.size());
      batches.push_back(std::move(own));
    }
    if (!wait_for.empty()) waits.emplace_back(m, std::move(wait_for));
  }
  if (!shadows_->overlap_casts(std::move(batches))) return;  // no side stream: cast in place
  for (auto& [m, wait_for] : waits)
    cast_waits_.push_back(m->register_forward_pre_hook([s = shadows_.get(), wait_for = std::move(wait_for)](nn::Module&) {
      for (size_t b : wait_for) s->wait_for_batch(b);
    }));
}

void DistributedDataParallel::before_forward() {
  TANDEM_CHECK(attached_,
               "[ddp] the autograd hooks were removed (remove_autograd_hooks): this DDP can no longer synchronise "
               "gradients; call the module directly to train it locally");
  // A forward under NoGradGuard is no iteration: no collective, no check, no rebuild, so that
  // rank 0 alone may evaluate. With mixed precision it runs on the shadows, restored right after.
  if (!autograd::grad_mode_enabled()) {
    if (shadows_ && !shadows_->active()) {
      shadows_->cast_in();
      eval_cast_ = true;
    }
    return;
  }
  // Read afresh every time (a reassigned buffer, set_buffer, is synced too), once per forward.
  const std::vector<Tensor> buffers = buffer_sync_due() ? synced_buffers() : std::vector<Tensor>{};
  Join* join = join_context();
  int buffer_root = 0;
  if (join == nullptr) {
    if (reducer_) reducer_->prepare_for_forward();
    if (delayed_) delayed_->prepare_for_forward();
  } else {
    // Under a Join the iteration is announced first (the joined ranks learn from it what to
    // shadow), so the rebuild waits until after it.
    if (reducer_) reducer_->prepare_for_forward(/*rebuild_now=*/false);
    const JoinIteration it = join->announce(join_flags(!buffers.empty()));
    buffer_root = it.authority();  // the highest rank still training (PyTorch's rule under a Join)
    if (reducer_) {
      reducer_->set_divisor(it.divisor(join->options()));
      reducer_->rebuild_if_pending();
    }
  }
  // PyTorch's rule: rank 0's buffers are broadcast only at the start of an accumulation window,
  // i.e. when the previous forward was synchronised (or there was none). The forwards inside
  // no_sync and the synchronised one that ends the window run on each rank's own buffers.
  if (!buffers.empty()) {  // a module without buffers broadcasts nothing: no span either
    TANDEM_TRACE_SCOPE("ddp broadcast buffers", "ddp");
    broadcast_from(*group_, buffers, buffer_root, "ddp buffers");
  }
  if (shadows_) shadows_->cast_in();  // synchronised and no_sync forwards alike
}

bool DistributedDataParallel::buffer_sync_due() const {
  return autograd::grad_mode_enabled() && sync_buffers_before_forward_ && options_.broadcast_buffers &&
         group_->size() > 1;
}

uint32_t DistributedDataParallel::join_flags(bool broadcasts_buffers) const {
  // A joined rank shadows an iteration right after its announcement, up to the bucket reductions:
  // a second synchronised forward before the backward would announce another iteration in between.
  if (reducer_ && reducer_->awaiting_backward()) {
    fail("[Join] rank {} runs a forward while the backward of its previous synchronised forward has not run: under "
         "a Join every synchronised forward must be followed by its backward (several forwards before one "
         "backward, or a forward never backwarded, cannot be shadowed by the joined ranks, which wait in that "
         "backward's reductions until the group's timeout)",
         group_->rank());
  }
  uint32_t flags = 0;
  if (require_sync_) flags |= Join::kSynchronises;
  if (broadcasts_buffers) flags |= kJoinBuffers;
  if (reducer_ && reducer_->rebuild_pending()) flags |= kJoinRebuild;
  if (reducer_ && reducer_->recording_static_graph()) flags |= kJoinStaticFirst;
  return flags;
}

Device DistributedDataParallel::join_device() const {
  return names_.empty() ? kCPU : module_->named_parameters().at(names_.front()).device();
}

void DistributedDataParallel::join_attached() {
  TANDEM_CHECK(attached_, "[Join] this DDP's autograd hooks were removed (remove_autograd_hooks): it cannot join");
  TANDEM_CHECK(!delayed_,
               "[Join] DDP with delay_all_reduce_named_params is not supported under Join: the delayed parameters are "
               "reduced on a group of their own, which the joined ranks do not shadow");
  TANDEM_CHECK(!optimizer_in_backward_,
               "[Join] DDP with an optimizer in backward (apply_optimizer_in_backward, or a ZeroRedundancyOptimizer "
               "with overlap_with_ddp) is not supported under Join: a joined rank's shadow reductions run no steps, "
               "so its parameters would fall behind");
}

void DistributedDataParallel::join_shadow(const JoinIteration& it) {
  const uint32_t f = it.flags;
  if (reducer_ && (f & kJoinRebuild)) reducer_->rebuild_for_join();
  if (f & kJoinBuffers) {
    TANDEM_TRACE_SCOPE("ddp broadcast buffers", "ddp");
    broadcast_from(*group_, synced_buffers(), it.authority(), "ddp buffers");  // the same as the ranks still training
  }
  if (reducer_ && (f & Join::kSynchronises)) reducer_->shadow_reduction((f & kJoinStaticFirst) != 0);
  // The buffers the others broadcast at their next window start came from their forward; this
  // rank follows the same rule from what they announced.
  sync_buffers_before_forward_ = (f & Join::kSynchronises) != 0;
}

void DistributedDataParallel::join_finish(int authority) {
  if (reducer_) reducer_->set_divisor(0);
  if (authority < 0 || group_->size() == 1) return;
  // PyTorch's _sync_final_model: the joined ranks stopped stepping, so every rank takes the
  // parameters (and buffers) of a rank that trained to the end.
  TANDEM_TRACE_SCOPE("ddp join final sync", "ddp");
  std::vector<Tensor> states;
  for (const auto& [name, t] : module_->named_parameters())
    if (!ignored(name)) states.push_back(t);
  if (options_.broadcast_buffers)
    for (const Tensor& b : synced_buffers()) states.push_back(b);
  NoGradGuard no_grad;
  broadcast_from(*group_, states, authority, "ddp final states (join)");
}

void DistributedDataParallel::after_forward(const TensorList& outputs, std::chrono::steady_clock::time_point started) {
  if (!autograd::grad_mode_enabled()) {  // evaluation is not part of any window
    if (eval_cast_) shadows_->cast_out();
    eval_cast_ = false;
    return;
  }
  if (require_sync_)
    forward_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  sync_buffers_before_forward_ = require_sync_;
  if (shadows_) shadows_->set_adoption_pending(require_sync_);
  if (!require_sync_) {
    // Gradients of this forward's backward are local, but count as used at the next reduction.
    if (reducer_) reducer_->note_local_forward();
    if (delayed_) delayed_->note_local_forward();
    return;
  }
  if (reducer_) reducer_->prepare_for_backward(outputs);
  if (delayed_) delayed_->prepare_for_backward(outputs);
}

// With mixed precision a floating input is cast to param_dtype, as PyTorch's cast_forward_inputs.
Tensor DistributedDataParallel::forward_input(const Tensor& input) const {
  const bool cast = shadows_ && input.defined() && is_floating(input.dtype());
  return cast ? input.to(*options_.mixed_precision->param_dtype) : input;
}

TensorList DistributedDataParallel::forward_input(const TensorList& inputs) const {
  TensorList out;
  for (const Tensor& t : inputs) out.push_back(forward_input(t));
  return out;
}

Tensor DistributedDataParallel::forward(const Tensor& input) {
  TANDEM_TRACE_SCOPE("ddp forward", "ddp");
  before_forward();
  const auto start = std::chrono::steady_clock::now();
  Tensor out = (*module_)(forward_input(input));
  after_forward({out}, start);
  return out;
}

Tensor DistributedDataParallel::forward(const TensorList& inputs) {
  TANDEM_TRACE_SCOPE("ddp forward", "ddp");
  // Before the iteration's collectives and casts, which a refused call would leave half done.
  TANDEM_CHECK(!inputs.empty() && inputs.size() <= module_->max_inputs(), "[ddp] {} takes 1 to {} inputs, got {}",
               module_->type_name(), module_->max_inputs(), inputs.size());
  before_forward();
  const auto start = std::chrono::steady_clock::now();
  Tensor out = module_->call(forward_input(inputs));
  after_forward({out}, start);
  return out;
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  TANDEM_CHECK(reducer_ != nullptr, "[ddp] register_comm_hook: every parameter is delayed, so there is no bucket to hook");
  reducer_->register_comm_hook(std::move(hook));
}

void DistributedDataParallel::check_reducer_finalized() const {
  if (reducer_) reducer_->check_finalized();
  if (delayed_) delayed_->check_finalized();
}

void DistributedDataParallel::remove_autograd_hooks() {
  attached_ = false;
  // The reductions first (they wait for what is in flight), then what their continuations call.
  if (reducer_) reducer_->remove_autograd_hooks();
  if (delayed_) delayed_->remove_autograd_hooks();
  cast_waits_.clear();
  if (shadows_) shadows_->release();
  eval_cast_ = false;
  claims_.release();
}

const std::vector<ReducerEvent>& DistributedDataParallel::reducer_events() const {
  static const std::vector<ReducerEvent> none;
  return reducer_ ? reducer_->events() : none;
}

DdpStats DistributedDataParallel::stats() const {
  DdpStats s;
  if (reducer_) static_cast<ReducerStats&>(s) = reducer_->stats();
  s.static_graph = options_.static_graph;
  s.optimizer_in_backward = optimizer_in_backward_;
  if (options_.mixed_precision) {
    const MixedPrecision& mp = *options_.mixed_precision;
    s.mixed_precision = fmt::format("param {}, reduce {}, buffers {}", *mp.param_dtype,
                                    mp.reduce_dtype.value_or(*mp.param_dtype),
                                    mp.buffer_dtype ? fmt::format("{}", *mp.buffer_dtype) : std::string("as they are"));
  }
  if (delayed_) {
    s.delayed_parameters = delayed_->names();
    s.delayed_allreduces = delayed_->launches();
  }
  s.forward_ms = forward_ms_;
  s.world_size = group_->size();
  s.progress = std::string(group_->progress_mode());
  return s;
}

std::string DdpStats::str() const {
  auto mib = [](int64_t b) { return fmt::format("{:.2f}", static_cast<double>(b) / (1 << 20)); };
  std::vector<std::string> sizes, rebuilt;
  for (int64_t b : bucket_bytes) sizes.push_back(mib(b));
  for (int64_t b : rebuilt_bucket_bytes) rebuilt.push_back(mib(b));
  std::string s = fmt::format("DDP over {} ranks, {} iterations\n", world_size, iterations);
  std::vector<std::string> modes;
  if (static_graph) modes.push_back("static_graph");
  if (optimizer_in_backward) modes.push_back("optimizer in backward");
  if (!mixed_precision.empty()) modes.push_back("mixed precision (" + mixed_precision + ")");
  if (!delayed_parameters.empty())
    modes.push_back(fmt::format("delayed allreduce of {} ({} allreduces)", fmt::join(delayed_parameters, ", "),
                                delayed_allreduces));
  if (progress == "caller") modes.push_back("caller progress (buckets advance at gradient hooks and in the wait)");
  if (!modes.empty()) s += fmt::format("  modes: {}\n", fmt::join(modes, "; "));
  s += fmt::format("  buckets (MiB, launch order): [{}]\n", fmt::join(sizes, ", "));
  s += fmt::format("  rebuilt buckets (MiB):       [{}]\n", fmt::join(rebuilt, ", "));
  s += fmt::format("  forward {:.3f} ms, backward compute {:.3f} ms, comm {:.3f} ms (waited {:.3f} ms, overlapped {:.3f} ms)\n",
                   forward_ms, backward_compute_ms, comm_ms, comm_wait_ms, overlap_ms);
  if (!unused_parameters.empty()) s += fmt::format("  unused parameters: {}\n", fmt::join(unused_parameters, ", "));
  s += fmt::format("  grad-ready order: {}\n", fmt::join(grad_ready_order, ", "));
  return s;
}

}  // namespace tandem::dist
