#include "nn/optim.h"

#include <cmath>
#include <unordered_set>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"
#include "core/parallel.h"
#include "core/detail/kernel_tables.h"
#include "core/detail/optim_kernels.h"
#include "nn/lr_scheduler.h"

namespace tandem::optim {

// ---- options ----

namespace {
void set_field(const char* opt, const std::string& name, double value,
               std::initializer_list<std::pair<const char*, double*>> doubles,
               std::initializer_list<std::pair<const char*, bool*>> bools) {
  for (auto [n, p] : doubles) {
    if (name == n) {
      *p = value;
      return;
    }
  }
  for (auto [n, p] : bools) {
    if (name == n) {
      *p = value != 0;
      return;
    }
  }
  fail("[{}] unknown hyperparameter '{}'", opt, name);
}
}  // namespace

std::vector<std::pair<std::string, double>> SGDOptions::hyperparameters() const {
  return {{"lr", lr},
          {"momentum", momentum},
          {"dampening", dampening},
          {"weight_decay", weight_decay},
          {"nesterov", nesterov ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

void SGDOptions::set_hyperparameter(const std::string& name, double value) {
  set_field("SGD", name, value,
            {{"lr", &lr}, {"momentum", &momentum}, {"dampening", &dampening}, {"weight_decay", &weight_decay}},
            {{"nesterov", &nesterov}, {"maximize", &maximize}});
}

void SGDOptions::validate() const {
  TANDEM_CHECK(lr >= 0, "[SGD] invalid learning rate: {}", lr);
  TANDEM_CHECK(momentum >= 0, "[SGD] invalid momentum value: {}", momentum);
  TANDEM_CHECK(weight_decay >= 0, "[SGD] invalid weight_decay value: {}", weight_decay);
  TANDEM_CHECK(!nesterov || (momentum > 0 && dampening == 0),
               "[SGD] Nesterov momentum requires a momentum and zero dampening (got momentum {}, dampening {})",
               momentum, dampening);
}

std::vector<std::pair<std::string, double>> AdamOptions::hyperparameters() const {
  return {{"lr", lr},
          {"beta1", beta1},
          {"beta2", beta2},
          {"eps", eps},
          {"weight_decay", weight_decay},
          {"amsgrad", amsgrad ? 1.0 : 0.0},
          {"maximize", maximize ? 1.0 : 0.0}};
}

void AdamOptions::set_hyperparameter(const std::string& name, double value) {
  set_field("Adam", name, value,
            {{"lr", &lr}, {"beta1", &beta1}, {"beta2", &beta2}, {"eps", &eps}, {"weight_decay", &weight_decay}},
            {{"amsgrad", &amsgrad}, {"maximize", &maximize}});
}

void AdamOptions::validate() const {
  TANDEM_CHECK(lr >= 0, "[Adam] invalid learning rate: {}", lr);
  TANDEM_CHECK(eps >= 0, "[Adam] invalid epsilon value: {}", eps);
  TANDEM_CHECK(beta1 >= 0 && beta1 < 1, "[Adam] invalid beta parameter at index 0: {}", beta1);
  TANDEM_CHECK(beta2 >= 0 && beta2 < 1, "[Adam] invalid beta parameter at index 1: {}", beta2);
  TANDEM_CHECK(weight_decay >= 0, "[Adam] invalid weight_decay value: {}", weight_decay);
}

// ---- Optimizer ----

Optimizer::~Optimizer() {
  for (LRScheduler* s : schedulers_) s->optimizer_gone_ = true;
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard guard;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : group_params(g)) {
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (set_to_none) {
        p.set_grad(Tensor());
      } else {
        grad.detach().zero_();
      }
    }
  }
}

TensorList Optimizer::parameters() const {
  TensorList out;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto& ps = group_params(g);
    out.insert(out.end(), ps.begin(), ps.end());
  }
  return out;
}

const ParamState* Optimizer::state(const Tensor& param) const {
  auto it = state_.find(param.impl());
  return it == state_.end() ? nullptr : &it->second;
}

void Optimizer::check_new_params(const TensorList& params) const {
  std::unordered_set<const TensorImpl*> seen;
  for (const Tensor& p : parameters()) seen.insert(p.impl());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    TANDEM_CHECK(p.defined(), "[{}] parameter {} of the new group is undefined", name_, i);
    TANDEM_CHECK(p.is_floating_point(), "[{}] can only optimize floating tensors, parameter {} is {}", name_, i,
                 p.dtype());
    TANDEM_CHECK(p.is_leaf(), "[{}] can't optimize a non-leaf tensor (parameter {}, shape {})", name_, i, p.shape());
    TANDEM_CHECK(seen.insert(p.impl()).second,
                 "[{}] parameter {} (shape {}) appears more than once across the parameter groups", name_, i,
                 p.shape());
  }
}

