// nn: weight tying (lm_head.weight is wte.weight) through Module::set_parameter: one parameter,
// two uses. named_parameters, the optimizers (SGD with momentum, AdamW) and the optimizer in
// backward see it once; state_dict keeps both names, as PyTorch's does, and loading it fills the
// one tensor; a safetensors file holds its bytes once, the second name an alias in the metadata. The DDP side is in tests/dist
// (ddp_cases.h: tied_equivalence).
#include <catch2/catch.hpp>

#include <fstream>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <unistd.h>

#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;
using Catch::Contains;

namespace {

constexpr int64_t kVocab = 7, kDim = 5;

// wte -> tanh(mid) -> lm_head, lm_head's weight [vocab, dim] tied to wte's when `tie`.
struct TinyLM : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> mid, lm_head;
  explicit TinyLM(bool tie) : Module("TinyLM") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(kVocab, kDim));
    mid = register_module("mid", std::make_shared<nn::Linear>(kDim, kDim));
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(kDim, kVocab, /*bias=*/false));
    if (tie) set_parameter("lm_head.weight", wte->weight);
  }
  Tensor forward(const Tensor& idx) override { return (*lm_head)(tanh((*mid)(wte->forward(idx)))); }
};

std::shared_ptr<TinyLM> make_lm(bool tie, uint64_t seed = 11) {
  manual_seed(seed);
  auto m = std::make_shared<TinyLM>(tie);
  m->to(f64);
  return m;
}

Tensor tokens(int step) {
  std::vector<int64_t> v;
  for (int i = 0; i < 6; ++i) v.push_back((3 * step + 5 * i + i * i) % kVocab);
  return from_vector<int64_t>(v, {6});
}
Tensor next_tokens(int step) {
  std::vector<int64_t> v;
  for (int i = 0; i < 6; ++i) v.push_back((2 * step + 3 * i + 1) % kVocab);
  return from_vector<int64_t>(v, {6});
}
Tensor loss_of(nn::Module& m, int step) { return nn::cross_entropy(m(tokens(step)), next_tokens(step)); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  return (a.detach().to(f64) - b.detach().to(f64)).abs().max().item<double>();
}

// One step of `make_opt` on the tied model against an untied twin whose single weight W gets the
// sum of the gradients of its two uses, over `steps` steps.
void check_tied_update(const std::function<std::unique_ptr<optim::Optimizer>(const TensorList&)>& make_opt,
                       int steps = 4) {
  auto tied = make_lm(true);
  auto untied = make_lm(false);
  Tensor W = tied->wte->weight.detach().clone().requires_grad_(true);
  TensorList ref_params{W, untied->mid->weight, untied->mid->bias};
  {
    NoGradGuard ng;
    untied->mid->weight.copy_(tied->mid->weight);
    untied->mid->bias.copy_(tied->mid->bias);
  }
  auto opt = make_opt(tied->parameters());
  auto ref_opt = make_opt(ref_params);
  REQUIRE(opt->parameters().size() == 3);
  for (int step = 0; step < steps; ++step) {
    opt->zero_grad();
    loss_of(*tied, step).backward();
    opt->step();

    ref_opt->zero_grad();
    untied->zero_grad();
    {
      NoGradGuard ng;
      untied->wte->weight.copy_(W);
      untied->lm_head->weight.copy_(W);
    }
    loss_of(*untied, step).backward();
    W.set_grad(untied->wte->weight.grad() + untied->lm_head->weight.grad());
    ref_opt->step();
  }
  INFO(opt->name());
  REQUIRE(max_abs_diff(tied->wte->weight, W) <= 1e-12);
  REQUIRE(max_abs_diff(tied->mid->weight, untied->mid->weight) <= 1e-12);
  // One state for the tied weight; the lm_head name reaches the same one.
  REQUIRE(opt->state(tied->wte->weight) != nullptr);
  REQUIRE(opt->state(tied->lm_head->weight) == opt->state(tied->wte->weight));
  REQUIRE(opt->state_dict().size() == ref_opt->state_dict().size());
}

std::string temp_path(const std::string& tag) {
  return fmt::format("/tmp/tandem_weight_tying_{}_{}.safetensors", tag, ::getpid());
}

}  // namespace

