// The examples of README.md and docs/*.md, compiled and run, so the documentation cannot drift from
// the code. Each ```cpp block of those pages is copied here as written, inside a TEST_CASE that may
// add setup before it and checks between and after its lines; tests/check_doc_snippets.py (CTest
// docs:snippets) checks that every block's lines are here, in order. The cases follow the pages:
// README.md, docs/api.md, docs/ddp.md, docs/join-zero.md, docs/mpirun.md. The GPU notes' example
// (docs/gpu.md) needs the CUDA backend: it is in tests/cuda/test_cuda_readme.cpp.
#include <catch2/catch.hpp>

#include <atomic>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "tandem.h"

using namespace tandem;

// ---------------------------------------------------------------------------------------------
// README.md
// ---------------------------------------------------------------------------------------------

// README.md, "Quick start": the program's body.
TEST_CASE("README quick start trains and saves", "[readme]") {
  manual_seed(0);
  nn::Sequential model(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10));
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  Tensor x = randn({128, 32});
  Tensor y = randint(0, 10, {128});
  double first = 0, last = 0;
  for (int step = 0; step < 100; ++step) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(model(x), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  REQUIRE(last < first * 0.2);  // memorises the batch
  std::string path = "readme_model.safetensors";
  nn::save_model(model, path);
  REQUIRE(nn::load_safetensors(path).size() == 4);
  std::remove(path.c_str());
}

// ---------------------------------------------------------------------------------------------
// docs/api.md: the API by example
// ---------------------------------------------------------------------------------------------

