// The models of the tools: the benchmark MLP (in-hidden-hidden-out, ReLU, cross-entropy, SGD with
// momentum 0.9) on a fixed random batch, shared by bench_cpu and train; train's Fashion-MNIST
// models (the CNN of the main job and the 784-256-128-10 MLP), their seeds and default recipes,
// which bench_train repeats; the conv benchmark of bench_cpu and bench_train; and train's small
// character-level GPT (nanoGPT's model), its sampling, its AdamW parameter groups and its recipe.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "nn/nn.h"
#include "tandem.h"

inline std::shared_ptr<tandem::nn::Sequential> make_mlp(int64_t in, int64_t hidden, int64_t out, int hidden_layers = 2) {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  int64_t width = in;
  for (int i = 0; i < hidden_layers; ++i) {
    model->push_back(std::make_shared<Linear>(width, hidden));
    model->push_back(std::make_shared<ReLU>());
    width = hidden;
  }
  model->push_back(std::make_shared<Linear>(width, out));
  return model;
}

// Two conv + pool blocks and two linear layers: [N, 1, 28, 28] -> [N, 10] logits.
inline std::shared_ptr<tandem::nn::Sequential> make_fmnist_cnn(int64_t channels = 32) {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<Conv2d>(1, channels, 3, 1, 1));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<MaxPool2d>(2));  // 14x14
  model->push_back(std::make_shared<Conv2d>(channels, 2 * channels, 3, 1, 1));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<MaxPool2d>(2));  // 7x7
  model->push_back(std::make_shared<Flatten>());
  model->push_back(std::make_shared<Linear>(2 * channels * 7 * 7, 128));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(128, 10));
  return model;
}

// [N, 28, 28] -> flatten -> 256 -> 128 -> 10 logits.
inline std::shared_ptr<tandem::nn::Sequential> make_fmnist_mlp() {
  using namespace tandem::nn;
  auto model = std::make_shared<Sequential>();
  model->push_back(std::make_shared<Flatten>());
  model->push_back(std::make_shared<Linear>(784, 256));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(256, 128));
  model->push_back(std::make_shared<ReLU>());
  model->push_back(std::make_shared<Linear>(128, 10));
  return model;
}

// train's seeds, from its --seed: the initial weights (manual_seed just before the model is
// built) and the loader's shuffle. bench_train builds the same model and order for its peer.
inline uint64_t train_init_seed(uint64_t seed) { return seed + 7; }
inline uint64_t train_loader_seed(uint64_t seed) { return seed + 1000; }
// The GPT's sample (generate's multinomial draws), seeded afresh so that a checkpoint and a seed
// give the same text after training and from --sample-only.
inline uint64_t train_sample_seed(uint64_t seed) { return seed + 2000; }

// What train does when not told otherwise (SGD with momentum 0.9, per-rank batch 64, the schedule
// stepped per step): on Fashion-MNIST the main job's recipe (tools/train.sh) for the CNN, and the
// MLP's; the synthetic set's for tests. bench_train's PyTorch peer repeats the CNN's.
struct TrainRecipe {
  int64_t epochs;
  double lr;
  const char* lr_schedule;  // constant, cosine or step
  int64_t warmup_steps;
};
inline constexpr TrainRecipe kFmnistCnnRecipe{.epochs = 8, .lr = 0.05, .lr_schedule = "cosine", .warmup_steps = 0};
inline constexpr TrainRecipe kFmnistMlpRecipe{.epochs = 8, .lr = 0.05, .lr_schedule = "cosine", .warmup_steps = 0};
inline constexpr TrainRecipe kSyntheticRecipe{.epochs = 3, .lr = 0.05, .lr_schedule = "constant", .warmup_steps = 0};
inline constexpr int64_t kFmnistBatch = 64;
inline constexpr double kSgdMomentum = 0.9;

// One forward and backward of nn::Conv2d(32, 64, 3, padding 1) on a 64x32x28x28 input, gradients
// cleared first (as the PyTorch peer does): bench_cpu's and bench_train's conv2d_fwd_bwd.
struct ConvBench {
  tandem::nn::Conv2d conv{32, 64, 3, 1, 1};
  tandem::Tensor x = tandem::randn({64, 32, 28, 28}).requires_grad_();
  void step() {
    conv.zero_grad(true);
    x.set_grad(tandem::Tensor());
    tandem::sum(conv(x)).backward();
  }
};

// One SGD (momentum 0.9) step of a classifier on a fixed random batch: the CPU benchmarks' unit.
struct ClassifierBench {
  std::shared_ptr<tandem::nn::Sequential> model;
  std::unique_ptr<tandem::optim::SGD> opt;
  tandem::Tensor x, y;