TEST_CASE("weight tying: set_parameter ties the layer's member and the registry", "[nn][tying]") {
  auto m = make_lm(true);
  REQUIRE(m->lm_head->weight.is_same(m->wte->weight));
  REQUIRE(m->parameter("lm_head.weight").is_same(m->wte->weight));
  REQUIRE(m->lm_head->parameter("weight").is_same(m->wte->weight));
  // Listed once, under the first name.
  REQUIRE(m->named_parameters().keys() == std::vector<std::string>{"wte.weight", "mid.weight", "mid.bias"});
  REQUIRE(m->parameters().size() == 3);
  // state_dict keeps both names (PyTorch's), aliasing the one tensor.
  auto sd = m->state_dict();
  REQUIRE(sd.keys() == std::vector<std::string>{"wte.weight", "mid.weight", "mid.bias", "lm_head.weight"});
  REQUIRE(sd.at("lm_head.weight").data_ptr() == sd.at("wte.weight").data_ptr());

  // The gradient of the tied weight is the sum of the gradients of both uses.
  auto untied = make_lm(false);
  {
    NoGradGuard ng;
    untied->lm_head->weight.copy_(m->wte->weight);
  }
  REQUIRE(max_abs_diff(untied->wte->weight, m->wte->weight) == 0);
  REQUIRE(max_abs_diff(loss_of(*m, 0), loss_of(*untied, 0)) == 0);
  loss_of(*m, 1).backward();
  loss_of(*untied, 1).backward();
  REQUIRE(max_abs_diff(m->wte->weight.grad(), untied->wte->weight.grad() + untied->lm_head->weight.grad()) <= 1e-14);
  REQUIRE(max_abs_diff(untied->lm_head->weight.grad(), zeros({kVocab, kDim}, f64)) > 0);  // both uses contribute
  REQUIRE(max_abs_diff(untied->wte->weight.grad(), zeros({kVocab, kDim}, f64)) > 0);

  // to() converts the tied tensor once and keeps the tie.
  m->to(f32);
  REQUIRE(m->lm_head->weight.is_same(m->wte->weight));
  REQUIRE(m->wte->weight.dtype() == f32);
}

TEST_CASE("weight tying: set_parameter errors", "[nn][tying]") {
  nn::Module root("Root");
  auto wte = root.register_module("wte", std::make_shared<nn::Embedding>(kVocab, kDim));
  auto wrong = root.register_module("wrong", std::make_shared<nn::Linear>(kVocab, kDim, false));  // [dim, vocab]
  Tensor before = wrong->weight;
  REQUIRE_THROWS_WITH(root.set_parameter("wrong.weight", wte->weight),
                      Contains("[set_parameter]") && Contains("'wrong.weight'") && Contains("[5, 7]") &&
                          Contains("[7, 5]"));
  REQUIRE_THROWS_WITH(root.set_parameter("wrong.weight", zeros({kDim, kVocab}, f64)), Contains("f64"));
  REQUIRE_THROWS_WITH(root.set_parameter("wrong.scale", zeros({kDim, kVocab})), Contains("no parameter named"));
  REQUIRE_THROWS_WITH(root.set_parameter("nope.weight", zeros({kDim, kVocab})), Contains("no submodule 'nope'"));
  REQUIRE_THROWS_WITH(root.set_parameter("wrong.weight", Tensor()), Contains("undefined"));
  Tensor leaf = zeros({kDim, kVocab}).requires_grad_(true);
  REQUIRE_THROWS_WITH(root.set_parameter("wrong.weight", leaf * 2.0), Contains("leaf"));
  // Nothing changed.
  REQUIRE(wrong->weight.is_same(before));
  REQUIRE(root.parameter("wrong.weight").is_same(before));
  // A module that reads its parameters through parameter() needs no override.
  nn::Module holder("Holder");
  holder.register_parameter("w", zeros({2}));
  Tensor other = ones({2}).requires_grad_(true);
  holder.set_parameter("w", other);
  REQUIRE(holder.parameter("w").is_same(other));
}

TEST_CASE("weight tying: SGD with momentum and AdamW update the tied weight once per step", "[nn][tying][optim]") {
  check_tied_update([](const TensorList& p) {
    return std::make_unique<optim::SGD>(p, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01});
  });
  check_tied_update([](const TensorList& p) {
    return std::make_unique<optim::AdamW>(p, optim::AdamWOptions{.lr = 0.01});
  });
  // Listing the tied weight under both names is the duplicate it is.
  auto m = make_lm(true);
  REQUIRE_THROWS(optim::SGD(TensorList{m->wte->weight, m->lm_head->weight}, {.lr = 0.1}));
}

TEST_CASE("weight tying: the optimizer in backward steps the tied weight once per backward", "[nn][tying][optim]") {
  auto in_bw = make_lm(true);
  auto ref = make_lm(true);
  auto opts = optim::apply_optimizer_in_backward(optim::AdamWOptions{.lr = 0.01}, in_bw->parameters());
  REQUIRE(opts->size() == 3);
  optim::AdamW ref_opt(ref->parameters(), {.lr = 0.01});
  const int steps = 3;
  for (int step = 0; step < steps; ++step) {
    loss_of(*in_bw, step).backward();
    ref_opt.zero_grad();
    loss_of(*ref, step).backward();
    ref_opt.step();
  }
  const auto* st = opts->optimizer_for(in_bw->wte->weight).state(in_bw->wte->weight);
  REQUIRE(st != nullptr);
  REQUIRE(st->step == steps);
  REQUIRE(&opts->optimizer_for(in_bw->lm_head->weight) == &opts->optimizer_for(in_bw->wte->weight));
  for (const auto& [name, p] : ref->named_parameters()) {
    INFO(name);
    REQUIRE(max_abs_diff(in_bw->parameter(name), p) <= 1e-12);
  }
}