// docs/api.md, "From PyTorch": every Tandem cell of the table, in order, with its values checked.
TEST_CASE("README from PyTorch table", "[readme]") {
  using V = std::vector<double>;
  auto v = [](const Tensor& t) { return t.to_vector<double>(); };
  // create, random, ranges, from data
  REQUIRE(v(zeros({2, 3})) == V(6, 0.0));
  Tensor a = from_vector<double>({-1.5, 0.25, 0.75, 2.0});
  REQUIRE(v(ones_like(a)) == V(4, 1.0));
  manual_seed(0);
  Tensor r = randn({2, 3}, f64);
  manual_seed(0);
  REQUIRE(r.dtype() == f64);
  REQUIRE(randn({2, 3}, f64).equal(r));
  REQUIRE(arange(6).to_vector<int64_t>() == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  REQUIRE(v(full({2}, 7.0)) == V{7, 7});
  REQUIRE(v(from_vector<double>({1.0, 2.0})) == V{1, 2});
  // arithmetic, in place, compare
  Tensor b = from_vector<double>({1, 2, 3, 4});
  REQUIRE(v(a + b) == V{-0.5, 2.25, 3.75, 6});
  REQUIRE(v(2 * a) == V{-3, 0.5, 1.5, 4});
  REQUIRE(v(1 - a) == V{2.5, 0.75, 0.25, -1});
  REQUIRE(v(a / 4) == V{-0.375, 0.0625, 0.1875, 0.5});
  {
    Tensor c = a.clone();
    c += 1;
    c -= 1;
    c *= 2;
    c.add_(b, 0.5);
    REQUIRE(v(c) == V{-2.5, 1.5, 3, 6});
  }
  REQUIRE((a <= 0.5).to_vector<bool>() == std::vector<bool>{true, true, false, false});
  REQUIRE((0.5 < a).to_vector<bool>() == std::vector<bool>{false, false, true, true});
  REQUIRE(((a > 0) & (a < 1)).to_vector<bool>() == std::vector<bool>{false, true, true, false});
  // math, select, clamp
  REQUIRE(v(a.pow(2)) == V{2.25, 0.0625, 0.5625, 4});
  REQUIRE(v(b.pow(b)) == V{1, 4, 27, 256});
  REQUIRE(a.exp().allclose(exp(a)));
  REQUIRE(gelu(a).to_vector<double>()[3] == Approx(1.9544997361036416));  // 2 Phi(2)
  REQUIRE(v(where(a > 0, a, 0.0)) == V{0, 0.25, 0.75, 2});
  REQUIRE(v(a.clamp(-1, 1)) == V{-1, 0.25, 0.75, 1});
  Tensor lo = full({4}, 0.5, f64), hi = full({4}, 1.0, f64);
  REQUIRE(v(clamp(a, lo, hi)) == V{0.5, 0.5, 0.75, 1});
  // products, sums, extremes, statistics
  Tensor m = from_vector<double>({1, 5, 3, 4, 2, 6}, {2, 3});
  REQUIRE(v(matmul(m, m.t())) == V{35, 32, 32, 56});
  REQUIRE(v(m.mm(m.t())) == V{35, 32, 32, 56});
  REQUIRE(m.sum().item<double>() == 21);
  REQUIRE(m.sum({1}, true).shape() == Shape{2, 1});
  REQUIRE(m.mean().item<double>() == 3.5);
  auto [vals, idx] = m.max(1);
  REQUIRE(v(vals) == V{5, 6});
  REQUIRE(idx.to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  REQUIRE(m.argmax(1).to_vector<int64_t>() == std::vector<int64_t>{1, 2});
  REQUIRE(v(m.amax({1})) == V{5, 6});
  REQUIRE(m.std().item<double>() == Approx(std::sqrt(3.5)));  // Bessel: 17.5 / 5
  REQUIRE(m.logsumexp({1}).allclose(log(exp(m).sum({1}))));
  REQUIRE(m.norm().item<double>() == Approx(std::sqrt(91.0)));
  // top-k, sampling (m is [[1, 5, 3], [4, 2, 6]])
  auto [top, top_idx] = m.topk(2);
  REQUIRE(v(top) == V{5, 3, 6, 4});
  REQUIRE(top_idx.to_vector<int64_t>() == std::vector<int64_t>{1, 2, 2, 0});
  Tensor p = softmax(m, 1);
  Tensor draws = multinomial(p, 1);
  REQUIRE(draws.shape() == Shape{2, 1});
  REQUIRE(draws.dtype() == i64);
  // indexing, masks, views, shape, join and split
  Tensor ix = from_vector<int64_t>({1, 0});
  REQUIRE(v(m[0]) == V{1, 5, 3});
  REQUIRE(v(m.select(1, 0)) == V{1, 4});
  REQUIRE(v(m.index_select(0, ix)) == V{4, 2, 6, 1, 5, 3});
  REQUIRE(v(m.gather(1, from_vector<int64_t>({2, 0}, {2, 1}))) == V{3, 4});
  REQUIRE(v(a.masked_fill(a < 0, 0)) == V{0, 0.25, 0.75, 2});
  // triangles (m is [[1, 5, 3], [4, 2, 6]])
  REQUIRE(v(tril(m)) == V{1, 0, 0, 4, 2, 0});
  REQUIRE(v(m.triu(1)) == V{0, 5, 3, 0, 0, 6});
  REQUIRE(m.view({-1, 2}).shape() == Shape{3, 2});
  REQUIRE(m.reshape({3, 2}).shape() == Shape{3, 2});
  REQUIRE(m.permute({1, 0}).equal(m.transpose(0, 1)));
  REQUIRE(m.unsqueeze(0).shape() == Shape{1, 2, 3});
  REQUIRE(m.unsqueeze(0).squeeze().shape() == Shape{2, 3});
  REQUIRE(m.flatten().shape() == Shape{6});
  REQUIRE(v(m.narrow(0, 0, 1)) == V{1, 5, 3});
  REQUIRE(cat({a, b}, 0).shape() == Shape{8});
  REQUIRE(stack({a, b}).shape() == Shape{2, 4});
  REQUIRE(m.chunk(2, 1).size() == 2);
  // dtypes, softmax
  REQUIRE(a.to(bf16).dtype() == bf16);
  REQUIRE(m[0][1].to(f32).item<float>() == 5.0f);
  REQUIRE(softmax(m, 1).sum({1}).allclose(ones({2}, f64)));
  REQUIRE(log_softmax(m, 1).exp().allclose(softmax(m, 1)));
  // a layer, Sequential, grow and call, submodules
  nn::Linear fc(3, 4);
  REQUIRE(fc.weight.shape() == Shape{4, 3});
  nn::Sequential seq(nn::Linear(3, 4), nn::ReLU());
  seq.push_back(nn::Linear(4, 2));
  Tensor x = randn({5, 3});
  Tensor logits = seq(x);
  REQUIRE(logits.shape() == Shape{5, 2});
  struct Holder : nn::Module {
    std::shared_ptr<nn::Linear> fc;
    Holder() : Module("Holder") { fc = register_module("fc", std::make_shared<nn::Linear>(4, 8)); }
  } holder;
  REQUIRE(holder.named_parameters().keys() == std::vector<std::string>{"fc.weight", "fc.bias"});
  // losses, SGD, AdamW, a step
  Tensor y = from_vector<int64_t>({0, 1, 1, 0, 1});
  REQUIRE(nn::mse_loss(a, b).item<double>() == Approx((6.25 + 3.0625 + 5.0625 + 4) / 4));
  optim::SGD opt(seq.parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::AdamW adamw(seq.parameters(), {.lr = 1e-3});
  Tensor first_loss = nn::cross_entropy(seq(x), y);
  for (int step = 0; step < 20; ++step) {
    Tensor loss = nn::cross_entropy(seq(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  REQUIRE(nn::cross_entropy(seq(x), y).item<float>() < first_loss.item<float>());
  // clip: the total norm before clipping comes back; after it, the gradients' norm is at most 1
  const double grad_norm = nn::utils::clip_grad_norm_(seq.parameters(), 1.0);
  REQUIRE(grad_norm > 0);
  REQUIRE(nn::utils::clip_grad_norm_(seq.parameters(), 1.0) <= std::min(grad_norm, 1.0));
  // attention layer, transformer, several inputs
  {
    nn::MultiheadAttention mha(8, 2);
    Tensor q = randn({5, 3, 8}), k = randn({5, 3, 8}), val = randn({5, 3, 8});
    Tensor padding = arange(5).unsqueeze(0).expand({3, 5}) >= 4;  // the last key of each sequence
    Tensor out = mha(q, k, val, padding);
    REQUIRE(out.shape() == Shape{5, 3, 8});
    nn::TransformerEncoderLayer enc(8, 2, {.dim_feedforward = 32});
    Tensor src = randn({5, 3, 8});
    Tensor causal = ones({5, 5}).triu(1).to(boolean);  // true: not allowed
    REQUIRE(enc(src, causal).shape() == src.shape());
  }
  // autograd
  Tensor w = from_vector<double>({1, 2});
  w.requires_grad_();
  (w * w).sum().backward();
  REQUIRE(v(w.grad()) == V{2, 4});
  REQUIRE_FALSE(w.detach().requires_grad());
  {
    NoGradGuard no_grad;
    REQUIRE_FALSE((w * 2).requires_grad());
  }
  // save, load
  nn::save_model(seq, "readme_table.safetensors");
  nn::Sequential other(nn::Linear(3, 4), nn::ReLU(), nn::Linear(4, 2));
  nn::load_model(other, "readme_table.safetensors");
  REQUIRE(other(x).equal(seq(x)));
  std::remove("readme_table.safetensors");
  // checkpoint (a world of one: no launcher)
  dist::save_checkpoint("readme_table_ckpt.safetensors", {.model = &seq, .optimizer = &opt, .step = 20});
  dist::TrainingState state{.model = &other, .optimizer = &opt};
  REQUIRE(dist::load_checkpoint("readme_table_ckpt.safetensors", state).step == 20);
  REQUIRE(other(x).equal(seq(x)));
  std::remove("readme_table_ckpt.safetensors");
  // collectives and DDP (a world of one without a launcher)
  auto pg = dist::init();
  Tensor t = full({2}, 3.0);
  pg->allreduce(t)->wait();
  REQUIRE(v(t) == V{3, 3});
  auto model = std::make_shared<nn::Sequential>(nn::Linear(3, 2));
  dist::DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 4});
  {
    auto no_sync = ddp.no_sync();
    ddp(x).sum().backward();
  }
  REQUIRE(model->at<nn::Linear>(0)->weight.grad().defined());
}

// docs/api.md, "Tensors".
TEST_CASE("README tensors", "[readme]") {
  Tensor a = arange(6).to(f32).view({2, 3});
  Tensor b = a.t();
  REQUIRE(b.shape() == Shape{3, 2});
  REQUIRE(b.strides() == Strides{1, 3});
  Tensor c = a + from_vector<float>({10, 20, 30});
  REQUIRE(c.to_vector<float>() == std::vector<float>{10, 21, 32, 13, 24, 35});
  Tensor d = matmul(a, b);
  REQUIRE(d.to_vector<float>() == std::vector<float>{5, 14, 14, 50});
  Tensor m = a.sum({1}, true);
  REQUIRE(m.shape() == Shape{2, 1});
  Tensor s = softmax(a, -1), l = log_softmax(a, 1);
  REQUIRE(allclose(s.log(), l, 1e-5, 1e-6));
  Tensor h = a.to(bf16);
  REQUIRE(h.element_size() == 2);
  std::ostringstream os;
  os << d;
  REQUIRE(os.str().rfind("tensor(", 0) == 0);
  REQUIRE_THROWS_WITH(matmul(zeros({4, 3}), zeros({5, 2})),
                      "[matmul] inner dimensions differ: a is [4, 3], b is [5, 2]");
}

// docs/api.md: Cube is the custom Function of "Autograd", Net the module of "nn and optim".
namespace {
struct Cube : autograd::Function<Cube> {
  static Tensor forward(autograd::AutogradContext& ctx, const Tensor& x) {
    ctx.save_for_backward({x});
    return x * x * x;
  }
  static TensorList backward(autograd::AutogradContext& ctx, const TensorList& grads) {
    Tensor x = ctx.saved()[0];
    return {grads[0] * x * x * 3};
  }
};

struct Net : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Net() : Module("Net") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(4, 8));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(8, 2));
  }
  Tensor forward(const Tensor& x) override { return fc2->forward(relu((*fc1)(x))); }
};
}  // namespace

