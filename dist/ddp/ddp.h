// DistributedDataParallel: wraps a Module so that N ranks, each training on its shard of the
// batch, end every step with the parameters one process would get on the whole batch. What a user
// observes is what PyTorch's DDP does (construction sync, buckets, launch order, averaging,
// unused parameters, static graph, no_sync, buffer broadcast, comm hooks, the misuse errors);
// where Tandem differs, the option or method below says how. In use:
//
//   auto model = std::make_shared<nn::Sequential>(...);
//   dist::DistributedDataParallel ddp(model, dist::init(), {.bucket_cap_mb = 4});
//   optim::SGD opt(model->parameters(), {.lr = 0.1});
//   for (...) {
//     opt.zero_grad();
//     nn::cross_entropy(ddp(x), y).backward();  // gradients averaged across ranks here
//     opt.step();
//   }
//
// Construction checks that every rank holds the same parameters (count, shapes, dtypes) and
// broadcasts rank 0's parameters (and buffers, with broadcast_buffers) to all ranks. Gradients
// are reduced during backward in buckets (see dist/ddp/detail/reducer.h); no_sync() skips that for
// gradient accumulation.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/trace.h"
#include "dist/ddp/comm_hooks.h"
#include "dist/ddp/mixed_precision.h"
#include "dist/ddp/reducer_stats.h"
#include "dist/join.h"
#include "dist/process_group.h"
#include "nn/module.h"
#include "nn/optim_in_backward.h"