TensorDict Optimizer::state_dict() const {
  TensorDict out;
  int64_t index = 0;
  const bool steps = counts_steps();
  for (size_t g = 0; g < num_param_groups(); ++g) {
    for (const Tensor& p : group_params(g)) {
      if (const ParamState* st = state(p)) {
        if (steps) {
          out.insert(fmt::format("state.{}.step", index), scalar_tensor(static_cast<double>(st->step), f64));
        }
        for (const auto& [name, t] : st->buffers) out.insert(fmt::format("state.{}.{}", index, name), t.detach());
      }
      ++index;
    }
  }
  index = 0;
  for (size_t g = 0; g < num_param_groups(); ++g) {
    const auto n = static_cast<int64_t>(group_params(g).size());
    out.insert(fmt::format("param_groups.{}.params", g), arange(index, index + n, TensorOptions(i64)));
    index += n;
    for (const auto& [name, v] : group_hyperparameters(g)) {
      out.insert(fmt::format("param_groups.{}.{}", g, name), scalar_tensor(v, f64));
    }
  }
  return out;
}

namespace {
// "state.12.exp_avg" -> (12, "exp_avg"); false when the key does not have that form.
bool split_key(const std::string& key, const std::string& head, int64_t& index, std::string& rest) {
  if (key.rfind(head + ".", 0) != 0) return false;
  size_t start = head.size() + 1;
  size_t dot = key.find('.', start);
  if (dot == std::string::npos || dot == start || dot + 1 == key.size()) return false;
  std::string digits = key.substr(start, dot - start);
  if (digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoll(digits);
  rest = key.substr(dot + 1);
  return true;
}

double scalar_value(const Tensor& t, const std::string& key, const char* opt) {
  TANDEM_CHECK(t.numel() == 1, "[{}] load_state_dict: '{}' must hold one number, got shape {}", opt, key, t.shape());
  return to_dtype(t.detach(), f64).to(kCPU).item<double>();
}
}  // namespace

void Optimizer::load_state_dict(const TensorDict& sd) {
  const char* opt = name_.c_str();
  TensorList params = parameters();
  const auto num_params = static_cast<int64_t>(params.size());
  const auto names = state_names();
  std::unordered_map<int64_t, ParamState> new_state;
  std::vector<std::tuple<size_t, std::string, double>> new_hyper;

  for (const auto& [key, t] : sd) {
    TANDEM_CHECK(t.defined(), "[{}] load_state_dict: '{}' is an undefined tensor", opt, key);
    int64_t index = 0;
    std::string rest;
    if (split_key(key, "state", index, rest)) {
      TANDEM_CHECK(index < num_params, "[{}] load_state_dict: '{}' refers to parameter {}, but the optimizer has {}",
                   opt, key, index, num_params);
      const Tensor& p = params[index];
      ParamState& st = new_state[index];
      if (rest == "step") {
        TANDEM_CHECK(counts_steps(), "[{}] load_state_dict: unexpected key '{}' ({} keeps no step count)", opt, key,
                     opt);
        double v = scalar_value(t, key, opt);
        TANDEM_CHECK(v >= 0 && v == std::floor(v), "[{}] load_state_dict: '{}' must be a non-negative integer, got {}",
                     opt, key, v);
        st.step = static_cast<int64_t>(v);
        continue;
      }
      TANDEM_CHECK(std::find(names.begin(), names.end(), rest) != names.end(),
                   "[{}] load_state_dict: unexpected key '{}'", opt, key);
      TANDEM_CHECK(t.shape() == p.shape(),
                   "[{}] load_state_dict: '{}' has shape {} but parameter {} has shape {}", opt, key, t.shape(), index,
                   p.shape());
      TANDEM_CHECK(t.is_floating_point(), "[{}] load_state_dict: '{}' must be floating, got {}", opt, key, t.dtype());
      Tensor copy = to_dtype(t.detach(), p.dtype()).to(p.device()).contiguous();
      if (copy.storage() == t.storage()) copy = copy.clone();
      st.buffers.insert(rest, copy);
      continue;
    }
    if (split_key(key, "param_groups", index, rest)) {
      TANDEM_CHECK(index < static_cast<int64_t>(num_param_groups()),
                   "[{}] load_state_dict: '{}' refers to group {}, but the optimizer has {} groups", opt, key, index,
                   num_param_groups());
      if (rest == "params") {
        TANDEM_CHECK(t.dim() == 1 && t.numel() == static_cast<int64_t>(group_params(index).size()),
                     "[{}] load_state_dict: group {} has {} parameters here, but the state dict lists {}", opt, index,
                     group_params(index).size(), t.numel());
        continue;
      }
      double v = scalar_value(t, key, opt);
      bool known = false;
      for (const auto& [n, _] : group_hyperparameters(index)) known = known || n == rest;
      TANDEM_CHECK(known, "[{}] load_state_dict: unexpected key '{}' (no hyperparameter '{}')", opt, key, rest);
      new_hyper.emplace_back(index, rest, v);
      continue;
    }
    fail("[{}] load_state_dict: unexpected key '{}'", opt, key);
  }

  // Everything checked: commit.
  for (const auto& [g, n, v] : new_hyper) set_group_hyperparameter(g, n, v);
  state_.clear();
  for (auto& [index, st] : new_state) state_[params[index].impl()] = std::move(st);
}

// ---- SGD ----

SGD::SGD(const TensorList& params, SGDOptions options) : OptimizerWithOptions("SGD") {
  add_param_group({params, options});
}

SGD::SGD(std::vector<Group> groups) : OptimizerWithOptions("SGD") {
  for (auto& g : groups) add_param_group(std::move(g));
}

namespace {

// One pass over contiguous data per parameter: weight decay, momentum, Nesterov and the update
// fused, with the branches hoisted into template flags so the loop vectorises. Same arithmetic
// (in the parameter's type) as torch.optim.SGD's sequence of tensor ops.
// Elementwise, so it runs in chunks on the intra-op threads with the same bits at any count.
template <class T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_chunk(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t begin, int64_t end, T sign, T neg_lr,
               T wd, T mom, T damp1) {
  for (int64_t i = begin; i < end; ++i) {
    T d = g[i] * sign;
    if constexpr (kDecay) d = d + wd * p[i];
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;
      } else {
        b = buf[i] * mom + damp1 * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + mom * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] + neg_lr * d;
  }
}

template <class T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(T* p, const T* g, T* buf, int64_t n, T sign, T neg_lr, T wd, T mom, T damp1) {
  parallel_for(n, kDefaultGrain, [&](int64_t begin, int64_t end) {
    sgd_chunk<T, kDecay, kMomentum, kFirst, kNesterov>(p, g, buf, begin, end, sign, neg_lr, wd, mom, damp1);
  });
}

template <class T>
void sgd_fused(const Tensor& p, const Tensor& g, const Tensor& buf, bool first, const SGDOptions& o) {
  T* pp = p.data_ptr<T>();
  const T* gp = g.data_ptr<T>();
  T* bp = buf.defined() ? buf.data_ptr<T>() : nullptr;
  const int64_t n = p.numel();
  const T sign = o.maximize ? T(-1) : T(1);
  const T neg_lr = static_cast<T>(-o.lr), wd = static_cast<T>(o.weight_decay), mom = static_cast<T>(o.momentum),
          damp1 = static_cast<T>(1 - o.dampening);
  const bool decay = o.weight_decay != 0, momentum = o.momentum != 0;
  auto run = [&](auto decay_c) {
    constexpr bool D = decltype(decay_c)::value;
    if (!momentum) return sgd_loop<T, D, false, false, false>(pp, gp, bp, n, sign, neg_lr, wd, mom, damp1);
    if (first) {
      if (o.nesterov) return sgd_loop<T, D, true, true, true>(pp, gp, bp, n, sign, neg_lr, wd, mom, damp1);
      return sgd_loop<T, D, true, true, false>(pp, gp, bp, n, sign, neg_lr, wd, mom, damp1);
    }
    if (o.nesterov) return sgd_loop<T, D, true, false, true>(pp, gp, bp, n, sign, neg_lr, wd, mom, damp1);
    return sgd_loop<T, D, true, false, false>(pp, gp, bp, n, sign, neg_lr, wd, mom, damp1);
  };
  if (decay) {
    run(std::true_type{});
  } else {
    run(std::false_type{});
  }
}

bool fusable(const Tensor& p, const Tensor& g, const Tensor& buf) {
  auto ok = [&](const Tensor& t) {
    return t.is_cpu() && t.is_contiguous() && t.dtype() == p.dtype() && t.shape() == p.shape();
  };
  return (p.dtype() == f32 || p.dtype() == f64) && ok(p) && ok(g) && (!buf.defined() || ok(buf)) &&
         p.storage() != g.storage() && (!buf.defined() || buf.storage() != p.storage());
}

// The same for parameters on a device, whose backend runs the fused step (any floating dtype).
bool device_fusable(const Tensor& p, const Tensor& g, const Tensor& buf) {
  if (p.is_cpu()) return false;
  auto ok = [&](const Tensor& t) {
    return t.device() == p.device() && t.is_contiguous() && t.dtype() == p.dtype() && t.shape() == p.shape();
  };
  return is_floating(p.dtype()) && ok(p) && ok(g) && (!buf.defined() || ok(buf)) && p.storage() != g.storage() &&
         (!buf.defined() || (buf.storage() != p.storage() && buf.storage() != g.storage()));
}

// Runs `run(device, batch)` once per (device, dtype) of the entries' parameters, in order.
template <class Entry, class Run>
void run_per_device(const std::vector<Entry>& entries, Run run) {
  std::vector<bool> done(entries.size(), false);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (done[i]) continue;
    const Tensor& first = entries[i].param;
    std::vector<Entry> batch;
    for (size_t j = i; j < entries.size(); ++j) {
      const Tensor& p = entries[j].param;
      if (done[j] || p.device() != first.device() || p.dtype() != first.dtype()) continue;
      batch.push_back(entries[j]);
      done[j] = true;
    }
    run(first.device(), batch);
  }
}

}  // namespace

