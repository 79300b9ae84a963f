// bench_train: the main job's figures beside PyTorch's, on the same work: train's CNN and GPT
// (tools/train/models.h) with the same initial weights, the same data order and the same
// optimizer and schedule; one intra-op thread per process.
//
//   bench_train [--json] [--runs N] [--acc-runs N] [--gpt-runs N] [--no-peer] [--quick] [--data-root DIR]
//               [--rows LIST] [--peer-python PATH]
//
// Run it plainly (not under mpirun): it launches its own workers (`bench_train --worker epoch|sdpa|
// gpt|gpt_bf16`, under `mpirun -np 2` for the DDP rows), the PyTorch peer
// (tools/bench/bench_train_peer.py with /usr/bin/python3, or --peer-python's; gloo processes for the
// DDP rows) and, for
// the accuracy and the validation loss, the main job itself (`mpirun -np 2 train` with its
// defaults, and with `--model gpt`). Ours and the peer's runs alternate (ours, peer, ours, peer,
// ...), so a shared machine's drift falls on both alike; a row shows the medians, and its note the
// ranges and the number of runs. Rows, by --rows group (default all three; cnn needs
// Fashion-MNIST, gpt Debian's fortunes):
// cnn:
//   conv2d_fwd_bwd        bench_cpu's row (tools/train/models.h's ConvBench): a 64x32x28x28 input
//                         through a 3x3 conv to 64 channels, forward and backward, ms
//   fmnist_cnn_epoch      one epoch of the main job's CNN in one process (batch 64, SGD with momentum
//                         at the main job's lr): the training loop's wall time, without evaluation
//                         or loading the data set
//   fmnist_cnn_epoch_np2  the same epoch under mpirun -np 2 with DDP (each rank half of the data)
//                         vs PyTorch DDP over gloo in 2 processes
//   fmnist_cnn_acc        the main job's test accuracy minus the peer's after the same recipe
//                         (epochs, schedule, weights, data order), in points (--acc-runs runs)
//   loader_wait           the np2 epoch's time spent waiting for the loader, share of the epoch
// sdpa:
//   sdpa_fwd_bwd          scaled_dot_product_attention forward and backward, B 8, H 4, T 512, D 64,
//                         causal, f32, vs PyTorch 1.13's unfused attention (q kᵀ, masked_fill,
//                         softmax, · v: what a model writes without a fused op), ms
//   sdpa_peak_mem         the same forward and backward's peak memory over what the inputs take
//                         (peak RSS of a fresh process), MiB
// gpt (train --model gpt's model and recipe, kGptRecipe: its initial weights, data windows, AdamW
// groups, warm-up + cosine schedule over the recipe's steps and clipping; the peer is the same GPT
// in PyTorch with the same parameter names, attention unfused, and takes the weights, every
// rank's windows per step and the validation windows from a setup file bench_train writes):
//   gpt_step              one training step (forward, loss, backward, clip to 1, AdamW step, schedule)
//                         in one process, ms: the median of 30 steps after 5 untimed, each run a
//                         fresh process on the loader's first windows
//   gpt_step_np2          the same under mpirun -np 2 with DDP (batch 32 per rank) vs PyTorch DDP
//                         over gloo in 2 processes, ms
//   gpt_mp_bf16_step      our np2 step with DDP mixed precision bf16 vs our f32 np2 step (the peer
//                         column), ms; a report, the CPU's bf16 GEMM being slower than its f32 one
//   gpt_val_loss          the main job's validation loss (`mpirun -np 2 train --model gpt`, its
//                         "final:" line) minus the peer's after the same recipe at 2 ranks, on the
//                         same validation windows, in nats per character (--gpt-runs runs, each side
//                         training several minutes; 0 skips the row)
// The PyTorch side takes its batches as rows of the images held in memory, as our loader does (the
// GPT's: windows cut from the training split's token ids).
// --quick: one run of each timed row and no accuracy or validation-loss row.
#include "cli.h"
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench_common.h"
#include "tandem.h"
#include "train/models.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

// A worker's or the peer's JSON result; failures are told on stderr (bench_common.h).
std::optional<nlohmann::json> run_json(const std::string& cmd) { return bench::run_json(cmd, "bench_train"); }

// ---- the worker: one epoch of train's loop, timed (under mpirun for 2 ranks) ----