namespace tandem::dist {

// DDP's machinery (dist/ddp/detail/): not part of the installed API.
class Reducer;
class DelayedAllreduce;
class ParamShadows;
struct GradientTransforms;

struct DdpOptions {
  // Bucket size cap in MiB. Unset: 25 MiB, and the first bucket (the first reduced) 1 MiB so
  // communication starts early; set: every bucket uses this cap.
  std::optional<double> bucket_cap_mb;
  // Rank 0's buffers overwrite the others' at construction and before every synchronised forward.
  bool broadcast_buffers = true;
  // Parameters the loss does not reach are marked ready at once; globally unused ones keep .grad.
  bool find_unused_parameters = false;
  // .grad tensors are views into the bucket buffers: no copy in or out, no second gradient-sized
  // allocation. Zero gradients with set_to_none=false to keep the views between steps.
  bool gradient_as_bucket_view = false;
  // Dotted names of parameters or buffers DDP leaves alone: not synced, not bucketed.
  std::vector<std::string> ignored_parameters;
  // The set of parameters that receive a gradient is the same in every iteration: the first
  // backward records it (one used-map allreduce in the whole run), later ones need no search,
  // and several forwards may run before one backward.
  bool static_graph = false;
  // Parameters (dotted names) whose gradients are averaged by one allreduce of their own, on a
  // child group, launched once `param_to_hook_all_reduce`'s gradient and theirs are final (at the
  // latest at the end of backward): they leave the buckets. Both or neither.
  std::vector<std::string> delay_all_reduce_named_params;
  std::string param_to_hook_all_reduce;
  // Native mixed precision: forward and backward on param_dtype shadows of the f32 masters,
  // buckets reduced in reduce_dtype, gradients upcast into the masters' .grad.
  std::optional<MixedPrecision> mixed_precision;
};

namespace detail {
// The tensors of a forward's result, so DDP knows which backward is the iteration's.
inline void collect_tensors(TensorList& out, const Tensor& t) { out.push_back(t); }
inline void collect_tensors(TensorList& out, const TensorList& ts) { out.insert(out.end(), ts.begin(), ts.end()); }
template <class T>
void collect_tensors(TensorList&, const T&) {}  // anything else holds no tensor DDP can see
template <class A, class B>
void collect_tensors(TensorList& out, const std::pair<A, B>& p) {
  collect_tensors(out, p.first);
  collect_tensors(out, p.second);
}
template <class... T>
void collect_tensors(TensorList& out, const std::tuple<T...>& t) {
  std::apply([&](const auto&... e) { (collect_tensors(out, e), ...); }, t);
}
}  // namespace detail

// The reducer's figures plus the forward time of the last synchronised forward.
struct DdpStats : ReducerStats {
  double forward_ms = 0;
  int64_t world_size = 1;
  bool static_graph = false;
  bool optimizer_in_backward = false;
  std::string mixed_precision;  // "param bf16, reduce bf16, buffers f32" when on
  std::vector<std::string> delayed_parameters;  // delay_all_reduce_named_params
  int64_t delayed_allreduces = 0;               // their allreduces so far
  std::string progress = "thread";  // the group's progress_mode(): who advances the buckets
  std::string str() const;  // a readable multi-line summary
};

class DistributedDataParallel : public Joinable {
 public:
  // `group` defaults to the world group (dist::init() must have run).
  explicit DistributedDataParallel(std::shared_ptr<nn::Module> module, ProcessGroupPtr group = nullptr,
                                   DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Runs the module's forward (its pre-forward hooks included) as one DDP iteration.
  Tensor operator()(const Tensor& input) { return forward(input); }
  Tensor forward(const Tensor& input);
  // Several inputs, ddp(tokens, padding_mask): the module's forward_inputs (nn::Module), as
  // module(tokens, padding_mask) calls it. Under mixed precision every floating input is cast to
  // param_dtype (a float mask too, as PyTorch casts every floating argument; a bool one is not).
  template <class... More>
    requires(std::is_convertible_v<const More&, const Tensor&> && ...)
  Tensor operator()(const Tensor& first, const Tensor& second, const More&... more) {
    return forward(TensorList{first, second, Tensor(more)...});
  }
  Tensor forward(const TensorList& inputs);
  // For modules whose forward takes other arguments: `ddp.call([&](const Tensor& a, const Tensor& b)
  // { return net->forward(a, b); }, a, b)`, or with no arguments, `ddp.call([&] { return ...; })`.
  // The arguments are handed to the callable as forward(Tensor) hands its input to the module:
  // under mixed precision every floating Tensor (and every floating Tensor of a TensorList) is
  // cast to param_dtype, as PyTorch casts every floating argument; anything else passes as it is
  // (tensors a no-argument callable captures are not seen, so not cast). The result (a Tensor, a
  // TensorList, or a pair/tuple of them) tells DDP which backward is this iteration's; for other
  // result types any backward that reaches the parameters is.
  template <class F, class... Args>
  auto call(F&& run_forward, const Args&... args) {
    TANDEM_TRACE_SCOPE("ddp forward", "ddp");
    before_forward();
    const auto start = std::chrono::steady_clock::now();
    auto out = std::invoke(std::forward<F>(run_forward), forward_input(args)...);
    TensorList outputs;
    detail::collect_tensors(outputs, out);
    after_forward(outputs, start);
    return out;
  }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  ProcessGroup& process_group() { return *group_; }

  // Inside the guard's scope forwards and backwards do not communicate: gradients accumulate
  // locally and the first synchronised backward after it reduces them.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DistributedDataParallel& ddp) : ddp_(&ddp), previous_(ddp.require_sync_) {
      ddp.require_sync_ = false;
    }
    ~NoSyncGuard() {
      if (ddp_) ddp_->require_sync_ = previous_;
    }
    NoSyncGuard(NoSyncGuard&& o) noexcept : ddp_(std::exchange(o.ddp_, nullptr)), previous_(o.previous_) {}
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(NoSyncGuard&&) = delete;

