// Parity with PyTorch: tests/parity/generate_cases.py (run here with /usr/bin/python3 and
// Debian's python3-torch) draws thousands of small op programs from a seed, runs them in
// PyTorch and writes their inputs, outputs and input gradients; this file replays every program
// in Tandem and compares. The manifest describes each case: inputs as a base tensor plus view
// ops (so the non-contiguous geometry is rebuilt here by Tandem's own views), steps (op name,
// inputs, outputs, arguments), outputs with their upstream gradients.
//
// Tolerances, per compared tensor:
//   |got - want| <= tol * (|want| + scale) + 10 * noise * (f64 ? 2^-29 : 1)
// where scale is the largest |want| in that tensor, at least 1 (the generator's inputs and
// upstream gradients are O(1), so is every computation's smallest term) and, for the gradient of
// an input made by views, at least the largest gradient of the view (whose elements the view's
// backward sums into the base's: an expanded input sums many); noise is how far
// PyTorch's own f32 result is from its f64 one for this tensor (measured by the generator on the
// case's f32/f64 twins; 2^-29 is the ratio of the two epsilons). Elements are compared relative to
// themselves and to their tensor's magnitude, because the rounding of a sum, a matrix product or
// a normalisation is relative to the size of its terms, not to a result that cancels to near
// zero; the noise term covers what is ill-conditioned beyond that (the gradient of an expanded
// input summed over a dim where it cancels, a normalised near-constant slice), judging each such
// tensor by the rounding PyTorch itself shows on it rather than by a fixed count of ulps.
//   f64: tol 1e-10. Both libraries round correctly to ~1e-16 per operation; a case is at most a
//        handful of ops over tens of elements, so honest differences (summation order, libm vs
//        vectorised transcendental functions) stay below ~1e-13, while a wrong element, index or
//        formula is off by O(1). 1e-10 leaves three orders of margin on both sides.
//   f32: tol 1e-4. Epsilon is 1.2e-7; PyTorch's vectorised f32 kernels and ours differ by a few
//        ulps per op, and the generator keeps magnitudes <= 1e3 and inputs away from kinks and
//        poles, so differences stay near 1e-6.
//   f16, bf16: one unit in the last place (2^-10, 2^-7): both libraries compute in f32 and round.
// Integer and bool tensors, and every dtype, must match exactly, as must results the generator
// marks exact (conversions, and half-precision add/sub/mul/div/maximum/minimum: one correct
// rounding of exact operands, where any difference is a rounding bug). A NaN expected needs a
// NaN; an infinity needs the same infinity.
//
// Knobs (environment): TANDEM_PARITY_SEED, TANDEM_PARITY_COUNT (case templates, each an f64 and
// an f32 case), TANDEM_PARITY_ONLY (families, comma separated), TANDEM_PARITY_DIR (keep the
// generated files there instead of a temporary directory), TANDEM_PARITY_REPORT (a file that
// gets every disagreement, unabridged).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "parity_generator.h"
#include "tandem.h"

#ifndef TANDEM_PARITY_PYTHON
#error "tests/CMakeLists.txt passes TANDEM_PARITY_PYTHON (the interpreter with torch) to this test"
#endif
#ifndef TANDEM_PARITY_GENERATOR
#error "tests/CMakeLists.txt passes TANDEM_PARITY_GENERATOR (tests/parity/generate_cases.py) to this test"
#endif

namespace fs = std::filesystem;
using namespace tandem;
using Json = nlohmann::json;
using parity::env_or;
using parity::Generated;
using parity::shell_quote;
using parity::torch_unavailable;