nlohmann::json epoch_worker(const std::string& data_root) {
  set_num_threads(1);
  dist::ProcessGroupPtr g = dist::init();
  auto train_set = std::make_shared<data::FashionMNIST>(data::Split::train, data::FashionMnistOptions{.root = data_root});
  manual_seed(train_init_seed(0));
  auto model = make_fmnist_cnn();
  optim::SGD opt(model->parameters(), {.lr = kFmnistCnnRecipe.lr, .momentum = kSgdMomentum});
  dist::DistributedDataParallel ddp(model, g);
  data::DataLoader loader(train_set, {.batch_size = kFmnistBatch,
                                      .seed = train_loader_seed(0),
                                      .num_replicas = g->size(),
                                      .rank = g->rank()});
  loader.set_epoch(0);
  g->barrier()->wait();
  const double t0 = bench::now_s();
  double wait_s = 0, asked = t0;
  Tensor loss;
  int64_t steps = 0;
  for (auto it = loader.begin(); it != loader.end(); ++it, ++steps) {
    wait_s += bench::now_s() - asked;
    opt.zero_grad(true);
    loss = nn::cross_entropy(ddp((*it)[0].unsqueeze(1)), (*it)[1]);
    loss.backward();
    opt.step();
    asked = bench::now_s();
  }
  const double epoch_s = bench::now_s() - t0;
  // What the epoch reached, as a check that both sides trained alike (not timed).
  Tensor l = loss.detach().to(f64).reshape({1});
  g->allreduce(l, dist::ReduceOp::avg)->wait();
  double accuracy = NAN;
  if (g->rank() == 0) {
    NoGradGuard no_grad;
    model->eval();
    data::FashionMNIST test(data::Split::test, {.root = data_root});
    double correct = 0;
    for (int64_t i = 0; i < test.size(); i += 1000) {
      const int64_t n = std::min<int64_t>(1000, test.size() - i);
      Tensor logits = (*model)(test.images().narrow(0, i, n).unsqueeze(1));
      correct += sum(eq(argmax(logits, 1), test.labels().narrow(0, i, n)).to(f64)).item<double>();
    }
    accuracy = correct / static_cast<double>(test.size());
  }
  return {{"epoch_s", epoch_s}, {"wait_s", wait_s}, {"steps", steps}, {"loss", l.item<double>()},
          {"accuracy", accuracy}};
}

// ---- the attention worker: sdpa_fwd_bwd and sdpa_peak_mem in a fresh process ----

// The resident set now (MiB), from /proc/self/statm's second field (pages).
double current_rss_mib() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  long pages = 0, resident = 0;
  if (f) {
    if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
    std::fclose(f);
  }
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

// B 8, H 4, T 512, D 64, causal: the first forward and backward gives the peak over the inputs'
// footprint, then `iters` more the median time.
nlohmann::json sdpa_worker(int iters) {
  set_num_threads(1);
  manual_seed(0);
  const Shape shape{8, 4, 512, 64};
  Tensor q = randn(shape).requires_grad_(), k = randn(shape).requires_grad_(), v = randn(shape).requires_grad_();
  Tensor w = randn(shape);
  auto step = [&] {
    q.set_grad(Tensor());
    k.set_grad(Tensor());
    v.set_grad(Tensor());
    sum(scaled_dot_product_attention(q, k, v, {}, 0.0, true) * w).backward();
  };
  const double base = current_rss_mib();
  step();
  const double peak = peak_rss_mib() - base;
  bench::Samples ms;
  for (int i = 0; i < iters; ++i) {
    const double t0 = bench::now_s();
    step();
    ms.add((bench::now_s() - t0) * 1e3);
  }
  return {{"ms", ms.median()}, {"peak_mib", peak}};
}

// ---- the GPT workers: gpt_step, gpt_step_np2 and gpt_mp_bf16_step (under mpirun for 2 ranks) ----

// The timed GPT steps: kGptWarmSteps untimed, then kGptTimedSteps whose median is a run's figure.
constexpr int64_t kGptWarmSteps = 5, kGptTimedSteps = 30;

// train --model gpt's data, built as it builds them (tools/train/train.cpp): the default corpus cut
// into windows of the recipe's context, the validation split in windows of stride block_size, both
// with the training split's vocabulary; and the recipe's model at that vocabulary.
struct GptData {
  std::string corpus;
  std::shared_ptr<const data::TextDataset> train, val;
  GptConfig config;
};

GptData gpt_data() {
  GptData d;
  const std::string path = data::default_text_corpus_path();
  d.corpus = data::read_text_corpus(path);
  const int64_t block = kGptRecipe.model.block_size;
  d.train = std::make_shared<const data::TextDataset>(data::TextDataset::from_text(d.corpus, {.block_size = block}, path));
  d.val = std::make_shared<const data::TextDataset>(data::TextDataset::from_text(
      d.corpus,
      {.block_size = block, .split = data::TextSplit::validation, .stride = block, .vocab = d.train->vocab()}, path));
  d.config = kGptRecipe.model;
  d.config.vocab_size = d.train->vocab().size();
  return d;
}