  float step() {
    opt->zero_grad(true);
    tandem::Tensor loss = tandem::nn::cross_entropy((*model)(x), y);
    loss.backward();
    opt->step();
    return loss.item<float>();
  }

 protected:
  // The random draws in this order: the model's (made by the caller), then x, then y.
  void init(std::shared_ptr<tandem::nn::Sequential> m, const tandem::Shape& x_shape, int64_t classes) {
    model = std::move(m);
    opt = std::make_unique<tandem::optim::SGD>(model->parameters(),
                                               tandem::optim::SGDOptions{.lr = 0.01, .momentum = kSgdMomentum});
    x = tandem::randn(x_shape);
    y = tandem::randint(0, classes, {x_shape[0]});
  }
};

// make_mlp(in, hidden, out) on a batch of `batch` random rows.
struct MlpBench : ClassifierBench {
  MlpBench(int64_t batch, int64_t in, int64_t hidden, int64_t out) { init(make_mlp(in, hidden, out), {batch, in}, out); }
};

// make_fmnist_cnn on a batch of 64 random images.
struct CnnBench : ClassifierBench {
  CnnBench() { init(make_fmnist_cnn(), {kFmnistBatch, 1, 28, 28}, 10); }
};

// ---- A small GPT (nanoGPT's model, at the character level) ----
//
// Token and position embeddings, n_layer pre-LayerNorm blocks (causal self-attention, then a 4x
// GELU MLP, each added to the residual stream), a final LayerNorm and a head tied to the token
// embedding: idx i64 [B, T] (T <= block_size) -> logits [B, T, vocab_size]. The parameters are
// named as in nanoGPT without its "transformer." prefix: wte.weight, wpe.weight,
// blocks.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}.{weight, bias},
// ln_f.{weight, bias}; lm_head.weight is wte.weight (named_parameters lists it once, as wte.weight).

struct GptConfig {
  int64_t vocab_size = 0;  // the data's vocabulary (data::CharVocab::size())
  int64_t block_size = 64;  // the longest context
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;  // a multiple of n_head
  double dropout = 0.0;  // embeddings, attention weights, residual branches
  // Biases in the Linear layers (nanoGPT's bias; its LayerNorms then drop theirs too, which
  // nn::LayerNorm cannot, so here the LayerNorms keep a bias either way).
  bool bias = true;
};

// Multi-head causal self-attention: one Linear to q, k and v for every head, the fused attention
// op, the heads merged and projected back.
class GptAttention : public tandem::nn::Module {
 public:
  explicit GptAttention(const GptConfig& c)
      : Module("GptAttention"), n_head(c.n_head), n_embd(c.n_embd), dropout(c.dropout) {
    using namespace tandem::nn;
    c_attn = register_module("c_attn", std::make_shared<Linear>(c.n_embd, 3 * c.n_embd, c.bias));
    c_proj = register_module("c_proj", std::make_shared<Linear>(c.n_embd, c.n_embd, c.bias));
    resid_dropout = register_module("resid_dropout", std::make_shared<Dropout>(c.dropout));
  }

  tandem::Tensor forward(const tandem::Tensor& x) override {  // [B, T, C] -> [B, T, C]
    using namespace tandem;
    const int64_t B = x.size(0), T = x.size(1), D = n_embd / n_head;
    TensorList qkv = (*c_attn)(x).split(n_embd, 2);  // q, k, v: [B, T, C] each
    auto heads = [&](const Tensor& t) { return t.reshape({B, T, n_head, D}).transpose(1, 2); };  // [B, H, T, D]
    Tensor y = scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), Tensor(),
                                            is_training() ? dropout : 0.0, /*is_causal=*/true);
    y = y.transpose(1, 2).reshape({B, T, n_embd});  // the heads side by side again
    return (*resid_dropout)((*c_proj)(y));
  }

  int64_t n_head, n_embd;
  double dropout;
  std::shared_ptr<tandem::nn::Linear> c_attn, c_proj;
  std::shared_ptr<tandem::nn::Dropout> resid_dropout;
};

class GptMlp : public tandem::nn::Module {
 public:
  explicit GptMlp(const GptConfig& c) : Module("GptMlp") {
    using namespace tandem::nn;
    c_fc = register_module("c_fc", std::make_shared<Linear>(c.n_embd, 4 * c.n_embd, c.bias));
    gelu = register_module("gelu", std::make_shared<GELU>());
    c_proj = register_module("c_proj", std::make_shared<Linear>(4 * c.n_embd, c.n_embd, c.bias));
    dropout = register_module("dropout", std::make_shared<Dropout>(c.dropout));
  }
  tandem::Tensor forward(const tandem::Tensor& x) override { return (*dropout)((*c_proj)((*gelu)((*c_fc)(x)))); }