// docs/api.md, "Autograd".
TEST_CASE("README autograd", "[readme]") {
  Tensor w = randn({3, 3}, f64).requires_grad_();
  Tensor loss = (matmul(w, w) * 2).sum();
  loss.backward();
  REQUIRE(w.grad().defined());
  {
    NoGradGuard no_grad;
    w.sub_(w.grad() * 0.1);
  }
  int fired = 0, callbacks = 0;
  HookHandle h1 = register_hook(w, [](const Tensor& g) { return g * 0.5; });
  HookHandle h2 = register_post_accumulate_grad_hook(w, [&](const Tensor& p) {
    ++fired;
    autograd::queue_callback([&] { ++callbacks; });
  });
  w.set_grad(Tensor());
  (w * 4).sum().backward();
  REQUIRE(fired == 1);
  REQUIRE(callbacks == 1);
  REQUIRE(w.grad().to_vector<double>() == std::vector<double>(9, 2.0));  // halved by h1

  Tensor x = randn({5}, f64).requires_grad_();
  Tensor y = Cube::apply(x);
  REQUIRE(y.grad_fn() != nullptr);
  GradcheckResult r = gradcheck([](const TensorList& in) { return Cube::apply(in[0]); }, {x});
  INFO(r.report);
  REQUIRE(r.ok);
}

// docs/api.md, "nn and optim".
TEST_CASE("README nn and optim", "[readme]") {
  Net net;
  std::vector<std::string> names;
  for (const auto& [name, p] : net.named_parameters()) names.push_back(name);
  REQUIRE(names == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  optim::AdamW adamw(net.parameters(), {.lr = 1e-3});
  (net(randn({3, 4}))).sum().backward();
  adamw.step();
  nn::save_model(net, "readme_net.safetensors");
  nn::save_optimizer(adamw, "readme_opt.safetensors");
  Net other;
  nn::load_model(other, "readme_net.safetensors");
  REQUIRE(equal(other.fc1->named_parameters()["weight"], net.fc1->named_parameters()["weight"]));
  auto warm_up = std::make_shared<optim::LinearLR>(adamw, 0.1, 1.0, /*total_iters=*/5);
  auto cosine = std::make_shared<optim::CosineAnnealingLR>(adamw, /*t_max=*/95);
  optim::SequentialLR schedule(adamw, {warm_up, cosine}, {5});  // 5 epochs of warm-up, then cosine
  REQUIRE(adamw.lr() == Approx(1e-4));
  schedule.step();                            // once per epoch, after adamw.step()
  REQUIRE(adamw.lr() == Approx(1e-3 * (0.1 + 0.9 / 5)));
  std::remove("readme_net.safetensors");
  std::remove("readme_opt.safetensors");
}

// docs/api.md, "Weight tying" (under "nn and optim").
namespace {
struct TinyLM : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::Linear> lm_head;
  TinyLM() : Module("TinyLM") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(100, 16));                     // [vocab, dim]
    lm_head = register_module("lm_head", std::make_shared<nn::Linear>(16, 100, /*bias=*/false));  // [vocab, dim]
    set_parameter("lm_head.weight", wte->weight);  // lm_head->weight is wte->weight now
  }
  Tensor forward(const Tensor& idx) override { return (*lm_head)(wte->forward(idx)); }
};
}  // namespace