namespace {

// ---- the generated files ----

// Case templates by default: 8000 cases, ~10 s of generation and replay on two cores.
constexpr const char* kDefaultCount = "4000";

void generate(Generated& g) {
  std::string args = " --count " + shell_quote(env_or("TANDEM_PARITY_COUNT", kDefaultCount));
  const std::string only = env_or("TANDEM_PARITY_ONLY", "");
  if (!only.empty()) args += " --only " + shell_quote(only);
  parity::generate(g, TANDEM_PARITY_GENERATOR, "tandem-parity", args, "cases.safetensors", "manifest.json");
}

// ---- reading arguments ----

Shape shape_arg(const Json& j) { return j.get<std::vector<int64_t>>(); }

std::optional<Shape> dims_arg(const Json& step) {
  auto it = step.find("dims");
  if (it == step.end() || it->is_null()) return std::nullopt;
  return shape_arg(*it);
}

Scalar scalar_arg(const Json& step, const char* key) {
  const Json& v = step.at(key);
  if (step.value("integral", false)) return Scalar(v.get<int64_t>());
  return Scalar(v.get<double>());
}

std::optional<double> optional_double(const Json& step, const char* key) {
  const Json& v = step.at(key);
  if (v.is_null()) return std::nullopt;
  return v.get<double>();
}

Dtype dtype_arg(const std::string& name) {
  static const std::map<std::string, Dtype> names{{"f32", f32}, {"f64", f64}, {"f16", f16},     {"bf16", bf16},
                                                  {"i32", i32}, {"i64", i64}, {"bool", boolean}};
  auto it = names.find(name);
  TANDEM_CHECK(it != names.end(), "[parity] unknown dtype '{}' in the manifest", name);
  return it->second;
}

nn::Reduction reduction_arg(const Json& step) {
  const std::string r = step.at("reduction").get<std::string>();
  if (r == "none") return nn::Reduction::none;
  if (r == "sum") return nn::Reduction::sum;
  TANDEM_CHECK(r == "mean", "[parity] unknown reduction '{}'", r);
  return nn::Reduction::mean;
}

const Tensor& arg(const TensorList& xs, size_t i, const char* op) {
  TANDEM_CHECK(i < xs.size(), "[parity] {} needs an input #{}, the manifest gives {}", op, i, xs.size());
  return xs[i];
}

// ---- the ops: the generator's names, mapped to Tandem ----

using OpFn = std::function<TensorList(const TensorList&, const Json&)>;

#define PARITY_OP(name, expr)                                                    \
  {                                                                              \
    name, [](const TensorList& xs, const Json& p) -> TensorList {                \
      [[maybe_unused]] auto x = [&](size_t i) -> const Tensor& { return arg(xs, i, name); }; \
      [[maybe_unused]] const Json& q = p;                                        \
      return {expr};                                                             \
    }                                                                            \
  }

TensorList batch_norm1d(const TensorList& xs, const Json& p) {
  const Tensor& x = arg(xs, 0, "batch_norm1d");
  nn::BatchNormOptions o;
  o.eps = p.at("eps").get<double>();
  o.momentum = optional_double(p, "momentum");
  o.affine = p.at("affine").get<bool>();
  o.track_running_stats = p.at("track_running_stats").get<bool>();
  nn::BatchNorm1d bn(x.size(1), o);
  bn.to(x.dtype());
  bn.train(p.at("training").get<bool>());
  size_t next = 1;
  if (o.affine) {
    // The case's leaves stand in for the parameters, so their gradients land where every other
    // case's do (the forward reads the members).
    bn.weight = arg(xs, next++, "batch_norm1d");
    bn.bias = arg(xs, next++, "batch_norm1d");
  }
  if (o.track_running_stats) {
    bn.set_buffer("running_mean", arg(xs, next++, "batch_norm1d").clone());
    bn.set_buffer("running_var", arg(xs, next++, "batch_norm1d").clone());
  }
  Tensor y = bn(x);
  if (o.track_running_stats && bn.is_training()) return {y, bn.running_mean(), bn.running_var()};
  return {y};
}

TensorList layer_norm_op(const TensorList& xs, const Json& p) {
  size_t next = 1;
  Tensor w = p.at("has_weight").get<bool>() ? arg(xs, next++, "layer_norm") : Tensor();
  Tensor b = p.at("has_bias").get<bool>() ? arg(xs, next++, "layer_norm") : Tensor();
  return {layer_norm(arg(xs, 0, "layer_norm"), shape_arg(p.at("normalized_shape")), w, b, p.at("eps").get<double>())};
}

TensorList loss_op(const TensorList& xs, const Json& p, bool cross) {
  const char* op = cross ? "cross_entropy" : "nll_loss";
  Tensor weight = p.value("has_weight", false) ? arg(xs, 2, op) : Tensor();
  if (cross) {
    nn::CrossEntropyOptions o;
    o.weight = weight;
    o.ignore_index = p.at("ignore_index").get<int64_t>();
    o.reduction = reduction_arg(p);
    o.label_smoothing = p.at("label_smoothing").get<double>();
    return {nn::cross_entropy(arg(xs, 0, op), arg(xs, 1, op), o)};
  }
  nn::NLLLossOptions o;
  o.weight = weight;
  o.ignore_index = p.at("ignore_index").get<int64_t>();
  o.reduction = reduction_arg(p);
  return {nn::nll_loss(arg(xs, 0, op), arg(xs, 1, op), o)};
}

TensorList clamp_tensors_op(const TensorList& xs, const Json& p) {
  size_t next = 1;
  std::optional<Tensor> lo, hi;
  if (p.at("has_lo").get<bool>()) lo = arg(xs, next++, "clamp_t");
  if (p.at("has_hi").get<bool>()) hi = arg(xs, next++, "clamp_t");
  return {clamp(arg(xs, 0, "clamp_t"), lo, hi)};
}

// where with a Scalar branch or two; "a"/"b" are null where the branch is a tensor input.
TensorList where_scalar_op(const TensorList& xs, const Json& p) {
  auto scalar = [&](const char* key, const char* integral) {
    return p.at(integral).get<bool>() ? Scalar(p.at(key).get<int64_t>()) : Scalar(p.at(key).get<double>());
  };
  const Tensor& cond = arg(xs, 0, "where_s");
  const bool a_is_tensor = p.at("a").is_null(), b_is_tensor = p.at("b").is_null();
  if (a_is_tensor && !b_is_tensor) return {where(cond, arg(xs, 1, "where_s"), scalar("b", "b_integral"))};
  if (!a_is_tensor && b_is_tensor) return {where(cond, scalar("a", "a_integral"), arg(xs, 1, "where_s"))};
  TANDEM_CHECK(!a_is_tensor && !b_is_tensor, "[parity] where_s needs at least one Scalar branch");
  return {where(cond, scalar("a", "a_integral"), scalar("b", "b_integral"))};
}

TensorList split_op(const TensorList& xs, const Json& p) {
  const int64_t dim = p.at("dim").get<int64_t>();
  if (p.contains("sizes")) return split(arg(xs, 0, "split"), p.at("sizes").get<std::vector<int64_t>>(), dim);
  return split(arg(xs, 0, "split"), p.at("size").get<int64_t>(), dim);
}

TensorList extreme_dim(const TensorList& xs, const Json& p, bool is_max) {
  auto [values, indices] = is_max ? max(arg(xs, 0, "max_dim"), p.at("dim").get<int64_t>(), p.at("keepdim").get<bool>())
                                  : min(arg(xs, 0, "min_dim"), p.at("dim").get<int64_t>(), p.at("keepdim").get<bool>());
  return {values, indices};
}

Tensor reduce_op(const Tensor& a, const Json& p, Tensor (*all)(const Tensor&),
                 Tensor (*some)(const Tensor&, const Shape&, bool)) {
  auto dims = dims_arg(p);
  return dims ? some(a, *dims, p.at("keepdim").get<bool>()) : all(a);
}

Tensor var_std_op(const Tensor& a, const Json& p, bool is_std) {
  auto dims = dims_arg(p);
  if (!dims) return is_std ? tandem::std(a) : var(a);
  const int64_t correction = p.at("correction").get<int64_t>();
  const bool keepdim = p.at("keepdim").get<bool>();
  return is_std ? tandem::std(a, *dims, correction, keepdim) : var(a, *dims, correction, keepdim);
}

Tensor arg_op(const Tensor& a, const Json& p, bool is_max) {
  if (p.at("dim").is_null()) return is_max ? argmax(a) : argmin(a);
  const int64_t d = p.at("dim").get<int64_t>();
  const bool keepdim = p.at("keepdim").get<bool>();
  return is_max ? argmax(a, d, keepdim) : argmin(a, d, keepdim);
}

// Creation ops take a dtype, or null for PyTorch's default (inferred by arange, f32 otherwise).
TensorList arange_op(const TensorList&, const Json& p) {
  auto scalar = [&](const std::string& k) {
    return p.at(k + "_integral").get<bool>() ? Scalar(p.at(k).get<int64_t>()) : Scalar(p.at(k).get<double>());
  };
  if (p.at("dtype").is_null()) return {arange(scalar("start"), scalar("end"), scalar("step"))};
  return {arange(scalar("start"), scalar("end"), scalar("step"), dtype_arg(p.at("dtype").get<std::string>()))};
}

TensorOptions options_arg(const Json& p) {
  return p.at("dtype").is_null() ? TensorOptions() : TensorOptions(dtype_arg(p.at("dtype").get<std::string>()));
}

const std::map<std::string, OpFn>& op_table() {
  static const std::map<std::string, OpFn> table{
      // views and copies
      PARITY_OP("transpose", transpose(x(0), q.at("d0").get<int64_t>(), q.at("d1").get<int64_t>())),
      PARITY_OP("permute", permute(x(0), shape_arg(q.at("dims")))),
      PARITY_OP("narrow", narrow(x(0), q.at("dim").get<int64_t>(), q.at("start").get<int64_t>(),
                                 q.at("length").get<int64_t>())),
      PARITY_OP("slice", slice(x(0), q.at("dim").get<int64_t>(), q.at("start").get<int64_t>(),
                               q.at("end").get<int64_t>(), q.at("step").get<int64_t>())),
      PARITY_OP("select", select(x(0), q.at("dim").get<int64_t>(), q.at("index").get<int64_t>())),
      PARITY_OP("expand", expand(x(0), shape_arg(q.at("shape")))),
      PARITY_OP("unsqueeze", unsqueeze(x(0), q.at("dim").get<int64_t>())),
      PARITY_OP("squeeze", q.contains("dim") ? squeeze(x(0), q.at("dim").get<int64_t>()) : squeeze(x(0))),
      PARITY_OP("view", view(x(0), shape_arg(q.at("shape")))),
      PARITY_OP("reshape", reshape(x(0), shape_arg(q.at("shape")))),
      PARITY_OP("flatten", flatten(x(0), q.at("start").get<int64_t>(), q.at("end").get<int64_t>())),
      PARITY_OP("contiguous", contiguous(x(0))),
      PARITY_OP("clone", clone(x(0))),
      // elementwise
      PARITY_OP("add", add(x(0), x(1), scalar_arg(q, "alpha"))),
      PARITY_OP("sub", sub(x(0), x(1), scalar_arg(q, "alpha"))),
      PARITY_OP("mul", mul(x(0), x(1))),
      PARITY_OP("div", div(x(0), x(1))),
      PARITY_OP("maximum", maximum(x(0), x(1))),
      PARITY_OP("minimum", minimum(x(0), x(1))),
      PARITY_OP("pow", pow(x(0), x(1))),
      PARITY_OP("add_s", add(x(0), scalar_arg(q, "value"))),
      PARITY_OP("sub_s", sub(x(0), scalar_arg(q, "value"))),
      PARITY_OP("mul_s", mul(x(0), scalar_arg(q, "value"))),
      PARITY_OP("div_s", div(x(0), scalar_arg(q, "value"))),
      PARITY_OP("rsub_s", rsub(x(0), scalar_arg(q, "value"))),
      PARITY_OP("s_div", scalar_arg(q, "value") / x(0)),
      PARITY_OP("pow_s", pow(x(0), scalar_arg(q, "value"))),
      PARITY_OP("neg", neg(x(0))),
      PARITY_OP("abs", abs(x(0))),
      PARITY_OP("exp", exp(x(0))),
      PARITY_OP("log", log(x(0))),
      PARITY_OP("sqrt", sqrt(x(0))),
      PARITY_OP("rsqrt", rsqrt(x(0))),
      PARITY_OP("tanh", tanh(x(0))),
      PARITY_OP("sigmoid", sigmoid(x(0))),
      PARITY_OP("relu", relu(x(0))),
      PARITY_OP("gelu", gelu(x(0), q.at("tanh").get<bool>())),
      PARITY_OP("silu", silu(x(0))),
      PARITY_OP("clamp", clamp(x(0), optional_double(q, "lo"), optional_double(q, "hi"))),
      PARITY_OP("where", where(x(0), x(1), x(2))),
      {"where_s", where_scalar_op},
      {"clamp_t", clamp_tensors_op},
      PARITY_OP("masked_fill", masked_fill(x(0), x(1), scalar_arg(q, "value"))),
      PARITY_OP("to_dtype", to_dtype(x(0), dtype_arg(q.at("dtype").get<std::string>()))),
      PARITY_OP("eq", eq(x(0), x(1))),
      PARITY_OP("ne", ne(x(0), x(1))),
      PARITY_OP("lt", lt(x(0), x(1))),
      PARITY_OP("le", le(x(0), x(1))),
      PARITY_OP("gt", gt(x(0), x(1))),
      PARITY_OP("ge", ge(x(0), x(1))),
      PARITY_OP("eq_s", eq(x(0), scalar_arg(q, "value"))),
      PARITY_OP("ne_s", ne(x(0), scalar_arg(q, "value"))),
      PARITY_OP("lt_s", lt(x(0), scalar_arg(q, "value"))),
      PARITY_OP("le_s", le(x(0), scalar_arg(q, "value"))),
      PARITY_OP("gt_s", gt(x(0), scalar_arg(q, "value"))),
      PARITY_OP("ge_s", ge(x(0), scalar_arg(q, "value"))),
      PARITY_OP("logical_and", logical_and(x(0), x(1))),
      PARITY_OP("logical_or", logical_or(x(0), x(1))),
      PARITY_OP("logical_xor", logical_xor(x(0), x(1))),
      PARITY_OP("logical_not", logical_not(x(0))),
      PARITY_OP("isnan", isnan(x(0))),
      PARITY_OP("isinf", isinf(x(0))),
      // creation
      {"arange", arange_op},
      PARITY_OP("linspace", linspace(q.at("start").get<double>(), q.at("end").get<double>(),
                                     q.at("steps").get<int64_t>(), options_arg(q))),
      PARITY_OP("eye", eye(q.at("n").get<int64_t>(), options_arg(q))),
      PARITY_OP("full", full(shape_arg(q.at("shape")), scalar_arg(q, "value"), options_arg(q))),
      // in place: the destination's handle comes back (it aliases the input)
      PARITY_OP("add_", add_(x(0), x(1), scalar_arg(q, "alpha"))),
      PARITY_OP("sub_", sub_(x(0), x(1), scalar_arg(q, "alpha"))),
      PARITY_OP("mul_", mul_(x(0), x(1))),
      PARITY_OP("div_", div_(x(0), x(1))),
      PARITY_OP("add_s_", add_(x(0), scalar_arg(q, "value"))),
      PARITY_OP("sub_s_", sub_(x(0), scalar_arg(q, "value"))),
      PARITY_OP("mul_s_", mul_(x(0), scalar_arg(q, "value"))),
      PARITY_OP("div_s_", div_(x(0), scalar_arg(q, "value"))),
      PARITY_OP("zero_", zero_(x(0))),
      PARITY_OP("fill_", fill_(x(0), scalar_arg(q, "value"))),
      PARITY_OP("copy_", copy_(x(0), x(1))),
      PARITY_OP("clamp_", clamp_(x(0), optional_double(q, "lo"), optional_double(q, "hi"))),
      PARITY_OP("addcmul_", addcmul_(x(0), x(1), x(2), scalar_arg(q, "value"))),
      PARITY_OP("addcdiv_", addcdiv_(x(0), x(1), x(2), scalar_arg(q, "value"))),
      PARITY_OP("lerp_", lerp_(x(0), x(1), Scalar(q.at("weight").get<double>()))),
      // reductions
      PARITY_OP("sum", reduce_op(x(0), q, sum, sum)),
      PARITY_OP("mean", reduce_op(x(0), q, mean, mean)),
      PARITY_OP("max_all", max(x(0))),
      PARITY_OP("min_all", min(x(0))),
      {"max_dim", [](const TensorList& xs, const Json& p) { return extreme_dim(xs, p, true); }},
      {"min_dim", [](const TensorList& xs, const Json& p) { return extreme_dim(xs, p, false); }},
      PARITY_OP("amax", amax(x(0), shape_arg(q.at("dims")), q.at("keepdim").get<bool>())),
      PARITY_OP("amin", amin(x(0), shape_arg(q.at("dims")), q.at("keepdim").get<bool>())),
      PARITY_OP("argmax", arg_op(x(0), q, true)),
      PARITY_OP("argmin", arg_op(x(0), q, false)),
      PARITY_OP("var", var_std_op(x(0), q, false)),
      PARITY_OP("std", var_std_op(x(0), q, true)),
      PARITY_OP("logsumexp", logsumexp(x(0), shape_arg(q.at("dims")), q.at("keepdim").get<bool>())),
      PARITY_OP("norm", norm(x(0))),
      {"topk",
       [](const TensorList& xs, const Json& p) {
         auto [values, indices] = topk(arg(xs, 0, "topk"), p.at("k").get<int64_t>(), p.at("dim").get<int64_t>(),
                                       p.at("largest").get<bool>(), p.at("sorted").get<bool>());
         return TensorList{values, indices};
       }},
      // linear algebra
      PARITY_OP("matmul", matmul(x(0), x(1))),
      PARITY_OP("mm", mm(x(0), x(1))),
      PARITY_OP("bmm", bmm(x(0), x(1))),
      PARITY_OP("linear", linear(x(0), x(1), xs.size() > 2 ? x(2) : Tensor())),
      PARITY_OP("addmm", addmm(x(0), x(1), x(2))),
      // nn functional
      PARITY_OP("softmax", softmax(x(0), q.at("dim").get<int64_t>())),
      PARITY_OP("log_softmax", log_softmax(x(0), q.at("dim").get<int64_t>())),
      {"layer_norm", layer_norm_op},
      PARITY_OP("dropout", dropout(x(0), q.at("p").get<double>(), q.at("training").get<bool>())),
      PARITY_OP("embedding", embedding(x(0), x(1))),
      {"batch_norm1d", batch_norm1d},
      {"cross_entropy", [](const TensorList& xs, const Json& p) { return loss_op(xs, p, true); }},
      {"nll_loss", [](const TensorList& xs, const Json& p) { return loss_op(xs, p, false); }},
      PARITY_OP("mse_loss", nn::mse_loss(x(0), x(1), reduction_arg(q))),
      // indexing and joining
      PARITY_OP("index_select", index_select(x(0), q.at("dim").get<int64_t>(), x(1))),
      PARITY_OP("gather", gather(x(0), q.at("dim").get<int64_t>(), x(1))),
      PARITY_OP("scatter_add", scatter_add(x(0), q.at("dim").get<int64_t>(), x(1), x(2))),
      {"cat", [](const TensorList& xs, const Json& p) -> TensorList { return {cat(xs, p.at("dim").get<int64_t>())}; }},
      {"stack",
       [](const TensorList& xs, const Json& p) -> TensorList { return {stack(xs, p.at("dim").get<int64_t>())}; }},
      {"split", split_op},
      {"chunk",
       [](const TensorList& xs, const Json& p) {
         return chunk(arg(xs, 0, "chunk"), p.at("chunks").get<int64_t>(), p.at("dim").get<int64_t>());
       }},
      // triangles
      PARITY_OP("tril", tril(x(0), q.at("diagonal").get<int64_t>())),
      PARITY_OP("triu", triu(x(0), q.at("diagonal").get<int64_t>())),
      // attention (dropout_p 0: PyTorch cannot draw Tandem's Philox keep bits)
      PARITY_OP("scaled_dot_product_attention",
                scaled_dot_product_attention(x(0), x(1), x(2), xs.size() > 3 ? x(3) : Tensor(), 0.0,
                                             q.at("is_causal").get<bool>(), optional_double(q, "scale"))),
  };
  return table;
}
#undef PARITY_OP

TensorList run_op(const std::string& name, const TensorList& xs, const Json& step) {
  auto it = op_table().find(name);
  TANDEM_CHECK(it != op_table().end(), "[parity] the manifest names op '{}', which this test does not know", name);
  return it->second(xs, step);
}

Tensor apply_views(Tensor t, const Json& views) {
  for (const Json& v : views) t = run_op(v.at("op").get<std::string>(), {t}, v)[0];
  return t;
}

std::string geometry(const Tensor& t) {
  return fmt::format("shape {} strides {} offset {} {}", t.shape(), t.strides(), t.storage_offset(), t.dtype());
}

// ---- comparison ----

// f16 and bf16 results are one rounding of an f32 computation in both libraries: one unit in
// their last place (2^-10 and 2^-7 relative) covers an f32 result that lands on the other side
// of a rounding boundary.
double tolerance_for(Dtype d) {
  switch (d) {
    case f64: return 1e-10;
    case f16: return 0x1p-10;
    case bf16: return 0x1p-7;
    default: return 1e-4;
  }
}

// Empty when `got` matches `want`; otherwise what differs, with the worst element.
// `noise` is how far PyTorch's own f32 result lies from its f64 one for this tensor (the
// generator measures it on the case's twins): allowed errors grow by kNoiseFactor times it, scaled
// by the epsilon ratio for f64, so that an ill-conditioned tensor (a gradient summed over expanded
// dims that cancels, a normalised near-constant slice) is judged by the rounding it really has.
constexpr double kNoiseFactor = 10;
constexpr double kEpsilonRatio = 0x1p-29;  // f64 epsilon / f32 epsilon

std::string compare(const Tensor& got, const Tensor& want, double case_tol, double noise, double term_scale,
                    bool exact_values = false) {
  if (!got.defined()) return "undefined in Tandem";
  if (got.dtype() != want.dtype()) return fmt::format("dtype {} in Tandem, {} in PyTorch", got.dtype(), want.dtype());
  if (got.shape() != want.shape()) return fmt::format("shape {} in Tandem, {} in PyTorch", got.shape(), want.shape());
  const std::vector<double> g = got.to_vector<double>();
  const std::vector<double> w = want.to_vector<double>();
  const bool exact = exact_values || !want.is_floating_point();
  const double tol = std::max(case_tol, tolerance_for(want.dtype()));
  // Inputs and upstream gradients are O(1) by construction, so every computation has terms of
  // size ~1 at least: the absolute part of the tolerance never drops below tol itself.
  double scale = std::max(1.0, term_scale);
  for (double v : w)
    if (std::isfinite(v)) scale = std::max(scale, std::abs(v));
  const double widening = kNoiseFactor * noise * (want.dtype() == f64 ? kEpsilonRatio : 1.0);
  size_t bad = 0, worst = 0;
  double worst_excess = -1;
  for (size_t i = 0; i < w.size(); ++i) {
    bool ok;
    double excess = 0;
    if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
      excess = ok ? 0 : INFINITY;
    } else if (std::isinf(w[i]) || exact) {
      ok = g[i] == w[i];
      excess = ok ? 0 : INFINITY;
    } else {
      const double err = std::abs(g[i] - w[i]);
      const double allowed = tol * (std::abs(w[i]) + scale) + widening;
      ok = err <= allowed;  // false for a NaN in Tandem
      excess = std::isnan(err) ? INFINITY : err / allowed;
    }
    if (!ok) {
      ++bad;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return {};
  std::ostringstream os;
  os.precision(17);
  os << bad << " of " << w.size() << " elements differ; worst: flat index " << worst << ": Tandem " << g[worst]
     << ", PyTorch " << w[worst];
  if (!exact) os << " (allowed " << tol << " * (|want| + " << scale << ") + " << widening << ")";
  if (w.size() <= 24) {
    os << "\n      Tandem:  [";
    for (size_t i = 0; i < g.size(); ++i) os << (i ? ", " : "") << g[i];
    os << "]\n      PyTorch: [";
    for (size_t i = 0; i < w.size(); ++i) os << (i ? ", " : "") << w[i];
    os << "]";
  }
  return os.str();
}

bool all_zero(const Tensor& t) {
  for (double v : t.to_vector<double>())
    if (v != 0) return false;
  return true;
}

// ---- one case ----

const Tensor& tensor_at(const nn::TensorDict& data, const std::string& key) {
  const Tensor* t = data.find(key);
  TANDEM_CHECK(t != nullptr, "[parity] the manifest names tensor '{}', which the safetensors file lacks", key);
  return *t;
}

// What the replays compared, so the summary (and a check) can show that they compare anything.
struct Counts {
  size_t outputs = 0, gradients = 0, elements = 0;
};

// Replays `c` and returns what disagrees (empty: the case passes).
std::vector<std::string> replay(const Json& c, const nn::TensorDict& data, Counts* counts = nullptr) {
  std::vector<std::string> problems;
  const double case_tol = tolerance_for(dtype_arg(c.at("precision").get<std::string>()));
  std::map<std::string, Tensor> env;
  struct Leaf {
    std::string name;
    Tensor base;
    Json grad_key;
    double noise;
    double term_scale;
  };
  std::vector<Leaf> leaves;
  std::string geometries;
  try {
    for (const Json& in : c.at("inputs")) {
      // A fresh copy: each replay starts from unused leaves (no gradient, no history).
      Tensor base = tensor_at(data, in.at("key").get<std::string>()).clone();
      if (in.at("requires_grad").get<bool>()) base.requires_grad_();
      Tensor t = apply_views(base, in.at("views"));
      const std::string name = in.at("name").get<std::string>();
      env[name] = t;
      env[name + ".base"] = base;  // what an in-place op through the view left of the base
      geometries += fmt::format("\n    Tandem {}: {}", name, geometry(t));
      if (in.at("requires_grad").get<bool>())
        leaves.push_back({name, base, in.at("grad"), in.value("grad_noise", 0.0), in.value("grad_scale", 0.0)});
    }
    const bool expect_error = c.contains("error") && !c.at("error").is_null();
    for (const Json& step : c.at("steps")) {
      TensorList xs;
      for (const Json& n : step.at("in")) xs.push_back(env.at(n.get<std::string>()));
      if (expect_error && &step == &c.at("steps").back()) {
        // PyTorch refuses this step; Tandem must throw its own Error (not crash, not compute).
        try {
          TensorList outs = run_op(step.at("op").get<std::string>(), xs, step);
          problems.push_back(fmt::format("PyTorch raises ({}), Tandem returned {} without an error",
                                         c.at("error").get<std::string>(),
                                         outs.empty() ? std::string("nothing") : geometry(outs[0])));
        } catch (const Error&) {
        }
        if (!problems.empty()) problems.back() += geometries;
        return problems;
      }
      TensorList outs = run_op(step.at("op").get<std::string>(), xs, step);
      const Json& names = step.at("out");
      TANDEM_CHECK(outs.size() == names.size(), "[parity] {} gave {} outputs, PyTorch {}", step.at("op").dump(),
                   outs.size(), names.size());
      for (size_t i = 0; i < outs.size(); ++i) env[names[i].get<std::string>()] = outs[i];
    }
    TensorList roots, grads;
    for (const Json& out : c.at("outputs")) {
      const std::string name = out.at("name").get<std::string>();
      const Tensor& got = env.at(name);
      std::string diff =
          compare(got, tensor_at(data, out.at("expected").get<std::string>()), case_tol, out.value("noise", 0.0), 0.0,
                  out.value("exact", false));
      if (!diff.empty()) problems.push_back("output " + name + ": " + diff);
      if (counts) ++counts->outputs, counts->elements += static_cast<size_t>(got.numel());
      if (out.contains("upstream")) {
        const Json& up = out.at("upstream");
        if (!got.requires_grad()) {
          problems.push_back("output " + name + " does not require grad in Tandem (it does in PyTorch)");
          continue;
        }
        roots.push_back(got);
        grads.push_back(apply_views(tensor_at(data, up.at("key").get<std::string>()), up.at("views")));
      }
    }
    if (!roots.empty()) autograd::backward(roots, grads);
    for (const Leaf& leaf : leaves) {
      Tensor g = leaf.base.grad();
      if (leaf.grad_key.is_null()) {
        // PyTorch's backward never reached this leaf: no gradient, or an all-zero one.
        if (g.defined() && !all_zero(g))
          problems.push_back("gradient of " + leaf.name + ": non-zero in Tandem, none in PyTorch");
        continue;
      }
      std::string diff =
          compare(g, tensor_at(data, leaf.grad_key.get<std::string>()), case_tol, leaf.noise, leaf.term_scale);
      if (!diff.empty()) problems.push_back("gradient of " + leaf.name + ": " + diff);
      if (counts) ++counts->gradients, counts->elements += static_cast<size_t>(leaf.base.numel());
    }
  } catch (const std::exception& e) {
    problems.push_back(std::string("threw: ") + e.what());
  }
  if (!problems.empty()) problems.back() += geometries;
  return problems;
}

std::string report(const Json& c, const std::vector<std::string>& problems) {
  std::string s = c.at("id").get<std::string>() + " " + c.at("desc").get<std::string>();
  for (const auto& p : problems) s += "\n  - " + p;
  return s;
}

}  // namespace

TEST_CASE("parity: every op, view and chain agrees with PyTorch", "[parity]") {
  if (auto why = torch_unavailable()) {
    WARN("SKIP: the PyTorch parity cases cannot run: " << *why);
    return;
  }
  Generated gen;
  generate(gen);
  const Json& cases = gen.manifest.at("cases");
  // Every template gives an f64 and an f32 case.
  REQUIRE(cases.size() == 2 * static_cast<size_t>(std::stoll(env_or("TANDEM_PARITY_COUNT", kDefaultCount))));

  const auto start = std::chrono::steady_clock::now();
  std::map<std::string, int> failed_by_family, ran_by_family;
  std::vector<std::string> reports;
  size_t failed = 0;
  Counts counts;
  for (const Json& c : cases) {
    const std::string family = c.at("family").get<std::string>();
    ++ran_by_family[family];
    auto problems = replay(c, gen.tensors, &counts);
    if (problems.empty()) continue;
    ++failed;
    ++failed_by_family[family];
    reports.push_back(report(c, problems));
  }
  const double replay_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::string summary;
  for (const auto& [family, n] : ran_by_family)
    summary += fmt::format(" {}={}{}", family, n,
                           failed_by_family.count(family) ? fmt::format(" ({} failed)", failed_by_family[family]) : "");
  std::cout << fmt::format(
      "parity: {} cases from seed {} (PyTorch {}): generated in {:.1f} s, replayed in {:.1f} s; compared {} outputs "
      "and {} gradients ({} elements);{}\n",
      cases.size(), gen.manifest.at("seed").get<int64_t>(), gen.manifest.at("torch").get<std::string>(), gen.seconds,
      replay_seconds, counts.outputs, counts.gradients, counts.elements, summary);
  // Every gradient PyTorch computed was compared (a replay that skipped some must fail), and the
  // generator still produces them.
  size_t expected_gradients = 0;
  for (const Json& c : cases)
    for (const Json& in : c.at("inputs")) expected_gradients += in.contains("grad") && !in.at("grad").is_null();
  if (failed == 0) CHECK(counts.gradients == expected_gradients);
  if (env_or("TANDEM_PARITY_ONLY", "").empty()) CHECK(expected_gradients >= cases.size() / 2);
  const std::string report_path = env_or("TANDEM_PARITY_REPORT", "");
  if (!report_path.empty()) {
    std::ofstream out(report_path);
    for (const auto& r : reports) out << r << "\n\n";
  }
  // Every disagreement is its own failure, up to a readable number of them.
  constexpr size_t kShown = 40;
  for (size_t i = 0; i < std::min(reports.size(), kShown); ++i) FAIL_CHECK(reports[i]);
  if (reports.size() > kShown)
    FAIL_CHECK(reports.size() - kShown << " more cases disagree (TANDEM_PARITY_REPORT=<file> writes them all)");
  CHECK(failed == 0);

  // The comparison itself must be able to fail: perturb one passing case's expected output, then
  // one of its expected gradients, just beyond the tolerance, and check the replay reports each;
  // then claim that the case's last step raises in PyTorch, which Tandem's success must contradict.
  bool perturbed_once = false;
  for (const Json& c : cases) {
    if (c.at("outputs").empty() || c.at("inputs").empty()) continue;
    const Json& out = c.at("outputs")[0];
    const Json& in = c.at("inputs")[0];
    const std::string out_key = out.at("expected").get<std::string>();
    const Tensor& want = tensor_at(gen.tensors, out_key);
    if (c.at("allow_nonfinite").get<bool>() || !want.is_floating_point() || want.numel() == 0 ||
        !in.at("requires_grad").get<bool>() || in.at("grad").is_null())
      continue;
    const std::string grad_key = in.at("grad").get<std::string>();
    const Tensor& grad = tensor_at(gen.tensors, grad_key);
    if (grad.numel() == 0 || !replay(c, gen.tensors).empty()) continue;
    auto perturbed_replay = [&](const std::string& key, const Tensor& t, double noise, double term_scale) {
      // Every element moved up by three times what the comparison allows it.
      const double tol =
          std::max(tolerance_for(t.dtype()), tolerance_for(dtype_arg(c.at("precision").get<std::string>())));
      const double widening = kNoiseFactor * noise * (t.dtype() == f64 ? kEpsilonRatio : 1.0);
      nn::TensorDict perturbed = gen.tensors;
      const double scale = std::max({1.0, term_scale, max(abs(t)).item<double>()});
      Tensor bumped = add(add(t, mul(abs(t), 3 * tol)), 3 * (tol * scale + widening));
      perturbed.insert_or_assign(key, bumped.detach());
      return replay(c, perturbed);
    };
    auto problems = perturbed_replay(out_key, want, out.value("noise", 0.0), 0.0);
    INFO(report(c, problems));
    REQUIRE(problems.size() == 1);
    REQUIRE_THAT(problems[0], Catch::Contains("output"));
    problems = perturbed_replay(grad_key, grad, in.value("grad_noise", 0.0), in.value("grad_scale", 0.0));
    INFO(report(c, problems));
    REQUIRE(problems.size() == 1);
    REQUIRE_THAT(problems[0], Catch::Contains("gradient of"));
    // And an error case whose step Tandem accepts must fail: this case, claimed to raise.
    Json claimed = c;
    claimed["error"] = "a synthetic error";
    problems = replay(claimed, gen.tensors);
    INFO(report(claimed, problems));
    REQUIRE(problems.size() == 1);
    REQUIRE_THAT(problems[0], Catch::Contains("PyTorch raises (a synthetic error), Tandem returned"));
    perturbed_once = true;
    break;
  }
  // (A run narrowed by TANDEM_PARITY_ONLY to forward-only families may have no suitable case.)
  if (env_or("TANDEM_PARITY_ONLY", "").empty()) CHECK(perturbed_once);
}
