// Module-level parity with PyTorch: tests/parity/module_cases.py (run here with /usr/bin/python3
// and Debian's python3-torch) builds torch's MultiheadAttention, TransformerEncoderLayer and
// TransformerDecoderLayer in f64 for a handful of configurations, runs forward and backward, and
// writes the parameters (by their state-dict names), inputs, outputs and every gradient. This file
// builds each Tandem module from the manifest's constructor arguments, loads the parameters by
// PyTorch's names (strictly: a renamed parameter fails here), replays the call and compares.
//
// Tolerance, per element: |got - want| <= 1e-10 * (|want| + scale), scale the largest |want| of the
// tensor, at least 1. In f64 both libraries round to ~1e-16 per operation over a few hundred
// operations; a wrong mask, head split or layout is off by O(1).
//
// Knobs (environment): TANDEM_PARITY_SEED, TANDEM_PARITY_DIR (keep the generated files there).
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "parity_generator.h"
#include "tandem.h"

#ifndef TANDEM_PARITY_PYTHON
#error "tests/CMakeLists.txt passes TANDEM_PARITY_PYTHON (the interpreter with torch) to this test"
#endif
#ifndef TANDEM_MODULE_PARITY_GENERATOR
#error "tests/CMakeLists.txt passes TANDEM_MODULE_PARITY_GENERATOR (tests/parity/module_cases.py) to this test"
#endif

namespace fs = std::filesystem;
using namespace tandem;
using Json = nlohmann::json;
using parity::Generated;
using parity::torch_unavailable;

namespace {

constexpr double kTolerance = 1e-10;

void generate(Generated& g) {
  parity::generate(g, TANDEM_MODULE_PARITY_GENERATOR, "tandem-module-parity", "", "module_cases.safetensors",
                   "module_cases.json");
}

const Tensor& tensor_at(const nn::TensorDict& tensors, const std::string& key) {
  const Tensor* t = tensors.find(key);
  TANDEM_CHECK(t != nullptr, "[module parity] the file lacks tensor '{}'", key);
  return *t;
}

nn::Activation activation_arg(const std::string& name) {
  if (name == "relu") return nn::Activation::relu;
  if (name == "gelu") return nn::Activation::gelu;
  fail("[module parity] unknown activation '{}'", name);
}

std::shared_ptr<nn::Module> build(const Json& c) {
  const std::string kind = c.at("kind").get<std::string>();
  const Json& a = c.at("args");
  std::shared_ptr<nn::Module> m;
  if (kind == "mha") {
    m = std::make_shared<nn::MultiheadAttention>(a.at("embed_dim").get<int64_t>(), a.at("num_heads").get<int64_t>(),
                                                 0.0, a.at("bias").get<bool>(), a.at("batch_first").get<bool>());
  } else {
    nn::TransformerLayerOptions o{.dim_feedforward = a.at("dim_feedforward").get<int64_t>(),
                                  .dropout = 0.0,
                                  .activation = activation_arg(a.at("activation").get<std::string>()),
                                  .layer_norm_eps = a.at("layer_norm_eps").get<double>(),
                                  .batch_first = a.at("batch_first").get<bool>(),
                                  .norm_first = a.at("norm_first").get<bool>()};
    const int64_t d_model = a.at("d_model").get<int64_t>(), nhead = a.at("nhead").get<int64_t>();
    if (kind == "encoder") {
      m = std::make_shared<nn::TransformerEncoderLayer>(d_model, nhead, o);
    } else if (kind == "decoder") {
      m = std::make_shared<nn::TransformerDecoderLayer>(d_model, nhead, o);
    } else {
      fail("[module parity] unknown module kind '{}'", kind);
    }
  }
  m->to(f64);
  return m;
}

// Where `got` and `want` differ beyond the tolerance, or "" when they agree.
std::string compare(const std::string& what, const Tensor& got, const Tensor& want) {
  if (!got.defined()) return what + ": Tandem computed none";
  if (got.shape() != want.shape()) return fmt::format("{}: shape {}, PyTorch's {}", what, got.shape(), want.shape());
  const auto g = to_dtype(got.detach(), f64).contiguous().to_vector<double>();
  const auto w = to_dtype(want, f64).contiguous().to_vector<double>();
  double scale = 1;
  for (double v : w) scale = std::max(scale, std::abs(v));
  size_t worst = 0;
  double worst_excess = 0;
  size_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(g[i] - w[i]), allowed = kTolerance * (std::abs(w[i]) + scale);
    if (err <= allowed) continue;  // NaN fails here
    if (bad++ == 0 || err / allowed > worst_excess) {
      worst = i;
      worst_excess = std::isnan(err) ? INFINITY : err / allowed;
    }
  }
  if (bad == 0) return "";
  return fmt::format("{}: {} of {} elements differ; worst #{}: got {:.17g}, PyTorch {:.17g}", what, bad, g.size(),
                     worst, g[worst], w[worst]);
}

struct Counts {
  size_t outputs = 0, gradients = 0;
};