TEST_CASE("weight tying: state_dict and safetensors round trips keep both names and one tensor", "[nn][tying][safetensors]") {
  auto src = make_lm(true, 11);
  auto dst = make_lm(true, 99);
  REQUIRE(max_abs_diff(src->wte->weight, dst->wte->weight) > 0);

  // load_state_dict: both keys go to the one tensor; the tie survives.
  dst->load_state_dict(src->state_dict());
  REQUIRE(dst->lm_head->weight.is_same(dst->wte->weight));
  for (const auto& [name, t] : src->state_dict()) REQUIRE(max_abs_diff(dst->state_dict().at(name), t) == 0);

  // A file holds the tied weight's bytes once: lm_head.weight is an alias of wte.weight in the
  // metadata (a reader that ignores it, as Hugging Face's, sees wte.weight only), and loading the
  // file gives both names, as one tensor.
  const std::string path = temp_path("model");
  nn::save_model(*src, path);
  {
    std::ifstream f(path, std::ios::binary);
    uint64_t header_len = 0;
    f.read(reinterpret_cast<char*>(&header_len), 8);
    std::string header(header_len, '\0');
    f.read(header.data(), static_cast<std::streamsize>(header_len));
    f.seekg(0, std::ios::end);
    const int64_t data_bytes = static_cast<int64_t>(f.tellg()) - 8 - static_cast<int64_t>(header_len);
    int64_t one_copy = 0;
    for (const auto& [name, t] : src->named_parameters()) one_copy += t.numel() * static_cast<int64_t>(t.element_size());
    REQUIRE(data_bytes == one_copy);
    REQUIRE(header.find("\"lm_head.weight\":{") == std::string::npos);
    REQUIRE(header.find("tandem.aliases") != std::string::npos);
  }
  nn::Metadata meta;
  auto file = nn::load_safetensors(path, &meta);
  REQUIRE(file.size() == 4);
  REQUIRE(file.at("lm_head.weight").is_same(file.at("wte.weight")));
  REQUIRE(meta.count("tandem.aliases") == 0);  // the loader's own entry, not the caller's metadata
  REQUIRE(meta.at("format") == "pt");
  REQUIRE_THROWS_WITH(nn::save_safetensors(path, file, {{"tandem.aliases", "{}"}}),
                      Catch::Contains("[safetensors] metadata key 'tandem.aliases' is reserved"));
  // A name that would only be an alias is checked as any other (else the file could not be read).
  nn::TensorDict with_empty{{"a", src->wte->weight}, {"", src->wte->weight}};
  REQUIRE_THROWS_WITH(nn::save_safetensors(path, with_empty), "[safetensors] tensor names must not be empty");
  auto back = make_lm(true, 5);
  auto result = nn::load_model(*back, path);
  REQUIRE(result.missing_keys.empty());
  REQUIRE(result.unexpected_keys.empty());
  REQUIRE(back->lm_head->weight.is_same(back->wte->weight));
  REQUIRE(max_abs_diff(back->wte->weight, src->wte->weight) == 0);
  REQUIRE(max_abs_diff(back->mid->weight, src->mid->weight) == 0);
  // An untied model loads the same file into its two weights.
  auto untied = make_lm(false, 5);
  nn::load_model(*untied, path);
  REQUIRE(max_abs_diff(untied->lm_head->weight, src->wte->weight) == 0);
  REQUIRE(max_abs_diff(untied->wte->weight, src->wte->weight) == 0);
  std::remove(path.c_str());

  // A dict with only one of the names fills the tie non-strictly and names the other as missing.
  nn::TensorDict one{{"wte.weight", src->wte->weight.detach()}};
  auto fresh = make_lm(true, 77);
  auto r = fresh->load_state_dict(one, /*strict=*/false);
  REQUIRE(r.missing_keys == std::vector<std::string>{"mid.weight", "mid.bias", "lm_head.weight"});
  REQUIRE(max_abs_diff(fresh->lm_head->weight, src->wte->weight) == 0);

  // The optimizer's state: one entry for the tied weight, and it round-trips through a file.
  optim::AdamW opt(src->parameters(), {.lr = 0.01});
  loss_of(*src, 0).backward();
  opt.step();
  const std::string opath = temp_path("optim");
  nn::save_optimizer(opt, opath);
  auto dst_opt_model = make_lm(true, 5);
  optim::AdamW dst_opt(dst_opt_model->parameters(), {.lr = 0.01});
  nn::load_optimizer(dst_opt, opath);
  REQUIRE(dst_opt.state(dst_opt_model->lm_head->weight) != nullptr);
  REQUIRE(max_abs_diff(dst_opt.state(dst_opt_model->wte->weight)->buffers.at("exp_avg"),
                       opt.state(src->wte->weight)->buffers.at("exp_avg")) == 0);
  std::remove(opath.c_str());
}