TEST_CASE("README weight tying", "[readme]") {
  TinyLM lm;  // named_parameters: wte.weight; state_dict: wte.weight, lm_head.weight
  REQUIRE(lm.lm_head->weight.is_same(lm.wte->weight));
  REQUIRE(lm.named_parameters().keys() == std::vector<std::string>{"wte.weight"});
  REQUIRE(lm.state_dict().keys() == std::vector<std::string>{"wte.weight", "lm_head.weight"});
  REQUIRE(lm(from_vector<int64_t>({1, 2, 3}, {3})).shape() == Shape{3, 100});
}

// docs/api.md, "Several inputs, and the transformer layers".
namespace {
// A text classifier over padded batches: tokens [N, L] and a padding mask [N, L] (true: padding).
struct Classifier : nn::Module {
  std::shared_ptr<nn::Embedding> emb;
  std::shared_ptr<nn::Sequential> encoder;
  std::shared_ptr<nn::Linear> head;
  Classifier() : Module("Classifier") {
    const nn::TransformerLayerOptions layer{.dim_feedforward = 64, .dropout = 0.1, .batch_first = true,
                                            .norm_first = true};
    emb = register_module("emb", std::make_shared<nn::Embedding>(100, 32));
    encoder = register_module("encoder", std::make_shared<nn::Sequential>(nn::TransformerEncoderLayer(32, 4, layer),
                                                                          nn::TransformerEncoderLayer(32, 4, layer)));
    head = register_module("head", std::make_shared<nn::Linear>(32, 2));
  }
  size_t max_inputs() const override { return 2; }
  Tensor forward_inputs(const TensorList& in) override {
    Tensor h = encoder->call({(*emb)(in[0]), Tensor(), in[1]});  // src, no attn_mask, src_key_padding_mask
    return (*head)(h.mean({1}));
  }
};
}  // namespace

TEST_CASE("README several inputs, and the transformer layers", "[readme]") {
  manual_seed(0);
  Tensor tokens = randint(0, 100, {4, 6});
  Tensor padding = arange(6).unsqueeze(0).expand({4, 6}) >= 5;
  Classifier net;
  Tensor logits = net(tokens, padding);  // under DDP: ddp(tokens, padding)
  REQUIRE(logits.shape() == Shape{4, 2});
  std::vector<Tensor> grads(2);
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(0);
    auto model = std::make_shared<Classifier>();
    model->eval();  // no dropout: both ranks compute the same
    dist::DistributedDataParallel ddp(model, pg);
    nn::cross_entropy(ddp(tokens, padding), from_vector<int64_t>({0, 1, 1, 0})).backward();
    grads[group.rank()] = model->head->weight.grad().clone();
  });
  REQUIRE(grads[0].equal(grads[1]));
}

// docs/api.md, "Data": its snippet as written, then its outcome.
TEST_CASE("README data", "[readme]") {
  manual_seed(0);
  Tensor x = randn({100, 8}), y = randint(0, 2, {100});
  data::DataLoader mine(data::TensorDataset({x, y}), {.batch_size = 32, .drop_last = true});  // row i of each
  REQUIRE(mine.num_batches() == 3);
  if (!data::FashionMNIST::available(data::Split::train) || !data::FashionMNIST::available(data::Split::test)) {
    WARN("SKIP: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)");
    return;
  }
  auto pg = dist::init();  // no launcher here: a world of one

  data::FashionMNIST train(data::Split::train);  // images [60000, 28, 28] f32, normalised; labels [60000] i64
  data::DataLoader loader(train, {.batch_size = 64, .seed = 0, .num_replicas = pg->size(), .rank = pg->rank()});
  nn::Sequential model(nn::Linear(784, 256), nn::ReLU(), nn::Linear(256, 10));
  optim::SGD opt(model.parameters(), {.lr = 0.05, .momentum = 0.9});
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    loader.set_epoch(epoch);                  // a new shuffle, the same on every rank
    for (const TensorList& batch : loader) {  // made ahead on a background thread
      opt.zero_grad();
      nn::cross_entropy(model(batch[0].flatten(1)), batch[1]).backward();
      opt.step();
    }
  }
  Tensor labels = data::read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz", i64);

  REQUIRE(labels.shape() == Shape{10000});
  data::FashionMNIST test(data::Split::test);
  NoGradGuard no_grad;
  const double accuracy = model(test.images().flatten(1)).argmax(1).eq(test.labels()).to(f64).mean().item<double>();
  INFO("test accuracy " << accuracy);
  REQUIRE(accuracy > 0.82);  // an MLP's usual ~0.85-0.87 after two epochs
}