// train's GPT loop on its defaults (weights from train_init_seed(0), the loader on
// train_loader_seed(0), nanoGPT's AdamW groups, warm-up then cosine over the recipe's steps, the
// gradients clipped after DDP's averaging), for kGptWarmSteps + kGptTimedSteps steps; each step
// timed from zero_grad to the schedule's step (the batch is taken from the loader before the
// clock starts). `mixed_bf16`: DDP's mixed precision, as train --mixed-precision bf16.
nlohmann::json gpt_worker(bool mixed_bf16) {
  set_num_threads(1);
  dist::ProcessGroupPtr g = dist::init();
  const GptData d = gpt_data();
  manual_seed(train_init_seed(0));
  auto model = make_gpt(d.config);
  const GptParamGroups split = gpt_param_groups(*model);
  const optim::AdamWOptions decay{.lr = kGptRecipe.lr, .beta1 = kGptRecipe.beta1, .beta2 = kGptRecipe.beta2,
                                  .weight_decay = kGptRecipe.weight_decay};
  optim::AdamWOptions no_decay = decay;
  no_decay.weight_decay = 0;
  optim::AdamW opt(std::vector<optim::AdamW::Group>{{split.decay, decay}, {split.no_decay, no_decay}});
  const int64_t warmup = kGptRecipe.warmup_steps;
  optim::SequentialLR schedule(
      opt,
      {std::make_shared<optim::LinearLR>(opt, 0.1, 1.0, warmup),
       std::make_shared<optim::CosineAnnealingLR>(opt, std::max<int64_t>(1, kGptRecipe.steps - warmup))},
      {warmup});
  dist::DdpOptions options;
  if (mixed_bf16) options.mixed_precision = dist::MixedPrecision{.param_dtype = bf16};
  dist::DistributedDataParallel ddp(model, g, options);
  data::DataLoader loader(d.train, {.batch_size = kGptRecipe.batch,
                                    .seed = train_loader_seed(0),
                                    .num_replicas = g->size(),
                                    .rank = g->rank()});
  loader.set_epoch(0);
  auto mean_over_ranks = [&](const Tensor& loss) {
    Tensor l = loss.detach().to(f64).reshape({1});
    g->allreduce(l, dist::ReduceOp::avg)->wait();
    return l.item<double>();
  };
  g->barrier()->wait();
  bench::Samples ms;
  double first_loss = NAN;
  Tensor loss;
  auto it = loader.begin();
  for (int64_t s = 0; s < kGptWarmSteps + kGptTimedSteps; ++s, ++it) {
    TANDEM_CHECK(it != loader.end(), "[bench_train] the GPT's epoch is shorter than {} steps",
                 kGptWarmSteps + kGptTimedSteps);
    const Tensor x = (*it)[0], y = (*it)[1];
    const double t0 = bench::now_s();
    opt.zero_grad(true);
    loss = gpt_loss(ddp(x), y);
    loss.backward();
    nn::utils::clip_grad_norm_(model->named_parameters(), kGptRecipe.clip_grad);
    opt.step();
    schedule.step();
    if (s >= kGptWarmSteps) ms.add((bench::now_s() - t0) * 1e3);
    if (s == 0) first_loss = mean_over_ranks(loss);  // untimed; every rank takes part
  }
  return {{"ms", ms.median()}, {"first_loss", first_loss}, {"loss", mean_over_ranks(loss)},
          {"steps", kGptWarmSteps + kGptTimedSteps}};
}

// ---- the peer's setup: train's initial weights and every rank's data order per epoch ----

void write_setup(const std::string& path, int64_t epochs_np2, int64_t dataset_size) {
  nn::TensorDict all;
  manual_seed(train_init_seed(0));
  for (const auto& [name, t] : make_fmnist_cnn()->state_dict()) all.insert("model." + name, t);
  for (int world : {1, 2}) {
    for (int rank = 0; rank < world; ++rank) {
      data::DistributedSampler sampler(dataset_size, world, rank, {.seed = train_loader_seed(0)});
      for (int64_t e = 0; e < (world == 1 ? 1 : epochs_np2); ++e) {
        sampler.set_epoch(e);
        all.insert(fmt::format("order.{}.{}.{}", world, rank, e), from_vector(sampler.indices()));
      }
    }
  }
  nn::save_safetensors(path, all);
}