void Optimizer::step_only(const Tensor& param) {
  TANDEM_CHECK(supports_step_only(), "[{}] step_only: this optimizer cannot step one parameter alone", name_);
  bool held = false;
  for (size_t g = 0; g < num_param_groups() && !held; ++g)
    for (const Tensor& p : group_params(g))
      if (p.impl() == param.impl()) held = true;
  TANDEM_CHECK(held, "[{}] step_only: the tensor of shape {} is not one of this optimizer's parameters", name_,
               param.shape());
  struct Only {
    const TensorImpl*& slot;
    ~Only() { slot = nullptr; }
  } only{only_};
  only_ = param.impl();
  step();
}

void SGD::step() {
  NoGradGuard guard;
  for (auto& group : groups_) {
    const SGDOptions& o = group.options;
    std::vector<detail::SgdStepTensors> on_device;
    for (const Tensor& p : group.params) {
      if (skips(p)) continue;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      Tensor buf;
      bool first = false;
      ParamState* st = nullptr;
      if (o.momentum != 0) {
        st = &state_for(p);
        if (Tensor* b = st->buffers.find("momentum_buffer")) {
          buf = *b;
        } else {
          first = true;
        }
      }
      if (fusable(p, g, buf)) {
        if (first) buf = st->buffers.insert("momentum_buffer", empty_like(p));  // written by the pass
        if (p.dtype() == f32) {
          sgd_fused<float>(p, g, buf, first, o);
        } else {
          sgd_fused<double>(p, g, buf, first, o);
        }
        p.bump_version();
        if (buf.defined()) buf.bump_version();
        continue;
      }
      if (device_fusable(p, g, buf)) {
        if (first) buf = st->buffers.insert("momentum_buffer", empty_like(p));  // written by the kernel
        on_device.push_back({p, g, buf, first});
        continue;
      }
      // General path (other dtypes, strided tensors): torch.optim.SGD's ops verbatim.
      Tensor d = o.maximize ? neg(g) : g;
      if (o.weight_decay != 0) d = add(d, p, o.weight_decay);
      if (o.momentum != 0) {
        if (first) {
          buf = clone(d).detach();
          st->buffers.insert("momentum_buffer", buf);
        } else {
          buf.mul_(o.momentum).add_(d, 1 - o.dampening);
        }
        d = o.nesterov ? add(d, buf, o.momentum) : buf;
      }
      p.add_(d, -o.lr);
    }
    run_per_device(on_device, [&](Device device, const std::vector<detail::SgdStepTensors>& batch) {
      detail::SgdStepOptions so{o.lr, o.momentum, o.dampening, o.weight_decay, o.nesterov, o.maximize};
      device_kernels<detail::OptimDeviceKernels>(device, "SGD").sgd_step(batch, so);
      for (const auto& t : batch) {
        t.param.bump_version();
        if (t.momentum_buffer.defined()) t.momentum_buffer.bump_version();
      }
    });
  }
}