// docs/api.md, "Text data": its snippet as written (on fortunes, skipped without it), then its outcome.
TEST_CASE("README text data", "[readme]") {
  if (!data::TextDataset::available()) {
    WARN("SKIP: the fortunes corpus is not installed in " << data::default_text_corpus_path()
                                                           << " (apt-get install fortunes)");
    return;
  }
  auto pg = dist::init();  // no launcher here: a world of one

  data::TextDataset train(data::default_text_corpus_path(), {.block_size = 128});  // or any text file
  data::TextDataset val(data::default_text_corpus_path(),  // stride = block_size: windows share no target
                        {.block_size = 128, .split = data::TextSplit::validation, .stride = 128,
                         .vocab = train.vocab()});
  data::DataLoader windows(train, {.batch_size = 64, .seed = 0, .num_replicas = pg->size(), .rank = pg->rank()});
  TensorList batch = *windows.begin();            // x, y: i64 [64, 128]; y is x one character on
  Tensor saved = train.vocab().to_tensor();       // for the checkpoint; data::CharVocab::from_tensor(saved) reads it
  std::string text = train.vocab().decode(batch[0][0]);  // 128 characters of fortunes

  REQUIRE(batch[0].shape() == Shape{64, 128});
  REQUIRE(batch[1].shape() == Shape{64, 128});
  REQUIRE(batch[1][0].narrow(0, 0, 127).equal(batch[0][0].narrow(0, 1, 127)));
  REQUIRE(data::CharVocab::from_tensor(saved) == train.vocab());
  REQUIRE(text.size() == 128);  // the training split has no unknown bytes
  REQUIRE(val.vocab() == train.vocab());
  REQUIRE(val.size() == (val.split_bytes() - 129) / 128 + 1);
}

// ---------------------------------------------------------------------------------------------
// docs/ddp.md: process groups and DistributedDataParallel
// ---------------------------------------------------------------------------------------------

// docs/ddp.md, "Process groups and collectives", "Who advances a collective: TANDEM_DIST_PROGRESS"
// and "Blocking collectives: BlockingIssueGuard".
TEST_CASE("README dist", "[readme]") {
  auto pg = dist::init();  // no launcher here: a world of one
  REQUIRE(pg->size() == 1);
  Tensor t = ones({4});
  dist::WorkPtr work = pg->allreduce(t, dist::ReduceOp::avg);
  work->wait();
  REQUIRE(t.to_vector<float>() == std::vector<float>(4, 1.0f));
  std::vector<std::vector<float>> reduced(4);  // Catch2 v2 asserts are not thread-safe: checked below
  dist::run_threads(4, [&](dist::ProcessGroup& g) {
    Tensor x = full({2}, g.rank());
    g.allreduce(x)->wait();
    reduced[g.rank()] = x.to_vector<float>();
  });
  for (const auto& r : reduced) REQUIRE(r == std::vector<float>{6, 6});
  Tensor small = ones({8});
  {
    dist::AsyncIssueGuard async;
    auto w = pg->allreduce(small);
    Tensor other = ones({3}) * 2;  // compute_something_else()
    w->wait();
  }
  REQUIRE(small.to_vector<float>() == std::vector<float>(8, 1.0f));
  Tensor loss_sum = full({1}, 3.0), params = ones({5});
  {
    dist::BlockingIssueGuard blocking;
    pg->allreduce(loss_sum)->wait();
    REQUIRE(pg->broadcast(params, 0)->is_completed());
  }
  REQUIRE(loss_sum.to_vector<float>() == std::vector<float>{3.0f});
  {
    // Who advances a collective: this world of one runs "thread" mode, where poll() has nothing
    // to do (the mpi suites run the example's pattern in caller mode, dist_cases.h).
    REQUIRE((pg->progress_mode() == "thread" || pg->progress_mode() == "caller"));
    Tensor grads = ones({64});
    auto w = pg->allreduce(grads);
    double acc = 0;
    for (int chunk = 0; chunk < 4; ++chunk) {
      acc += chunk;  // process(chunk)
      pg->poll();
    }
    w->wait();
    REQUIRE(grads.to_vector<float>() == std::vector<float>(64, 1.0f));
    REQUIRE(acc == 6);
  }
}

// docs/ddp.md, "DistributedDataParallel".
TEST_CASE("README DistributedDataParallel", "[readme]") {
  dist::run_threads(2, [](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);  // run_threads lends the group
    manual_seed(0);
    Tensor x = randn({64, 32}), y = randint(0, 10, {64});
    auto model = std::make_shared<nn::Sequential>();
    model->push_back(std::make_shared<nn::Linear>(32, 64));
    model->push_back(std::make_shared<nn::ReLU>());
    model->push_back(std::make_shared<nn::Linear>(64, 10));
    dist::DistributedDataParallel ddp(model, pg, {.bucket_cap_mb = 4});  // pg: dist::init() under mpirun
    ddp.register_comm_hook(dist::hooks::bf16_compress);  // optional, before the first backward
    optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
    data::DistributedSampler sampler(x.size(0), pg->size(), pg->rank(), {.seed = 0});
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      sampler.set_epoch(epoch);  // a new shuffle, the same on every rank
      Tensor idx = from_vector(sampler.indices());
      for (int64_t at = 0; at + 16 <= idx.size(0); at += 16) {
        Tensor b = idx.narrow(0, at, 16);
        opt.zero_grad();
        nn::cross_entropy(ddp(index_select(x, 0, b)), index_select(y, 0, b)).backward();  // averaged here
        opt.step();
      }
    }
    {
      auto no_sync = ddp.no_sync();  // gradient accumulation: no communication in here
      nn::cross_entropy(ddp(x), y).backward();
    }
  });
}