// The GPT peer's setup: train --model gpt's initial weights ("model.<name>"), the training split's
// token ids ("train_tokens": window i of the split is tokens [i, i + block_size], x the first
// block_size and y the last), every rank's window starts for its first `steps[world]` steps
// ("order.<world>.<rank>", the loader's epoch 0: step s takes entries [s batch, (s + 1) batch)),
// and the validation windows train evaluates ("val.x", "val.y": --eval-windows of them spread
// evenly over the split, as train's evaluate_text picks them).
void write_gpt_setup(const std::string& path, const GptData& d, int64_t steps_np1, int64_t steps_np2) {
  nn::TensorDict all;
  manual_seed(train_init_seed(0));
  for (const auto& [name, t] : make_gpt(d.config)->state_dict()) all.insert("model." + name, t);
  // The training split is the corpus's first split_bytes() bytes (data/text.h).
  const data::TextDataset& train = *d.train;
  const Tensor tokens = train.vocab().encode(std::string_view(d.corpus).substr(0, train.split_bytes()));
  all.insert("train_tokens", tokens);
  const std::vector<int64_t> ids = tokens.to_vector<int64_t>();
  const int64_t block = train.block_size(), batch = kGptRecipe.batch;
  for (int world : {1, 2}) {
    const int64_t n = (world == 1 ? steps_np1 : steps_np2) * batch;
    for (int rank = 0; rank < world; ++rank) {
      data::DistributedSampler sampler(train.size(), world, rank, {.seed = train_loader_seed(0)});
      sampler.set_epoch(0);
      std::vector<int64_t> order = sampler.indices();
      TANDEM_CHECK(static_cast<int64_t>(order.size()) >= n,
                   "[bench_train] a rank's GPT epoch holds {} windows, fewer than {} steps of {}", order.size(),
                   n / batch, batch);
      order.resize(static_cast<size_t>(n));
      // What the peer will cut from the tokens is what train's loader hands out: its first batch.
      data::DataLoader loader(d.train, {.batch_size = batch,
                                        .seed = train_loader_seed(0),
                                        .prefetch = 0,
                                        .num_replicas = world,
                                        .rank = rank});
      loader.set_epoch(0);
      const TensorList first = *loader.begin();
      const std::vector<int64_t> x = first[0].to_vector<int64_t>(), y = first[1].to_vector<int64_t>();
      for (int64_t k = 0; k < batch; ++k)
        for (int64_t j = 0; j < block; ++j) {
          const size_t at = static_cast<size_t>(order[static_cast<size_t>(k)] + j), in = static_cast<size_t>(k * block + j);
          TANDEM_CHECK(x[in] == ids[at] && y[in] == ids[at + 1],
                       "[bench_train] the loader's first GPT batch (world {}, rank {}) is not the sampler's windows",
                       world, rank);
        }
      all.insert(fmt::format("order.{}.{}", world, rank), from_vector(order));
    }
  }
  const data::TextDataset& val = *d.val;
  const int64_t total = val.size(), n = std::min(kGptRecipe.eval_windows, total);
  std::vector<int64_t> windows;
  for (int64_t i = 0; i < n; ++i) windows.push_back(i * total / n);
  const TensorList v = val.get_batch(windows);
  all.insert("val.x", v[0]);
  all.insert("val.y", v[1]);
  nn::save_safetensors(path, all);
}

// The main job's "final: train loss ..." line (up to its end), or nullopt when it printed none. The
// first such line: the GPT's sample, printed after it, is free text.
std::optional<std::string> run_final_line(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return std::nullopt;
  std::string out;
  std::array<char, 4096> buf;
  while (size_t k = fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), k);
  pclose(p);  // the CNN's status is 1 when its target is missed: the accuracy is what is measured here
  const size_t at = out.find("final: train loss ");
  if (at == std::string::npos) {
    fmt::print(stderr, "bench_train: no final line from '{}':\n{}\n", cmd, out);
    return std::nullopt;
  }
  return out.substr(at, out.find('\n', at) - at);
}

// The main job's output: its "final:" line's accuracy (%) and seconds; nullopt if there is none.
std::optional<std::pair<double, double>> run_main_job(const std::string& cmd) {
  const std::optional<std::string> line = run_final_line(cmd);
  if (!line) return std::nullopt;
  double train_loss = 0, test_loss = 0, accuracy = 0, target = 0, seconds = 0;
  if (std::sscanf(line->c_str(), "final: train loss %lf, test loss %lf, test accuracy %lf%% (target %lf%%) in %lfs",
                  &train_loss, &test_loss, &accuracy, &target, &seconds) != 5) {
    fmt::print(stderr, "bench_train: cannot read '{}' from '{}'\n", *line, cmd);
    return std::nullopt;
  }
  return std::make_pair(accuracy, seconds);
}

// The GPT main job's "final:" line: its last step's training loss and its validation loss (nats
// per character), and its seconds; nullopt without them.
struct GptFinal {
  double train_loss = 0, val_loss = 0, seconds = 0;
};
std::optional<GptFinal> run_gpt_main_job(const std::string& cmd) {
  const std::optional<std::string> line = run_final_line(cmd);
  if (!line) return std::nullopt;
  GptFinal f;
  double bits = 0;
  if (std::sscanf(line->c_str(), "final: train loss %lf, validation loss %lf nats per character (%lf bits) in %lfs",
                  &f.train_loss, &f.val_loss, &bits, &f.seconds) != 4) {
    fmt::print(stderr, "bench_train: cannot read '{}' from '{}'\n", *line, cmd);
    return std::nullopt;
  }
  return f;
}