   private:
    DistributedDataParallel* ddp_;
    bool previous_;
  };
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*this); }

  // Replaces the default bucket reduction (allreduce of the average). Once, before the first backward.
  void register_comm_hook(CommHook hook);
  // Throws now if the last synchronised backward did not finish its reduction (a parameter got no
  // gradient), instead of at the next forward or in a later collective.
  void check_reducer_finalized() const;
  // Detaches DDP from autograd (the destructor does this too) and gives back everything it took:
  // reductions still in flight finish first; the optimizer-in-backward steps return to the
  // parameters' own hooks; under mixed precision the parameters are their f32 masters again
  // (also after a backward that threw). The module then trains locally, or a new DDP can wrap
  // it while this one still lives; this one's destructor touches nothing more.
  void remove_autograd_hooks();

  DdpStats stats() const;
  // The reducer's event log of the current (or last) iteration; empty when every parameter is delayed.
  const std::vector<ReducerEvent>& reducer_events() const;
  // The delayed-allreduce parameters' reduction, or nullptr without them (its type is internal,
  // dist/ddp/detail/delayed_allreduce.h; stats().delayed_allreduces counts its launches).
  const DelayedAllreduce* delayed_allreduce() const { return delayed_.get(); }
  // The parameters DDP manages, by name, in registration order.
  const std::vector<std::string>& parameter_names() const { return names_; }

  // Joinable (dist/join.h): under a Join every forward in grad mode announces its iteration; a
  // joined rank shadows the rebuild, the buffer broadcast (from the highest rank still training)
  // and the bucket reductions, and at the end takes the parameters and buffers of a rank that
  // trained last.
  ProcessGroup& join_group() override { return *group_; }
  Device join_device() const override;
  void join_attached() override;
  bool join_announces() const override { return true; }
  void join_shadow(const JoinIteration& iteration) override;
  void join_finish(int authority) override;

 private:
  // What an announced iteration does (Join's flag bits above its own).
  // (Join::kSynchronises: the iteration reduces the buckets.)
  static constexpr uint32_t kJoinBuffers = 1u << (Join::kReservedBits + 0);      // broadcasts buffers first
  static constexpr uint32_t kJoinRebuild = 1u << (Join::kReservedBits + 1);      // rebuilds the buckets first
  static constexpr uint32_t kJoinStaticFirst = 1u << (Join::kReservedBits + 2);  // static_graph's first reduction
  uint32_t join_flags(bool broadcasts_buffers) const;
  bool buffer_sync_due() const;  // the forward starts an accumulation window (PyTorch's rule)
  void before_forward();
  // `started`: when the module's forward began (its time goes into stats().forward_ms).
  void after_forward(const TensorList& outputs, std::chrono::steady_clock::time_point started);
  // What the module receives: a floating input cast to param_dtype under mixed precision.
  Tensor forward_input(const Tensor& input) const;
  TensorList forward_input(const TensorList& inputs) const;
  template <class T>
  const T& forward_input(const T& value) const {
    return value;
  }
  void verify_same_model_across_ranks(const std::vector<std::pair<std::string, Tensor>>& params);
  void broadcast_states(bool include_buffers);
  std::vector<Tensor> synced_buffers() const;
  bool ignored(const std::string& name) const;
  void overlap_casts_with_forward(const std::unordered_map<const TensorImpl*, size_t>& entry_of);
  // The constructor's named steps (ddp.cpp), in the order it runs them.
  struct Partition;
  Partition partition_parameters();
  std::optional<Dtype> check_mixed_precision(const Partition& parts) const;
  void make_shadows(const Partition& parts);
  void set_up_delayed(Partition& parts, std::optional<Dtype> reduce_dtype);
  void set_up_reducer(Partition& parts, std::optional<Dtype> reduce_dtype);
  std::shared_ptr<optim::InBackwardStep> take_over(const Tensor& param);
  GradientTransforms shadow_transforms(size_t first) const;
  std::function<void()> adoption_steps();

  std::shared_ptr<nn::Module> module_;
  ProcessGroupPtr group_;
  DdpOptions options_;
  std::vector<std::string> names_;
  // The parameters whose gradients (and in-backward steps) DDP manages, given back when DDP goes,
  // also when its constructor throws. Declared before the reducer, so destroyed after it.
  struct Claims {
    TensorList params;
    Claims() = default;
    Claims(const Claims&) = delete;
    Claims& operator=(const Claims&) = delete;
    ~Claims() { release(); }
    void release() noexcept;  // gives every parameter back; then holds none
  } claims_;
  std::unique_ptr<Reducer> reducer_;         // null when every parameter is delayed
  std::unique_ptr<DelayedAllreduce> delayed_;
  std::unique_ptr<ParamShadows> shadows_;  // mixed precision (the destructor detaches first: no reduction then calls it)
  std::vector<HookHandle> cast_waits_;     // modules' pre-forward hooks: wait for their casts
  bool eval_cast_ = false;                 // a NoGradGuard forward runs on the shadows
  bool optimizer_in_backward_ = false;
  bool require_sync_ = true;
  bool sync_buffers_before_forward_ = true;  // the previous grad-mode forward was synchronised
  bool attached_ = true;  // remove_autograd_hooks not called
  double forward_ms_ = 0;
};

using DDP = DistributedDataParallel;

}  // namespace tandem::dist