// docs/ddp.md, "Static graph" and "Delayed-allreduce parameters" (the latter has no snippet on
// the page: the options as it names them).
TEST_CASE("README DDP modes: static graph, delayed-allreduce parameters", "[readme]") {
  std::vector<std::vector<bool>> checks(2);  // per rank, asserted on this thread (Catch2 v2 is not thread-safe)
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    std::vector<bool>& ok = checks[group.rank()];
    manual_seed(0);
    Tensor x1 = randn({8, 32}), x2 = randn({8, 32}), y1 = randn({8, 10}), y2 = randn({8, 10});
    {
      auto model = std::make_shared<nn::Sequential>();
      model->push_back(std::make_shared<nn::Linear>(32, 10));
      dist::DistributedDataParallel ddp(model, pg, {.static_graph = true});
      Tensor a = ddp(x1), b = ddp(x2);                         // two forwards...
      (nn::mse_loss(a, y1) + nn::mse_loss(b, y2)).backward();  // ...one backward, reduced once
      ddp.check_reducer_finalized();
      ok.push_back(ddp.stats().str().find("static_graph") != std::string::npos);
    }
    {
      struct Net : nn::Module {
        std::shared_ptr<nn::Embedding> emb = register_module("emb", std::make_shared<nn::Embedding>(100, 32));
        std::shared_ptr<nn::Linear> fc1 = register_module("fc1", std::make_shared<nn::Linear>(32, 10));
        Net() : Module("Net") {}
        Tensor forward(const Tensor& tokens) override { return (*fc1)((*emb)(tokens)); }
      };
      auto model = std::make_shared<Net>();
      dist::DdpOptions o;
      o.delay_all_reduce_named_params = {"emb.weight"};
      o.param_to_hook_all_reduce = "fc1.weight";
      dist::DistributedDataParallel ddp(model, pg, o);
      nn::mse_loss(ddp(randint(0, 100, {8})), y1).backward();
      ok.push_back(ddp.stats().delayed_allreduces == 1);
      ok.push_back(model->emb->weight.grad().defined());
    }
  });
  for (const auto& ok : checks) REQUIRE(ok == std::vector<bool>{true, true, true});
}

// docs/ddp.md, "Mixed precision" and "Optimizer in backward with DDP" (the latter has no snippet on
// the page: the order it prescribes, applied before DDP wraps the model).
TEST_CASE("README DDP modes: mixed precision, optimizer in backward", "[readme]") {
  std::atomic<int> failed{0};  // Catch2 assertions are for the main thread: workers count
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(0);
    Tensor x = randn({8, 32}), y = randn({8, 10});
    {
      auto model = std::make_shared<nn::Sequential>(nn::Linear(32, 10));
      dist::DdpOptions o;
      o.mixed_precision = dist::MixedPrecision{.param_dtype = bf16};
      dist::DistributedDataParallel ddp(model, pg, o);
      nn::mse_loss(ddp(x).to(f32), y).backward();  // bf16 forward/backward, bf16 buckets, f32 .grad
      failed += (model->at<nn::Linear>(0)->weight.grad().dtype() == f32) ? 0 : 1;
    }
    {
      auto model = std::make_shared<nn::Sequential>(nn::Linear(32, 10));
      auto in_backward = optim::apply_optimizer_in_backward(optim::SGDOptions{.lr = 0.1, .momentum = 0.9},
                                                            model->parameters());
      dist::DistributedDataParallel ddp(model, pg, {});
      Tensor before = model->at<nn::Linear>(0)->weight.detach().clone();
      nn::mse_loss(ddp(x), y).backward();  // each parameter stepped once its bucket is reduced
      failed += (model->at<nn::Linear>(0)->weight.equal(before)) ? 1 : 0;
      failed += (model->at<nn::Linear>(0)->weight.grad().defined()) ? 1 : 0;
    }
  });
  REQUIRE(failed == 0);
}

// docs/ddp.md, "Optimizer in backward (no DDP)".
TEST_CASE("README optimizer in backward", "[readme]") {
  manual_seed(0);
  Tensor x = randn({16, 4}), y = randn({16, 2});
  nn::Sequential model;
  model.push_back(std::make_shared<nn::Linear>(4, 8));
  model.push_back(std::make_shared<nn::ReLU>());
  model.push_back(std::make_shared<nn::Linear>(8, 2));
  const double first = nn::mse_loss(model(x), y).item<double>();
  auto in_backward = optim::apply_optimizer_in_backward(optim::AdamWOptions{.lr = 1e-3}, model.parameters());
  for (int step = 0; step < 10; ++step) {
    in_backward->set_lr(1e-3 * (1 - step / 10.0));  // a schedule, as with any optimizer
    nn::mse_loss(model(x), y).backward();          // steps each parameter; no zero_grad, no step()
  }
  nn::TensorDict state = in_backward->state_dict();  // "0.state.0.exp_avg", ...: "<i>." + parameter i's optimizer keys
  REQUIRE(state.contains("0.state.0.exp_avg"));
  REQUIRE(state["3.state.0.step"].item<double>() == 10);
  for (const Tensor& p : model.parameters()) REQUIRE_FALSE(p.grad().defined());
  REQUIRE(nn::mse_loss(model(x), y).item<double>() < first);
}

// ---------------------------------------------------------------------------------------------
// docs/join-zero.md: uneven inputs, sharded optimizer state and checkpoints of a run
// ---------------------------------------------------------------------------------------------