// ---- Adam / AdamW ----

Adam::Adam(const TensorList& params, AdamOptions options) : Adam("Adam", false) {
  add_param_group({params, options});
}

Adam::Adam(std::vector<Group> groups) : Adam("Adam", false) {
  for (auto& g : groups) add_param_group(std::move(g));
}

AdamW::AdamW(const TensorList& params, AdamWOptions options) : Adam("AdamW", true) {
  add_param_group({params, AdamOptions(options)});
}

AdamW::AdamW(std::vector<Group> groups) : Adam("AdamW", true) {
  for (auto& g : groups) add_param_group(std::move(g));
}

namespace {

// Adam/AdamW in one pass over contiguous data, with the operations in the order (and the
// precision, T) of torch's per-op kernels: mul_ then add_ for the moments, addcmul_ as
// v + (c * g) * g, the denominator sqrt(v) / bc2_sqrt + eps, and addcdiv_ as p + (c * m) / d.
template <class T, bool kDecoupled, bool kAmsgrad>
void adam_chunk(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, T* __restrict vmax,
                int64_t begin, int64_t end, T sign, T decay_factor, T l2, T beta1, T one_minus_beta1, T beta2,
                T one_minus_beta2, T bc2_sqrt, T eps, T neg_step_size) {
  for (int64_t i = begin; i < end; ++i) {
    T pi = p[i];
    T gi = g[i] * sign;
    if constexpr (kDecoupled) {
      pi = pi * decay_factor;
    } else {
      gi = gi + l2 * pi;
    }
    T mi = m[i] * beta1 + one_minus_beta1 * gi;
    T vi = v[i] * beta2 + one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    T vv = vi;
    if constexpr (kAmsgrad) {
      vv = vmax[i] < vi ? vi : vmax[i];
      vmax[i] = vv;
    }
    T denom = std::sqrt(vv) / bc2_sqrt + eps;
    p[i] = pi + neg_step_size * mi / denom;
  }
}

// Elementwise too: chunks on the intra-op threads, the same bits at any count.
template <class T, bool kDecoupled, bool kAmsgrad>
void adam_loop(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, T sign, T decay_factor, T l2, T beta1,
               T one_minus_beta1, T beta2, T one_minus_beta2, T bc2_sqrt, T eps, T neg_step_size) {
  parallel_for(n, kDefaultGrain, [&](int64_t begin, int64_t end) {
    adam_chunk<T, kDecoupled, kAmsgrad>(p, g, m, v, vmax, begin, end, sign, decay_factor, l2, beta1, one_minus_beta1,
                                        beta2, one_minus_beta2, bc2_sqrt, eps, neg_step_size);
  });
}

template <class T>
void adam_fused(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& vmax,
                const AdamOptions& o, bool decoupled, double step_size, double bc2_sqrt) {
  const T sign = o.maximize ? T(-1) : T(1);
  const T decay_factor = static_cast<T>(1 - o.lr * o.weight_decay), l2 = static_cast<T>(o.weight_decay);
  auto args = std::make_tuple(p.data_ptr<T>(), g.data_ptr<T>(), m.data_ptr<T>(), v.data_ptr<T>(),
                              vmax.defined() ? vmax.data_ptr<T>() : nullptr, p.numel(), sign, decay_factor, l2,
                              static_cast<T>(o.beta1), static_cast<T>(1 - o.beta1), static_cast<T>(o.beta2),
                              static_cast<T>(1 - o.beta2), static_cast<T>(bc2_sqrt), static_cast<T>(o.eps),
                              static_cast<T>(-step_size));
  if (decoupled) {
    if (o.amsgrad) return std::apply(adam_loop<T, true, true>, args);
    return std::apply(adam_loop<T, true, false>, args);
  }
  if (o.amsgrad) return std::apply(adam_loop<T, false, true>, args);
  std::apply(adam_loop<T, false, false>, args);
}

}  // namespace