// One row's runs, ours and the peer's alternating. Each round's ratio compares figures taken
// moments apart: on a shared machine whose load drifts it is steadier than the medians' ratio.
struct Paired {
  bench::Samples ours, peer, ratio;
  void round(std::optional<double> o, std::optional<double> p) {
    if (o) ours.add(*o);
    if (p) peer.add(*p);
    if (o && p) ratio.add(*o / *p);
  }
  std::optional<double> peer_median() const { return peer.empty() ? std::nullopt : std::optional(peer.median()); }
  // "3 runs: ours M [lo-hi] s, peer M [lo-hi] s, per run ours / peer R [lo-hi]"
  std::string note(const std::string& unit) const {
    std::string s = fmt::format("{} run{}: ours {} {}", ours.values.size(), ours.values.size() == 1 ? "" : "s",
                                ours.str(), unit);
    if (!peer.empty()) s += fmt::format(", peer {} {}", peer.str(), unit);
    if (ratio.values.size() > 1) s += fmt::format(", per run ours / peer {}", ratio.str(3));
    return s;
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Tandem's training figures beside PyTorch's on the main job", "bench_train"};
  bool json = false, no_peer = false, quick = false;
  int runs = 3, acc_runs = 1, gpt_runs = 1;
  std::string data_root = data::FashionMnistOptions{}.root, worker_task;
  app.add_flag("--json", json, "one JSON object per row");
  app.add_option("--runs", runs, "runs of each timed row, ours and the peer's alternating (the median is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--acc-runs", acc_runs, "runs of the main job (and of the peer's) for fmnist_cnn_acc")
      ->check(CLI::Range(0, 100));
  app.add_option("--gpt-runs", gpt_runs,
                 "runs of the GPT main job (and of the peer's) for gpt_val_loss, each several minutes; 0 skips it")
      ->check(CLI::Range(0, 100));
  app.add_flag("--no-peer", no_peer, "do not run the PyTorch peer");
  app.add_flag("--quick", quick, "one run of each timed row, no accuracy or validation-loss row");
  app.add_option("--data-root", data_root, "folder of the Fashion-MNIST IDX files");
  std::string peer_flag;
  app.add_option("--peer-python", peer_flag,
                 "the Python with torch that runs the peer (default: $TANDEM_PEER_PYTHON, else /usr/bin/python3)");
  std::string row_groups = "cnn,sdpa,gpt";
  app.add_option("--rows", row_groups, "the row groups to run, comma-separated: cnn (conv2d_fwd_bwd, fmnist_*), "
                                       "sdpa (sdpa_*), gpt (gpt_*)");
  app.add_option("--worker", worker_task, "internal: run one measurement (under mpirun for 2 ranks)");
  TANDEM_TOOL_PARSE(app, argc, argv);

  try {
    if (worker_task == "sdpa") {
      fmt::print("{}\n", sdpa_worker(5).dump());
      return 0;
    }
    if (worker_task == "gpt" || worker_task == "gpt_bf16") {
      nlohmann::json out = gpt_worker(worker_task == "gpt_bf16");
      if (dist::world_info().rank == 0) fmt::print("{}\n", out.dump());
      return 0;
    }
    if (worker_task == "epoch") {
      nlohmann::json out = epoch_worker(data_root);
      if (dist::world_info().rank == 0) fmt::print("{}\n", out.dump());
      return 0;
    }
    TANDEM_CHECK(worker_task.empty(), "[bench_train] unknown worker '{}'", worker_task);
    auto want = [&](const std::string& group) { return ("," + row_groups + ",").find("," + group + ",") != std::string::npos; };
    for (std::string_view rest = row_groups; !rest.empty();) {
      const size_t comma = rest.find(',');
      const std::string_view g = rest.substr(0, comma);
      TANDEM_CHECK(g == "cnn" || g == "sdpa" || g == "gpt", "[bench_train] unknown row group '{}' in --rows {}", g,
                   row_groups);
      rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    }
    TANDEM_CHECK(!want("cnn") || (data::FashionMNIST::available(data::Split::train, data_root) &&
                     data::FashionMNIST::available(data::Split::test, data_root)),
                 "[bench_train] no Fashion-MNIST in '{}' (Debian's dataset-fashion-mnist; tools/ci/deps.sh)", data_root);
    TANDEM_CHECK(!want("gpt") || data::TextDataset::available(),
                 "[bench_train] no text corpus in '{}' for the gpt rows (Debian's fortunes; tools/ci/deps.sh)",
                 data::default_text_corpus_path());
    if (quick) {
      runs = 1;
      acc_runs = 0;
      gpt_runs = 0;
    }
    set_num_threads(1);
    const std::string self = bench::self_exe("bench_train");
    const std::string train = (fs::path(self).parent_path() / "train").string();
    char tmp_template[] = "/tmp/bench_train.XXXXXX";
    TANDEM_CHECK(mkdtemp(tmp_template) != nullptr, "[bench_train] cannot make a temporary folder");
    const fs::path tmp(tmp_template);
    const std::string setup = (tmp / "setup.safetensors").string();
    if (want("cnn")) write_setup(setup, kFmnistCnnRecipe.epochs, 60000);
    const std::string py = bench::peer_python(peer_flag);
    const std::string peer_script = fmt::format("{}/bench_train_peer.py", TANDEM_BENCH_DIR);
    // The peer's run of train's CNN: `epochs` > 1 is the main job's recipe, 1 the timed epoch (a
    // constant lr, as the worker's).
    auto peer_train = [&](int world, int64_t epochs, const char* schedule, bool eval) {
      return run_json(fmt::format("{} {} train {} --world {} --epochs {} --lr {} --schedule {} --warmup {} --batch {} "
                                  "--momentum {} --mean {} --std {} --data-root {}{} 2>&1",
                                  py, peer_script, setup, world, epochs, kFmnistCnnRecipe.lr, schedule,
                                  epochs > 1 ? kFmnistCnnRecipe.warmup_steps : 0, kFmnistBatch,
                                  kSgdMomentum, data::FashionMNIST::kMean, data::FashionMNIST::kStd, data_root,
                                  eval ? "" : " --no-eval"));
    };
    bool peer_ok = !no_peer && std::system(fmt::format("{} -c 'import torch' 2>/dev/null", py).c_str()) == 0;
    if (!no_peer && !peer_ok) fmt::print(stderr, "note: PyTorch peer not available ({} with torch)\n", py);
    std::string torch_version;
    std::vector<bench::Row> rows;

    // conv2d_fwd_bwd: a sample is the mean of 3 calls, as bench_cpu's; the peer's after its warm-up.
    if (want("cnn")) {
      ConvBench conv;
      for (int i = 0; i < 2; ++i) conv.step();
      Paired row;
      for (int r = 0; r < runs; ++r) {
        const double t0 = bench::now_s();
        for (int i = 0; i < 3; ++i) conv.step();
        const double ours = (bench::now_s() - t0) / 3 * 1e3;
        std::optional<double> peer;
        if (peer_ok)
          if (auto j = run_json(fmt::format("{} {} conv 2>&1", py, peer_script))) {
            peer = (*j)["conv2d_fwd_bwd_ms"].get<double>();
            torch_version = (*j)["version"].get<std::string>();
          }
        row.round(ours, peer);
      }
      rows.push_back({"conv2d_fwd_bwd", row.ours.median(), row.peer_median(), "ms", "ratio <= 0.85",
                      "64x32x28x28, 3x3 to 64, pad 1; " + row.note("ms")});
    }

    // The epochs: ours alone, the peer alone, ours at 2 ranks, the peer at 2 ranks; again.
    if (want("cnn")) {
      Paired alone, np2;
      bench::Samples wait1, wait2;
      std::string acc1, acc2;  // the first round's test accuracies, ours and the peer's (evaluated then only)
      auto ours_epoch = [&](const std::string& launch, bench::Samples& wait, std::string& acc,
                            int r) -> std::optional<double> {
        auto j = run_json(fmt::format("{}{} --worker epoch --data-root {} 2>&1", launch, self, data_root));
        if (!j) return std::nullopt;
        wait.add(100 * (*j)["wait_s"].get<double>() / (*j)["epoch_s"].get<double>());
        if (r == 0) acc = fmt::format("after it: ours {:.2f}%", 100 * (*j)["accuracy"].get<double>());
        return (*j)["epoch_s"].get<double>();
      };
      auto peer_epoch = [&](int world, std::string& acc, int r) -> std::optional<double> {
        if (!peer_ok) return std::nullopt;
        auto j = peer_train(world, 1, "constant", r == 0);
        if (!j) return std::nullopt;
        if (r == 0) acc += fmt::format(", peer {:.2f}%", 100 * (*j)["accuracy"].get<double>());
        return (*j)["epoch_s"].get<double>();
      };
      for (int r = 0; r < runs; ++r) {
        const std::optional<double> o1 = ours_epoch("", wait1, acc1, r);
        alone.round(o1, peer_epoch(1, acc1, r));
        const std::optional<double> o2 = ours_epoch(bench::mpirun_prefix(2) + " ", wait2, acc2, r);
        np2.round(o2, peer_epoch(2, acc2, r));
      }
      rows.push_back({"fmnist_cnn_epoch", alone.ours.median(), alone.peer_median(), "s", "ratio <= 0.7",
                      fmt::format("1 process; {}; {}", alone.note("s"), acc1)});
      rows.push_back({"fmnist_cnn_epoch_np2", np2.ours.median(), np2.peer_median(), "s", "ratio <= 0.5",
                      fmt::format("DDP vs PyTorch DDP gloo; {}; {}", np2.note("s"), acc2)});
      rows.push_back({"loader_wait", wait2.median(), std::nullopt, "%", "<= 1%",
                      fmt::format("np2 epoch, {} runs: {} %; 1 process: {} %", wait2.values.size(), wait2.str(3),
                                  wait1.str(3))});
    }

    // The main job (train's defaults under mpirun -np 2) and the peer after the same recipe.
    if (want("cnn") && acc_runs > 0) {
      Paired accuracy;
      bench::Samples ours_s, peer_s;
      for (int r = 0; r < acc_runs; ++r) {
        std::optional<double> ours, peer;
        if (auto a = run_main_job(fmt::format("{} {} --progress lines --data-root {} 2>&1", bench::mpirun_prefix(2),
                                              train, data_root))) {
          ours = a->first;
          ours_s.add(a->second);
        }
        if (peer_ok)
          if (auto j = peer_train(2, kFmnistCnnRecipe.epochs, kFmnistCnnRecipe.lr_schedule, true)) {
            peer = 100 * (*j)["accuracy"].get<double>();
            peer_s.add((*j)["train_s"].get<double>());
          }
        accuracy.round(ours, peer);
      }
      const double diff = accuracy.ours.median() - accuracy.peer_median().value_or(NAN);
      // The main job's time includes its evaluation after every epoch; the peer's is training only.
      rows.push_back({"fmnist_cnn_acc", diff, std::nullopt, "points", ">= -0.5",
                      fmt::format("{} epochs, lr {} {}, np2: {}; time ours {} s (with its evaluations), peer {} s",
                                  kFmnistCnnRecipe.epochs, kFmnistCnnRecipe.lr, kFmnistCnnRecipe.lr_schedule,
                                  accuracy.note("%"), ours_s.str(3), peer_s.str(3))});
    }
    // The fused attention, ours and the peer's unfused one, each a fresh process per run.
    if (want("sdpa")) {
      Paired time, mem;
      for (int r = 0; r < runs; ++r) {
        std::optional<double> ours_ms, ours_mib, peer_ms, peer_mib;
        if (auto j = run_json(fmt::format("{} --worker sdpa 2>&1", self))) {
          ours_ms = (*j)["ms"].get<double>();
          ours_mib = (*j)["peak_mib"].get<double>();
        }
        if (peer_ok)
          if (auto j = run_json(fmt::format("{} {} sdpa 2>&1", py, peer_script))) {
            peer_ms = (*j)["ms"].get<double>();
            peer_mib = (*j)["peak_mib"].get<double>();
            torch_version = (*j)["version"].get<std::string>();
          }
        time.round(ours_ms, peer_ms);
        mem.round(ours_mib, peer_mib);
      }
      rows.push_back({"sdpa_fwd_bwd", time.ours.median(), time.peer_median(), "ms", "ratio <= 0.8",
                      "B 8, H 4, T 512, D 64, causal, f32; peer: unfused; " + time.note("ms")});
      rows.push_back({"sdpa_peak_mem", mem.ours.median(), mem.peer_median(), "MiB", "ratio <= 0.25",
                      "the same fwd+bwd, peak RSS over the inputs'; " + mem.note("MiB")});
    }
    // The GPT: its step in one process and at 2 ranks (f32 beside the peer, bf16 beside our f32),
    // then the main job's validation loss beside the peer's after the same recipe. The peer takes
    // the weights, the windows and the validation windows from the setup file.
    if (want("gpt")) {
      const int64_t timed_steps = kGptWarmSteps + kGptTimedSteps;
      const std::string gpt_setup = (tmp / "gpt_setup.safetensors").string();
      write_gpt_setup(gpt_setup, gpt_data(), timed_steps, std::max(kGptRecipe.steps, timed_steps));
      auto peer_gpt = [&](int world, int64_t steps, bool eval) {
        return run_json(fmt::format("{} {} gpt {} --world {} --steps {} --time-after {} --total-steps {} --warmup {} "
                                    "--lr {} --batch {} --beta1 {} --beta2 {} --weight-decay {} --clip {} --n-head {}{} "
                                    "2>&1",
                                    py, peer_script, gpt_setup, world, steps, kGptWarmSteps, kGptRecipe.steps,
                                    kGptRecipe.warmup_steps, kGptRecipe.lr, kGptRecipe.batch, kGptRecipe.beta1,
                                    kGptRecipe.beta2, kGptRecipe.weight_decay, kGptRecipe.clip_grad,
                                    kGptRecipe.model.n_head, eval ? " --eval" : ""));
      };
      // The first round's losses (mean over the ranks) at the first and the last step: both sides
      // start from the same weights on the same windows, so the first agree to rounding.
      auto losses_of = [](const nlohmann::json& j) {
        return fmt::format("{:.4f}, {:.4f}", j["first_loss"].get<double>(), j["loss"].get<double>());
      };
      Paired alone, np2, mp;  // mp: ours in bf16 beside ours in f32 (the peer column)
      std::string loss1, loss2, loss_mp;
      auto ours_step = [&](const std::string& launch, const char* task, std::string& losses,
                           int r) -> std::optional<double> {
        auto j = run_json(fmt::format("{}{} --worker {} 2>&1", launch, self, task));
        if (!j) return std::nullopt;
        if (r == 0) losses = fmt::format("loss at steps 1 and {}: ours {}", timed_steps, losses_of(*j));
        return (*j)["ms"].get<double>();
      };
      auto peer_step = [&](int world, std::string& losses, int r) -> std::optional<double> {
        if (!peer_ok) return std::nullopt;
        auto j = peer_gpt(world, timed_steps, false);
        if (!j) return std::nullopt;
        if (r == 0) losses += fmt::format(", peer {}", losses_of(*j));
        torch_version = (*j)["version"].get<std::string>();
        return (*j)["ms"].get<double>();
      };
      const std::string np2_launch = bench::mpirun_prefix(2) + " ";
      for (int r = 0; r < runs; ++r) {
        const std::optional<double> o1 = ours_step("", "gpt", loss1, r);
        alone.round(o1, peer_step(1, loss1, r));
        const std::optional<double> o2 = ours_step(np2_launch, "gpt", loss2, r);
        np2.round(o2, peer_step(2, loss2, r));
        mp.round(ours_step(np2_launch, "gpt_bf16", loss_mp, r), o2);
      }
      auto shape = [&](const char* per) {
        return fmt::format("batch {} x {} characters{}, median of {} steps after {}", kGptRecipe.batch,
                           kGptRecipe.model.block_size, per, kGptTimedSteps, kGptWarmSteps);
      };
      rows.push_back({"gpt_step", alone.ours.median(), alone.peer_median(), "ms", "ratio <= 0.8",
                      fmt::format("1 process, {}; {}; {}", shape(""), alone.note("ms"), loss1)});
      rows.push_back({"gpt_step_np2", np2.ours.median(), np2.peer_median(), "ms", "ratio <= 0.6",
                      fmt::format("DDP vs PyTorch DDP gloo, {}; {}; {}", shape(" per rank"), np2.note("ms"), loss2)});
      rows.push_back({"gpt_mp_bf16_step", mp.ours.median(), mp.peer_median(), "ms", "report",
                      fmt::format("DDP mixed precision bf16; peer column: our f32 np2 step; {}; bf16 {}", mp.note("ms"),
                                  loss_mp)});

      if (gpt_runs > 0) {
        Paired val;
        bench::Samples ours_s, peer_s, ours_last, peer_last;  // seconds; the last step's training loss
        for (int r = 0; r < gpt_runs; ++r) {
          std::optional<double> ours, peer;
          if (auto f = run_gpt_main_job(
                  fmt::format("{} {} --model gpt --progress lines 2>&1", bench::mpirun_prefix(2), train))) {
            ours = f->val_loss;
            ours_s.add(f->seconds);
            ours_last.add(f->train_loss);
          }
          if (peer_ok)
            if (auto j = peer_gpt(2, kGptRecipe.steps, true)) {
              peer = (*j)["val_loss"].get<double>();
              peer_s.add((*j)["train_s"].get<double>());
              peer_last.add((*j)["loss"].get<double>());
              torch_version = (*j)["version"].get<std::string>();
            }
          val.round(ours, peer);
        }
        const double diff = val.ours.median() - val.peer_median().value_or(NAN);
        // The main job's time includes its ~10 evaluations and its sample; the peer's is training only.
        rows.push_back({"gpt_val_loss", diff, std::nullopt, "nats", "<= +0.02",
                        fmt::format("{} steps, np2, {} validation windows: {}; last step's training loss ours {}, "
                                    "peer {}; time ours {} s (with its evaluations and sample), peer {} s",
                                    kGptRecipe.steps, kGptRecipe.eval_windows, val.note("nats"), ours_last.str(),
                                    peer_last.str(), ours_s.str(3), peer_s.str(3))});
      }
    }
    fs::remove_all(tmp);
    if (!torch_version.empty() && !json) fmt::print("PyTorch {}; one intra-op thread per process\n", torch_version);
    bench::print_rows(rows, json);
    return 0;
  } catch (const Error& e) {
    fmt::print(stderr, "bench_train: {}\n", e.what());
    return 2;
  }
}