// docs/join-zero.md, "Uneven inputs: dist::Join".
TEST_CASE("README uneven inputs: Join", "[readme]") {
  std::atomic<int> failed{0};
  std::vector<Tensor> weights(3);
  dist::run_threads(3, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    const int64_t rows = 6 + 4 * group.rank();  // rank r has r more batches than rank 0
    manual_seed(1);
    auto my_shard = std::make_shared<data::TensorDataset>(TensorList{randn({rows, 8}), randn({rows, 2})});
    manual_seed(0);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(8, 2));
    dist::DistributedDataParallel ddp(model, pg);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    data::DataLoader loader(my_shard, {.batch_size = 4, .drop_last = false});  // shards of any length
    {
      dist::Join join({&ddp});  // {.throw_on_early_termination = true}: every rank raises instead
      for (const TensorList& batch : loader) {
        opt.zero_grad();
        nn::mse_loss(ddp(batch[0]), batch[1]).backward();
        opt.step();
      }
      join.join();  // this rank is done: shadow the others (the destructor does it otherwise)
    }
    // Every rank now holds the parameters and buffers of a rank that trained to the end.
    weights[group.rank()] = model->at<nn::Linear>(0)->weight.detach().clone();
    failed += loader.num_batches() == 2 + group.rank() ? 0 : 1;
  });
  REQUIRE(failed == 0);
  REQUIRE(weights[0].equal(weights[2]));
  REQUIRE(weights[1].equal(weights[2]));
}

// docs/join-zero.md: the Join's "Your own collectives" (a metric reduced after join()) and ZeRO's
// "With Join" (clipping and a schedule repeated by the ranks that have joined).
TEST_CASE("README Join: a metric after join(); ZeRO with clipping and a schedule", "[readme]") {
  std::vector<double> means(3);
  std::vector<Tensor> weights(3);
  std::vector<int64_t> epochs(3);
  dist::run_threads(3, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(1);
    const int64_t rows = 6 + 4 * group.rank();
    auto shard = std::make_shared<data::TensorDataset>(TensorList{randn({rows, 8}), randn({rows, 2})});
    data::DataLoader loader(shard, {.batch_size = 4, .drop_last = false});
    manual_seed(0);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(8, 2));
    dist::DistributedDataParallel ddp(model, pg);
    optim::SGD opt(model->parameters(), {.lr = 0.1});
    double loss_sum = 0;
    int64_t batches = 0;
    {
      dist::Join join({&ddp});
      for (const TensorList& batch : loader) {
        opt.zero_grad();
        Tensor loss = nn::mse_loss(ddp(batch[0]), batch[1]);
        loss.backward();
        opt.step();
        loss_sum += loss.item<double>();  // local: no collective inside the Join
        ++batches;
      }
      join.join();
    }
    Tensor totals = from_vector<double>({loss_sum, static_cast<double>(batches)});
    pg->allreduce(totals, dist::ReduceOp::sum)->wait();  // after the Join: every rank is here
    const double mean_loss = totals.to_vector<double>()[0] / totals.to_vector<double>()[1];
    means[group.rank()] = mean_loss;

    {
      manual_seed(0);
      auto model = std::make_shared<nn::Sequential>(nn::Linear(8, 2));  // the ZeRO example's own
      dist::DistributedDataParallel ddp(model, pg);
      dist::ZeroRedundancyOptimizer opt(model->parameters(), optim::AdamWOptions{.lr = 3e-4}, pg);
      optim::CosineAnnealingLR schedule(opt, /*t_max=*/1000);
      {
        dist::Join join({&ddp, &opt});
        for (const TensorList& batch : loader) {  // uneven shards
          opt.zero_grad();
          nn::mse_loss(ddp(batch[0]), batch[1]).backward();
          nn::utils::clip_grad_norm_(model->parameters(), 1.0);  // repeated by ranks that have joined
          opt.step();
          schedule.step();
        }
      }
      weights[group.rank()] = model->at<nn::Linear>(0)->weight.detach().clone();
      epochs[group.rank()] = schedule.last_epoch();
    }
  });
  REQUIRE(means[0] == means[1]);
  REQUIRE(means[1] == means[2]);
  REQUIRE(weights[0].equal(weights[2]));
  REQUIRE(weights[1].equal(weights[2]));
  REQUIRE(epochs == std::vector<int64_t>{4, 4, 4});  // the longest shard's batches, on every rank
}

// docs/join-zero.md, "Sharded optimizer state: dist::ZeroRedundancyOptimizer".
TEST_CASE("README sharded optimizer state: ZeroRedundancyOptimizer", "[readme]") {
  std::atomic<int> failed{0};
  const std::string path = "readme_optimizer.safetensors";
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(0);
    Tensor x = randn({8, 32}), y = randn({8, 10});
    auto model = std::make_shared<nn::Sequential>(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10));
    dist::DistributedDataParallel ddp(model, pg);
    dist::ZeroRedundancyOptimizer opt(model->parameters(), optim::AdamWOptions{.lr = 3e-4}, pg);
    optim::CosineAnnealingLR schedule(opt, /*t_max=*/100);
    for (int step = 0; step < 100; ++step) {
      opt.zero_grad();
      nn::mse_loss(ddp(x), y).backward();
      opt.step();  // this rank's partition, then each partition broadcast from its owner
      schedule.step();
    }
    opt.consolidate_state_dict(0);  // collective: rank 0 receives every partition's state
    if (pg->rank() == 0) nn::save_safetensors("readme_optimizer.safetensors", opt.state_dict());
    pg->barrier()->wait();
    opt.load_state_dict(nn::load_safetensors("readme_optimizer.safetensors"));  // on every rank, at any rank count
    // Each rank holds about half the state: Adam's two tensors for its partition only.
    const int64_t all = 2 * 8 * (32 * 64 + 64 + 64 * 10 + 10);
    failed += (opt.local_state_bytes() > 0 && opt.local_state_bytes() < all) ? 0 : 1;
    opt.consolidate_state_dict(1);
    if (pg->rank() == 1) failed += opt.state_dict().size() == nn::load_safetensors(path).size() ? 0 : 1;
  });
  std::remove(path.c_str());
  REQUIRE(failed == 0);
}