// Replays one case; returns its disagreements.
std::vector<std::string> replay(const Json& c, const nn::TensorDict& tensors, Counts& counts) {
  const std::string name = c.at("name").get<std::string>();
  auto key = [&](const std::string& rest) { return name + "/" + rest; };
  std::shared_ptr<nn::Module> module = build(c);

  nn::TensorDict params;
  for (const Json& p : c.at("params")) {
    const std::string k = p.get<std::string>();
    params.insert(k, tensor_at(tensors, key("param/" + k)));
  }
  module->load_state_dict(params, /*strict=*/true);

  // Inputs by slot; "same_as" gives the same tensor (self-attention: one leaf, its gradient summed).
  std::map<std::string, Tensor> by_name;
  TensorList inputs;
  for (const Json& in : c.at("inputs")) {
    const std::string n = in.at("name").get<std::string>();
    Tensor t;
    if (in.contains("same_as")) {
      t = by_name.at(in.at("same_as").get<std::string>());
    } else {
      t = tensor_at(tensors, key("in/" + n)).clone();
      if (in.at("requires_grad").get<bool>()) t.requires_grad_();
    }
    by_name[n] = t;
    const auto slot = in.at("slot").get<size_t>();
    if (inputs.size() <= slot) inputs.resize(slot + 1);
    inputs[slot] = t;
  }

  Tensor out, weights;
  if (c.at("need_weights").get<bool>()) {
    auto* mha = dynamic_cast<nn::MultiheadAttention*>(module.get());
    TANDEM_CHECK(mha != nullptr, "[module parity] {}: need_weights on a module that is not MultiheadAttention", name);
    inputs.resize(5);
    std::tie(out, weights) = mha->forward_with_weights(inputs[0], inputs[1], inputs[2], inputs[3], inputs[4],
                                                       c.at("average_attn_weights").get<bool>());
  } else {
    out = module->call(inputs);
  }

  std::vector<std::string> problems;
  auto check = [&](const std::string& what, const Tensor& got, const Tensor& want) {
    std::string p = compare(what, got, want);
    if (!p.empty()) problems.push_back(p);
  };
  check("output", out, tensor_at(tensors, key("out")));
  ++counts.outputs;
  Tensor loss = sum(out * tensor_at(tensors, key("grad_out")));
  if (weights.defined()) {
    check("attention weights", weights, tensor_at(tensors, key("weights")));
    ++counts.outputs;
    loss = loss + sum(weights * tensor_at(tensors, key("grad_weights")));
  }
  loss.backward();

  for (const Json& in : c.at("inputs")) {
    if (in.contains("same_as") || !in.at("requires_grad").get<bool>()) continue;
    const std::string n = in.at("name").get<std::string>();
    check("gradient of input " + n, by_name.at(n).grad(), tensor_at(tensors, key("grad/" + n)));
    ++counts.gradients;
  }
  for (const auto& [n, p] : module->named_parameters()) {
    check("gradient of parameter " + n, p.grad(), tensor_at(tensors, key("grad/" + n)));
    ++counts.gradients;
  }
  return problems;
}

}  // namespace

TEST_CASE("module parity: MultiheadAttention and Transformer layers agree with PyTorch", "[parity][transformer]") {
  if (auto why = torch_unavailable()) {
    WARN("SKIP: the module parity cases cannot run: " << *why);
    return;
  }
  Generated gen;
  generate(gen);
  const Json& cases = gen.manifest.at("cases");
  REQUIRE(cases.size() >= 10);

  Counts counts;
  size_t failed = 0;
  for (const Json& c : cases) {
    const std::string desc = c.at("name").get<std::string>() + " " + c.at("args").dump();
    std::vector<std::string> problems;
    try {
      problems = replay(c, gen.tensors, counts);
    } catch (const std::exception& e) {
      problems.push_back(std::string("threw: ") + e.what());
    }
    if (problems.empty()) continue;
    ++failed;
    std::string report = desc;
    for (const auto& p : problems) report += "\n  - " + p;
    FAIL_CHECK(report);
  }
  std::cout << fmt::format("module parity: {} cases from seed {} (PyTorch {}); compared {} outputs and {} gradients\n",
                           cases.size(), gen.manifest.at("seed").get<int64_t>(),
                           gen.manifest.at("torch").get<std::string>(), counts.outputs, counts.gradients);
  // Every gradient PyTorch computed was compared: one per file entry under <case>/grad/.
  size_t expected_gradients = 0;
  for (const auto& [k, t] : gen.tensors) expected_gradients += k.find("/grad/") != std::string::npos;
  if (failed == 0) CHECK(counts.gradients == expected_gradients);
  CHECK(failed == 0);

  // The comparison can fail: a gradient moved by three times what it is allowed must be caught.
  const auto it = std::find_if(gen.tensors.begin(), gen.tensors.end(),
                               [](const auto& kv) { return kv.first.find("/grad/") != std::string::npos; });
  REQUIRE(it != gen.tensors.end());
  const auto& [k, t] = *it;
  const double scale = std::max(1.0, max(abs(t)).item<double>());
  CHECK_FALSE(compare(k, add(t, 3 * kTolerance * 2 * scale), t).empty());
}