  std::shared_ptr<tandem::nn::Linear> c_fc, c_proj;
  std::shared_ptr<tandem::nn::GELU> gelu;
  std::shared_ptr<tandem::nn::Dropout> dropout;
};

// Pre-LayerNorm: x + attn(ln_1(x)), then + mlp(ln_2(.)).
class GptBlock : public tandem::nn::Module {
 public:
  explicit GptBlock(const GptConfig& c) : Module("GptBlock") {
    using namespace tandem::nn;
    ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(tandem::Shape{c.n_embd}));
    attn = register_module("attn", std::make_shared<GptAttention>(c));
    ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(tandem::Shape{c.n_embd}));
    mlp = register_module("mlp", std::make_shared<GptMlp>(c));
  }
  tandem::Tensor forward(const tandem::Tensor& input) override {
    tandem::Tensor x = input + (*attn)((*ln_1)(input));
    return x + (*mlp)((*ln_2)(x));
  }

  std::shared_ptr<tandem::nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<GptAttention> attn;
  std::shared_ptr<GptMlp> mlp;
};

class Gpt : public tandem::nn::Module {
 public:
  explicit Gpt(const GptConfig& c) : Module("Gpt"), config(c) {
    using namespace tandem::nn;
    TANDEM_CHECK(c.vocab_size > 0 && c.block_size > 0 && c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0,
                 "[Gpt] vocab_size {}, block_size {}, n_layer {}, n_head {} and n_embd {} must be positive",
                 c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd);
    TANDEM_CHECK(c.n_embd % c.n_head == 0, "[Gpt] n_embd {} is not a multiple of n_head {}", c.n_embd, c.n_head);
    TANDEM_CHECK(c.dropout >= 0 && c.dropout < 1, "[Gpt] dropout {} is not in [0, 1)", c.dropout);
    wte = register_module("wte", std::make_shared<Embedding>(c.vocab_size, c.n_embd));
    wpe = register_module("wpe", std::make_shared<Embedding>(c.block_size, c.n_embd));
    drop = register_module("drop", std::make_shared<Dropout>(c.dropout));
    blocks = register_module("blocks", std::make_shared<Sequential>());
    for (int64_t i = 0; i < c.n_layer; ++i) blocks->push_back(std::make_shared<GptBlock>(c));
    ln_f = register_module("ln_f", std::make_shared<LayerNorm>(tandem::Shape{c.n_embd}));
    lm_head = register_module("lm_head", std::make_shared<Linear>(c.n_embd, c.vocab_size, /*bias=*/false));
    set_parameter("lm_head.weight", wte->weight);  // weight tying: one parameter, two uses

    // nanoGPT's initialisation: every matrix and embedding N(0, 0.02), the projections back into
    // the residual stream (c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0; LayerNorms 1 and 0.
    for (const auto& [name, p] : named_parameters()) {
      if (p.dim() >= 2) {
        const bool residual = name.ends_with("c_proj.weight");
        init::normal_(p, 0.0, residual ? 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer)) : 0.02);
      } else if (name.ends_with(".bias")) {
        init::zeros_(p);
      }
    }
  }

  tandem::Tensor forward(const tandem::Tensor& idx) override {  // [B, T] i64 -> [B, T, vocab_size]
    using namespace tandem;
    TANDEM_CHECK(idx.dim() == 2 && idx.size(1) <= config.block_size,
                 "[Gpt] expected token ids [B, T] with T <= block_size {}, got shape {}", config.block_size,
                 idx.shape());
    Tensor pos = arange(0, idx.size(1), TensorOptions(i64, idx.device()));
    Tensor x = (*drop)((*wte)(idx) + (*wpe)(pos));
    x = (*blocks)(x);
    return (*lm_head)((*ln_f)(x));
  }

  GptConfig config;
  std::shared_ptr<tandem::nn::Embedding> wte, wpe;
  std::shared_ptr<tandem::nn::Dropout> drop;
  std::shared_ptr<tandem::nn::Sequential> blocks;
  std::shared_ptr<tandem::nn::LayerNorm> ln_f;
  std::shared_ptr<tandem::nn::Linear> lm_head;
};

inline std::shared_ptr<Gpt> make_gpt(const GptConfig& config) { return std::make_shared<Gpt>(config); }

// The mean (or summed) cross-entropy of next-character logits [B, T, V] against targets [B, T]:
// nats per character. Low-precision logits (DDP's mixed precision) are taken to f32 first.
inline tandem::Tensor gpt_loss(const tandem::Tensor& logits, const tandem::Tensor& targets,
                               tandem::nn::Reduction reduction = tandem::nn::Reduction::mean) {
  using namespace tandem;
  const Tensor l = logits.dtype() == bf16 || logits.dtype() == f16 ? logits.to(f32) : logits;
  return nn::cross_entropy(l.reshape({-1, l.size(-1)}), targets.reshape({-1}), reduction);
}