void Adam::step() {
  NoGradGuard guard;
  for (auto& group : groups_) {
    const AdamOptions& o = group.options;
    std::vector<detail::AdamStepTensors> on_device;
    for (const Tensor& p : group.params) {
      if (skips(p)) continue;
      Tensor g = p.grad();
      if (!g.defined()) continue;
      ParamState& st = state_for(p);
      if (!st.buffers.contains("exp_avg")) {
        st.buffers.insert("exp_avg", zeros_like(p));
        st.buffers.insert("exp_avg_sq", zeros_like(p));
      }
      if (o.amsgrad && !st.buffers.contains("max_exp_avg_sq")) st.buffers.insert("max_exp_avg_sq", zeros_like(p));
      Tensor exp_avg = st.buffers.at("exp_avg");
      Tensor exp_avg_sq = st.buffers.at("exp_avg_sq");

      st.step += 1;
      const auto step = static_cast<double>(st.step);
      const double bias_correction1 = 1 - std::pow(o.beta1, step);
      const double bias_correction2 = 1 - std::pow(o.beta2, step);
      const double step_size = o.lr / bias_correction1;
      const double bias_correction2_sqrt = std::sqrt(bias_correction2);
      Tensor max_sq = o.amsgrad ? st.buffers.at("max_exp_avg_sq") : Tensor();

      if (fusable(p, g, exp_avg) && fusable(p, exp_avg_sq, Tensor()) && (!max_sq.defined() || fusable(p, max_sq, Tensor()))) {
        if (p.dtype() == f32) {
          adam_fused<float>(p, g, exp_avg, exp_avg_sq, max_sq, o, decoupled_, step_size, bias_correction2_sqrt);
        } else {
          adam_fused<double>(p, g, exp_avg, exp_avg_sq, max_sq, o, decoupled_, step_size, bias_correction2_sqrt);
        }
        for (const Tensor* t : std::initializer_list<const Tensor*>{&p, &exp_avg, &exp_avg_sq, &max_sq}) {
          if (t->defined()) t->bump_version();
        }
        continue;
      }
      if (device_fusable(p, g, exp_avg) && device_fusable(p, exp_avg_sq, Tensor()) &&
          (!max_sq.defined() || device_fusable(p, max_sq, Tensor()))) {
        on_device.push_back({p, g, exp_avg, exp_avg_sq, max_sq, step_size, bias_correction2_sqrt});
        continue;
      }

      // General path: torch.optim.adam/_single_tensor_adam(w), non-capturable branch, op for op.
      Tensor grad = o.maximize ? neg(g) : g;
      if (decoupled_) {
        p.mul_(1 - o.lr * o.weight_decay);
      } else if (o.weight_decay != 0) {
        grad = add(grad, p, o.weight_decay);
      }
      exp_avg.mul_(o.beta1).add_(grad, 1 - o.beta1);
      exp_avg_sq.mul_(o.beta2);
      addcmul_(exp_avg_sq, grad, grad, 1 - o.beta2);
      Tensor denom;
      if (o.amsgrad) {
        max_sq.copy_(maximum(max_sq, exp_avg_sq));
        denom = div(sqrt(max_sq), bias_correction2_sqrt);
      } else {
        denom = div(sqrt(exp_avg_sq), bias_correction2_sqrt);
      }
      denom.add_(o.eps);
      addcdiv_(p, exp_avg, denom, -step_size);
    }
    run_per_device(on_device, [&](Device device, const std::vector<detail::AdamStepTensors>& batch) {
      detail::AdamStepOptions ao{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad, o.maximize, decoupled_};
      device_kernels<detail::OptimDeviceKernels>(device, name_.c_str()).adam_step(batch, ao);
      for (const auto& t : batch) {
        for (const Tensor* x : {&t.param, &t.exp_avg, &t.exp_avg_sq, &t.max_exp_avg_sq}) {
          if (x->defined()) x->bump_version();
        }
      }
    });
  }
}

}  // namespace tandem::optim