// docs/join-zero.md, ZeRO's "overlap_with_ddp".
TEST_CASE("README sharded optimizer state: overlap_with_ddp", "[readme]") {
  std::vector<Tensor> weights(2);
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(0);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(32, 64), nn::ReLU(), nn::Linear(64, 10));
    Tensor x = randn({8, 32}), y = randn({8, 10});
    dist::ZeroRedundancyOptimizer opt(model->parameters(), optim::AdamOptions{}, pg, {.overlap_with_ddp = true});
    dist::DistributedDataParallel ddp(model, pg);  // after: it takes over the steps
    for (int step = 0; step < 3; ++step) {
      opt.zero_grad();
      nn::mse_loss(ddp(x), y).backward();  // each rank's partition is stepped in here
      opt.step();                          // the partitions broadcast from their owners
    }
    weights[group.rank()] = model->at<nn::Linear>(0)->weight.detach().clone();
  });
  REQUIRE(weights[0].equal(weights[1]));
}

// docs/join-zero.md, "Checkpoints of a run: dist::save_checkpoint / dist::load_checkpoint".
TEST_CASE("README checkpoints", "[readme]") {
  std::vector<Tensor> before(2), after(2);
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    manual_seed(0);
    auto model = std::make_shared<nn::Sequential>(nn::Linear(8, 4));
    dist::DistributedDataParallel ddp(model, pg);
    dist::ZeroRedundancyOptimizer opt(model->parameters(), optim::AdamWOptions{.lr = 1e-2}, pg);
    optim::CosineAnnealingLR schedule(opt, /*t_max=*/10);
    Tensor x = randn({4, 8}), y = randn({4, 4});
    const int64_t epoch = 1, batch = 3;
    int64_t step = 0;
    for (; step < 3; ++step) {
      opt.zero_grad();
      nn::mse_loss(ddp(x), y).backward();
      opt.step();
      schedule.step();
    }
    dist::TrainingState state{.model = model.get(), .optimizer = &opt, .scheduler = &schedule};
    state.step = step;
    state.extra.insert_or_assign("position", from_vector<int64_t>({epoch, batch}));
    dist::save_checkpoint("run/checkpoint.safetensors", state, pg);  // every rank of pg
    before[group.rank()] = model->at<nn::Linear>(0)->weight.detach().clone();
    // (In the test, the same process:) fresh objects, loaded from the file.
    manual_seed(5);
    auto fresh = std::make_shared<nn::Sequential>(nn::Linear(8, 4));
    dist::ZeroRedundancyOptimizer fresh_opt(fresh->parameters(), optim::AdamWOptions{.lr = 1e-2}, pg);
    optim::CosineAnnealingLR fresh_schedule(fresh_opt, /*t_max=*/10);
    state = dist::TrainingState{.model = fresh.get(), .optimizer = &fresh_opt, .scheduler = &fresh_schedule};
    // A later run, at any number of ranks, with the same objects built afresh:
    dist::CheckpointInfo info = dist::load_checkpoint("run/checkpoint.safetensors", state);
    after[group.rank()] = fresh->at<nn::Linear>(0)->weight.detach().clone();
    if (info.step != 3 || info.world_size != 2 || state.extra["position"].to_vector<int64_t>()[1] != batch ||
        fresh_schedule.last_epoch() != 3)
      after[group.rank()] = Tensor();
  });
  std::filesystem::remove_all("run");
  REQUIRE(after[0].defined());
  REQUIRE(after[1].defined());
  REQUIRE(after[0].equal(before[0]));
  REQUIRE(after[1].equal(before[1]));
}

// ---------------------------------------------------------------------------------------------
// docs/mpirun.md
// ---------------------------------------------------------------------------------------------

// docs/mpirun.md, "Hangs that name their culprit: the flight recorder": tags and dumps.
TEST_CASE("README flight recorder: tags and dumps", "[readme]") {
  const std::string file = "readme_flight.json";
  std::atomic<int> failed{0};
  dist::run_threads(2, [&](dist::ProcessGroup& group) {
    dist::ProcessGroupPtr pg(std::shared_ptr<void>(), &group);
    Tensor loss = full({1}, 1.0 + group.rank());
    {
      dist::CollectiveTag tag("loss average");  // collectives issued on this thread while it lives
      pg->allreduce(loss, dist::ReduceOp::avg)->wait();
    }
    pg->barrier()->wait();
    if (group.rank() == 0) {
      std::string path = dist::dump_flight_recorder("after epoch 3", file);  // this process's rings
      std::ifstream in(path);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      failed += text.find("\"caller\": \"loss average\"") != std::string::npos &&
                        text.find("\"reason\": \"after epoch 3\"") != std::string::npos
                    ? 0
                    : 1;
    }
    failed += loss.item<float>() == 1.5f ? 0 : 1;
  });
  std::remove(file.c_str());
  REQUIRE(failed == 0);
}