// nanoGPT's AdamW groups: weight decay on every parameter of two or more dims (the Linear
// matrices and the embeddings, the tied one once), none on the biases and LayerNorms.
struct GptParamGroups {
  tandem::TensorList decay, no_decay;
  std::vector<std::string> decay_names, no_decay_names;
};
inline GptParamGroups gpt_param_groups(const tandem::nn::Module& model) {
  GptParamGroups g;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? g.decay : g.no_decay).push_back(p);
    (p.dim() >= 2 ? g.decay_names : g.no_decay_names).push_back(name);
  }
  return g;
}

// Appends `n` sampled ids to `prompt_ids` (i64 [T0] or [B, T0], T0 >= 1, on the model's device)
// and returns the whole sequence, of the prompt's shape: each step feeds the last block_size ids,
// divides the last position's logits by `temperature`, keeps only the top_k largest when top_k > 0,
// and draws the next id from their softmax with multinomial (the global generator: seed it for a
// repeatable sample). Runs without recording a graph and in eval mode (no dropout); the model's
// mode is restored afterwards.
inline tandem::Tensor generate(Gpt& model, const tandem::Tensor& prompt_ids, int64_t n, double temperature = 1.0,
                               int64_t top_k = 0) {
  using namespace tandem;
  TANDEM_CHECK((prompt_ids.dim() == 1 || prompt_ids.dim() == 2) && prompt_ids.size(-1) > 0,
               "[generate] expected prompt ids [T] or [B, T] with T >= 1, got shape {}", prompt_ids.shape());
  TANDEM_CHECK(temperature > 0, "[generate] temperature must be positive, got {}", temperature);
  TANDEM_CHECK(n >= 0 && top_k >= 0, "[generate] n {} and top_k {} must be >= 0", n, top_k);
  NoGradGuard no_grad;
  struct ModeRestore {
    Gpt& m;
    bool was_training;
    ~ModeRestore() { m.train(was_training); }
  } restore{model, model.is_training()};
  model.eval();
  Tensor idx = prompt_ids.dim() == 1 ? prompt_ids.unsqueeze(0) : prompt_ids;
  const int64_t block = model.config.block_size;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t T = idx.size(1);
    const Tensor context = T <= block ? idx : idx.narrow(1, T - block, block);
    const Tensor all = model(context);                                 // [B, T', V]
    Tensor logits = all.select(1, context.size(1) - 1) / temperature;  // [B, V]
    if (top_k > 0 && top_k < logits.size(-1)) {
      const Tensor kth = logits.topk(top_k, -1).first.narrow(1, top_k - 1, 1);  // [B, 1]: the k-th largest
      logits = logits.masked_fill(logits.lt(kth), -std::numeric_limits<double>::infinity());
    }
    const Tensor next = multinomial(softmax(logits, -1), 1);  // [B, 1]
    idx = cat({idx, next}, 1);
  }
  return prompt_ids.dim() == 1 ? idx.squeeze(0) : idx;
}

// What train --model gpt does when not told otherwise: the model above at this size, AdamW with
// nanoGPT's betas (0.9, 0.95) and weight decay on the decay group, lr warmed up linearly from
// lr/10, then a cosine to 0, gradients clipped to norm 1, on Debian's fortunes with a 64-character
// context, batch 32 per rank. Sized for tools/train.sh --model gpt (2 ranks on 2 cores): about
// 6 * 0.8 M parameters * 2048 characters = 10 GFLOP per rank and step.
struct GptRecipe {
  GptConfig model;  // vocab_size: the data's
  int64_t steps;
  int64_t batch;
  double lr;
  const char* lr_schedule;
  int64_t warmup_steps;
  double weight_decay;
  double beta1, beta2;
  double clip_grad;      // max gradient norm, 0: off
  int64_t eval_windows;  // validation windows per evaluation (about 10 in a run), split across the ranks
  int64_t sample_chars;  // generated after training
};
inline constexpr GptRecipe kGptRecipe{
    .model = {.vocab_size = 0, .block_size = 64, .n_layer = 4, .n_head = 4, .n_embd = 128, .dropout = 0.0,
              .bias = true},
    .steps = 1200,
    .batch = 32,
    .lr = 1e-3,
    .lr_schedule = "cosine",
    .warmup_steps = 100,
    .weight_decay = 0.1,
    .beta1 = 0.9,
    .beta2 = 0.95,
    .clip_grad = 1.0,
    .eval_windows = 512,
    .sample_chars = 500};
