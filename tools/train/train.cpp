// train: trains a classifier with DistributedDataParallel and reports the test accuracy. Launch
// it with mpirun (one process per CPU socket or GPU); run alone it is a world of one.
//
//   mpirun -np 2 train [--data fashion-mnist|synthetic] [--model cnn|mlp] [--epochs 8 | --steps N]
//                      [--batch 64] [--lr 0.05] [--optimizer sgd|adamw] [--lr-schedule constant|cosine|step]
//                      [--warmup-steps 0] [--optimizer-in-backward] [--static-graph]
//                      [--mixed-precision bf16|f16] [--bucket-cap-mb 25] [--backend auto|mpi|nccl]
//                      [--device cpu|cuda] [--save DIR --save-every N] [--resume DIR|FILE]
//                      [--metrics FILE.jsonl] [--trace FILE.json] [--target 0.915]
//
// The data: Fashion-MNIST from Debian's dataset-fashion-mnist (normalised 28x28 images), or the
// built-in synthetic set (`classes` Gaussian clusters in `features` dims, centres drawn once from
// the seed; a small MLP reaches > 97% on it) that tests use. Every rank reads its own shard of
// each epoch through data::DataLoader (DistributedSampler's seeded shuffle per epoch, padded to
// equal shards as in PyTorch, the next batch prepared on a background thread); --batch is per
// rank, so a step sees batch x ranks samples. The test set is evaluated after every epoch, split
// across the ranks; the first evaluation at or above --target prints the time to accuracy.
// Unless told otherwise, a run follows its model's recipe (tools/train/models.h): on Fashion-MNIST
// the CNN and the MLP train 8 epochs with SGD (momentum 0.9) at lr 0.05 on a cosine schedule,
// which takes the CNN past 91.5% and the MLP past 88.5% at 2 ranks (tools/train.sh is the CNN's
// run).
//
// --optimizer-in-backward steps each parameter with its own optimizer as soon as DDP has reduced
// its gradient, inside backward: the loop then calls neither zero_grad() nor step().
// --static-graph tells DDP the set of parameters that get a gradient never changes.
// --mixed-precision runs forward and backward on bf16/f16 shadows of the f32 parameters and
// reduces the buckets in that dtype; the optimizer steps the f32 masters.
//
// Checkpoints: --save DIR writes DIR/checkpoint-<step>.safetensors every --save-every steps and at
// the end (rank 0 writes, atomically; the two newest are kept): the model under "model.", the
// optimizer under "optimizer.", the schedule under "lr_scheduler.", and "train.position" (step,
// epoch, batch within the epoch), "train.total_steps" and "train.rng" (the generator's seed and
// offset). --resume takes such a file, or the newest one in a folder, on every rank, and
// continues where it stopped: on the CPU an interrupted and resumed run ends with the same bits
// as an uninterrupted one (tests/tools/check_train_resume.sh). A cosine or step schedule must be
// resumed with the run length it was saved with.
// --metrics FILE.jsonl: rank 0 writes one JSON object per logged step (step, epoch, loss, lr,
// samples_per_s, forward_ms, backward_ms, comm_ms, overlap_ms; accuracy and test_loss on the
// steps that end an epoch), as tools/train/plot.py reads. --trace FILE.json: every rank records a
// Chrome trace-event timeline, one track per thread: each step's forward + loss, autograd's
// backward, DDP's end-of-backward wait for its buckets and the optimizer step on the main thread;
// the collectives on the communication thread; each bucket as an async span from its launch to
// its reduction; the loader's batches and any wait for them. Rank 0 merges them into one file
// that Perfetto (ui.perfetto.dev) or chrome://tracing opens.
#include "cli.h"
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <variant>

#include <nlohmann/json.hpp>

#include "core/random.h"
#include "core/trace.h"
#include "data/data.h"
#include "nn/lr_scheduler.h"
#include "tandem.h"
#include "train/models.h"

using namespace tandem;
namespace fs = std::filesystem;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

TensorList make_blobs(int64_t n, int64_t features, int64_t classes, double noise, uint64_t seed) {
  manual_seed(seed);
  Tensor centres = randn({classes, features}) * 2.0;  // same centres for train and test
  manual_seed(seed + 1 + static_cast<uint64_t>(n));
  Tensor y = randint(0, classes, {n});
  Tensor x = index_select(centres, 0, y) + randn({n, features}) * noise;
  return {x, y};
}

// One line of progress: a bar on a terminal (redrawn in place), plain lines otherwise.
void progress(int64_t step, int64_t steps, double loss, double samples_per_s, double eta_s, bool tty) {
  if (tty) {
    int width = 30, filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
    std::fprintf(stdout, "\r[%.*s%*s] step %lld/%lld  loss %.4f  %.0f samples/s  ETA %.1fs", filled,
                 "##############################", width - filled, "", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, samples_per_s, eta_s);
    if (step == steps) std::fputc('\n', stdout);
  } else {
    std::fprintf(stdout, "step %lld/%lld loss %.4f %.0f samples/s ETA %.1fs\n", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, samples_per_s, eta_s);
  }
  std::fflush(stdout);
}

// Where the next batch comes from: the run's step count and the position in the epochs.
struct Position {
  int64_t step = 0, epoch = 0, batch = 0;
};

// The newest checkpoint-<step>.safetensors in dir, or `path` itself when it is a file.
std::string checkpoint_file(const std::string& path) {
  TANDEM_CHECK(fs::exists(path), "[train] --resume: '{}' does not exist", path);
  if (!fs::is_directory(path)) return path;
  std::string best;
  int64_t best_step = -1;
  for (const auto& entry : fs::directory_iterator(path)) {
    const std::string name = entry.path().filename().string();
    long long step = -1;
    if (std::sscanf(name.c_str(), "checkpoint-%lld.safetensors", &step) == 1 && name.ends_with(".safetensors") &&
        step > best_step) {
      best_step = step;
      best = entry.path().string();
    }
  }
  TANDEM_CHECK(!best.empty(), "[train] --resume: no checkpoint-<step>.safetensors in '{}'", path);
  return best;
}

void put_prefixed(nn::TensorDict& out, const std::string& prefix, const nn::TensorDict& part) {
  for (const auto& [name, t] : part) out.insert(prefix + name, t);
}

nn::TensorDict take_prefixed(const nn::TensorDict& all, const std::string& prefix) {
  nn::TensorDict out;
  for (const auto& [name, t] : all)
    if (name.starts_with(prefix)) out.insert(name.substr(prefix.size()), t);
  return out;
}

// Every rank's trace in one file: the JSON texts travel as zero-padded rows of i64 words (8 bytes
// each; there is no u8 dtype) in one allgather.
void write_trace(dist::ProcessGroup& world, Device ctrl, int rank, const std::string& path) {
  const std::string mine = trace::to_json(rank, "rank " + std::to_string(rank));
  Tensor len = from_vector<int64_t>({static_cast<int64_t>(mine.size())}).to(ctrl);
  world.allreduce(len, dist::ReduceOp::max)->wait();
  const int64_t words = len.to(kCPU).item<int64_t>() / 8 + 1;  // room for the terminating zero
  std::vector<int64_t> row(static_cast<size_t>(words), 0);
  std::memcpy(row.data(), mine.data(), mine.size());
  Tensor all = zeros({world.size(), words}, i64).to(ctrl);
  world.allgather_into(all, from_vector(row).to(ctrl))->wait();
  if (rank != 0) return;
  const std::vector<int64_t> gathered = all.to(kCPU).to_vector<int64_t>();
  std::vector<std::string> per_rank;
  for (int r = 0; r < world.size(); ++r)
    per_rank.emplace_back(reinterpret_cast<const char*>(gathered.data() + r * words));
  std::ofstream out(path);
  out << trace::merge_json(per_rank);
  TANDEM_CHECK(out.good(), "[train] --trace: could not write '{}'", path);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a classifier with DDP on Fashion-MNIST or a synthetic set (launch with mpirun)", "train"};
  std::string data_name = "fashion-mnist", data_root = data::FashionMnistOptions{}.root;
  int64_t hidden = 256, layers = 2, batch = kFmnistBatch, steps = 0, features = 32, classes = 10, train_n = 16384;
  int64_t channels = 32, save_every = 0, log_every = 0;
  double noise = 2.5;
  // Unset, these come from the data set's and model's recipe (tools/train/models.h).
  std::optional<std::string> model_flag, lr_schedule_flag;
  std::optional<int64_t> epochs_flag, warmup_flag;
  std::optional<double> lr_flag;
  std::optional<double> target_flag;
  std::optional<double> bucket_cap_mb;
  uint64_t seed = 0;
  std::string optimizer = "sgd", backend = "auto", device_name = "cpu";
  std::string save_dir, resume, metrics_path, trace_path;
  int threads = 0;
  bool drop_last = false, static_graph = false, optimizer_in_backward = false;
  std::string mixed_precision = "off";
  std::string progress_style = "auto";
  app.add_option("--data", data_name, "fashion-mnist (Debian's dataset-fashion-mnist) or synthetic")
      ->check(CLI::IsMember({"fashion-mnist", "synthetic"}));
  app.add_option("--data-root", data_root, "folder of the Fashion-MNIST IDX files");
  app.add_option("--model", model_flag, "cnn (two conv + pool blocks; Fashion-MNIST only, its default) or mlp")
      ->check(CLI::IsMember({"cnn", "mlp"}));
  app.add_option("--channels", channels, "the CNN's first conv channels (the second has twice as many)")
      ->check(tools::positive);
  app.add_option("--hidden", hidden, "synthetic MLP: hidden width")->check(tools::positive);
  app.add_option("--layers", layers, "synthetic MLP: hidden layers")->check(tools::positive);
  app.add_option("--batch", batch, "batch size per rank")->check(tools::positive);
  auto recipes = [](auto field) {
    return fmt::format("Fashion-MNIST CNN {}, MLP {}; synthetic {}", field(kFmnistCnnRecipe), field(kFmnistMlpRecipe),
                       field(kSyntheticRecipe));
  };
  app.add_option("--epochs", epochs_flag, "epochs, when --steps is not given (default: " +
                                              recipes([](const TrainRecipe& r) { return r.epochs; }) + ")")
      ->check(tools::positive);
  app.add_option("--steps", steps, "optimizer steps (instead of --epochs)")->check(tools::positive);
  app.add_option("--lr", lr_flag, "learning rate (default: " + recipes([](const TrainRecipe& r) { return r.lr; }) + ")")
      ->check(tools::positive);
  app.add_option("--optimizer", optimizer, "sgd (momentum 0.9) or adamw")->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--lr-schedule", lr_schedule_flag,
                 "per step: constant, cosine (to 0 at the last step) or step (x0.1 after each third of the run) "
                 "(default: " + recipes([](const TrainRecipe& r) { return r.lr_schedule; }) +
                     "; constant with --optimizer-in-backward)")
      ->check(CLI::IsMember({"constant", "cosine", "step"}));
  app.add_option("--warmup-steps", warmup_flag, "linear warm-up from lr/10 over this many steps first (default: " +
                                                    recipes([](const TrainRecipe& r) { return r.warmup_steps; }) + ")")
      ->check(tools::non_negative);
  app.add_flag("--optimizer-in-backward", optimizer_in_backward,
               "step the --optimizer inside backward, per parameter, after DDP reduced its gradient");
  app.add_flag("--static-graph", static_graph, "DDP static_graph: the same parameters get a gradient every step");
  app.add_option("--mixed-precision", mixed_precision, "DDP mixed precision: bf16, f16 or off (f32 masters either way)")
      ->check(CLI::IsMember({"off", "bf16", "f16"}));
  app.add_option("--bucket-cap-mb", bucket_cap_mb, "DDP bucket cap in MiB (default 25, first bucket 1)")
      ->check(tools::positive);
  app.add_option("--backend", backend, "process group backend")->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_option("--device", device_name, "cpu, or cuda (the local rank picks the GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--drop-last", drop_last, "drop each rank's short last batch of an epoch");
  app.add_option("--save", save_dir, "checkpoint folder (rank 0 writes checkpoint-<step>.safetensors)");
  app.add_option("--save-every", save_every, "steps between checkpoints (0: only at the end)")
      ->check(tools::non_negative);
  app.add_option("--resume", resume, "a checkpoint file, or a folder whose newest checkpoint is taken");
  app.add_option("--metrics", metrics_path, "JSON-lines metrics file (rank 0), for tools/train/plot.py");
  app.add_option("--trace", trace_path, "Chrome trace-event file of every rank's timeline");
  app.add_option("--log-every", log_every, "steps between progress lines and metrics (default: about 10 per run)")
      ->check(tools::non_negative);
  // mpirun hands ranks a pseudo-terminal even when its own output goes to a file, so "auto" can
  // only see what the rank sees: say --progress lines for logs.
  app.add_option("--progress", progress_style, "bar (redrawn in place), lines, or auto (bar on a terminal)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}));
  app.add_option("--features", features, "synthetic: input features")->check(tools::positive);
  app.add_option("--classes", classes, "synthetic: classes")->check(CLI::Range(2, 1000));
  app.add_option("--samples", train_n, "synthetic: training samples")->check(tools::positive);
  app.add_option("--noise", noise, "synthetic: cluster noise (std)")->check(tools::non_negative);
  app.add_option("--seed", seed, "seed for data, initialisation and shuffling");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks on the node)");
  app.add_option("--target", target_flag,
                 "test accuracy the run must reach, exit status 1 if not (default: CNN 0.915, Fashion-MNIST MLP "
                 "0.885, synthetic 0.95)")
      ->check(CLI::Range(0.0, 1.0));
  TANDEM_TOOL_PARSE(app, argc, argv);

  int rank = 0;
  try {
    const bool fmnist = data_name == "fashion-mnist";
    const std::string model_name = model_flag.value_or(fmnist ? "cnn" : "mlp");
    // The recipe fills what the flags leave out. An optimizer stepped in backward has no schedule.
    const TrainRecipe recipe = !fmnist ? kSyntheticRecipe : model_name == "cnn" ? kFmnistCnnRecipe : kFmnistMlpRecipe;
    const int64_t epochs = epochs_flag.value_or(recipe.epochs);
    const double lr = lr_flag.value_or(recipe.lr);
    const std::string lr_schedule = lr_schedule_flag.value_or(optimizer_in_backward ? "constant" : recipe.lr_schedule);
    const int64_t warmup_steps = warmup_flag.value_or(optimizer_in_backward ? 0 : recipe.warmup_steps);
    // Fashion-MNIST's own benchmark table lists 91.6% for a two-conv net and 88.3% for an MLP.
    const double target = target_flag ? *target_flag : !fmnist ? 0.95 : model_name == "cnn" ? 0.915 : 0.885;
    TANDEM_CHECK(fmnist || model_name == "mlp", "[train] --model cnn needs --data fashion-mnist (28x28 images)");
    TANDEM_CHECK(!optimizer_in_backward || lr_schedule == "constant" && warmup_steps == 0,
                 "[train] --lr-schedule and --warmup-steps need an optimizer the loop steps, not "
                 "--optimizer-in-backward");
    if (!trace_path.empty()) trace::start();  // before init: DDP's start-up collectives are on it too
    dist::InitOptions init;
    // A CPU job under a launcher needs no GPU: "auto" would load the CUDA backend to look for one.
    init.backend = backend == "auto" && device_name == "cpu" && dist::launched_by_mpi() ? "mpi" : backend;
    dist::ProcessGroupPtr world = dist::init(init);
    dist::WorldInfo info = dist::world_info();
    rank = info.rank;
    const int world_size = info.size;
    trace::set_thread_name("rank " + std::to_string(rank) + " main");
    const Device device = device_name == "cuda" ? Device::cuda(info.local_rank) : kCPU;
    const Device ctrl = world->control_device(device);  // where small collectives' tensors live
    if (threads > 0) set_num_threads(threads);

    // The data: both splits on the CPU; batches move to the device as the loop takes them.
    std::shared_ptr<const data::TensorDataset> train_set, test_set;
    if (fmnist) {
      data::FashionMnistOptions fo{.root = data_root};
      train_set = std::make_shared<data::FashionMNIST>(data::Split::train, fo);
      test_set = std::make_shared<data::FashionMNIST>(data::Split::test, fo);
      classes = data::FashionMNIST::kClasses;
    } else {
      train_set = std::make_shared<data::TensorDataset>(make_blobs(train_n, features, classes, noise, seed));
      test_set = std::make_shared<data::TensorDataset>(make_blobs(4096, features, classes, noise, seed));
    }
    data::DataLoader loader(train_set, {.batch_size = batch,
                                        .seed = train_loader_seed(seed),
                                        .drop_last = drop_last,
                                        .num_replicas = world_size,
                                        .rank = rank});
    const int64_t batches_per_epoch = loader.num_batches();
    TANDEM_CHECK(batches_per_epoch > 0, "[train] a rank's shard has {} samples: no batch of {}", loader.num_samples(),
                 batch);
    const int64_t total_steps = steps > 0 ? steps : epochs * batches_per_epoch;
    // The CNN takes [N, 1, 28, 28]; the images are [N, 28, 28].
    auto prepare = [&](const Tensor& x) { return model_name == "cnn" ? x.unsqueeze(1).to(device) : x.to(device); };

    manual_seed(train_init_seed(seed));
    std::shared_ptr<nn::Sequential> model = !fmnist              ? make_mlp(features, hidden, classes, static_cast<int>(layers))
                                            : model_name == "cnn" ? make_fmnist_cnn(channels)
                                                                  : make_fmnist_mlp();
    model->to(device);
    // The optimizer: a plain one stepped by the loop, or one per parameter stepped in backward,
    // which must be applied before DDP wraps the module (DDP takes the steps over, to run each
    // after its gradient's reduction).
    const optim::OptimizerSpec spec = optimizer == "sgd"
                                          ? optim::OptimizerSpec{optim::SGDOptions{.lr = lr, .momentum = kSgdMomentum}}
                                          : optim::OptimizerSpec{optim::AdamWOptions{.lr = lr}};
    std::unique_ptr<optim::Optimizer> opt;
    std::shared_ptr<optim::InBackwardOptimizers> in_backward;
    if (optimizer_in_backward) {
      in_backward = optim::apply_optimizer_in_backward(spec, model->parameters());
    } else if (optimizer == "sgd") {
      opt = std::make_unique<optim::SGD>(model->parameters(), std::get<optim::SGDOptions>(spec));
    } else {
      opt = std::make_unique<optim::AdamW>(model->parameters(), std::get<optim::AdamWOptions>(spec));
    }
    // The schedule, per step: warm-up then the chosen decay over the remaining steps.
    std::shared_ptr<optim::LRScheduler> schedule;
    if (opt && (lr_schedule != "constant" || warmup_steps > 0)) {
      const int64_t rest = std::max<int64_t>(1, total_steps - warmup_steps);
      std::shared_ptr<optim::LRScheduler> decay;
      if (lr_schedule == "cosine") decay = std::make_shared<optim::CosineAnnealingLR>(*opt, rest);
      if (lr_schedule == "step") decay = std::make_shared<optim::StepLR>(*opt, std::max<int64_t>(1, rest / 3), 0.1);
      if (!decay) decay = std::make_shared<optim::StepLR>(*opt, std::max<int64_t>(1, rest), 1.0);  // constant
      schedule = warmup_steps == 0
                     ? decay
                     : std::make_shared<optim::SequentialLR>(
                           *opt,
                           std::vector<std::shared_ptr<optim::LRScheduler>>{
                               std::make_shared<optim::LinearLR>(*opt, 0.1, 1.0, warmup_steps), decay},
                           std::vector<int64_t>{warmup_steps});
    }
    auto current_lr = [&] { return schedule ? schedule->last_lr()[0] : lr; };

    // --resume: every rank reads the same file before DDP wraps the module, so DDP's start-up
    // broadcast hands out weights every rank already has.
    Position pos;
    if (!resume.empty()) {
      const std::string file = checkpoint_file(resume);
      nn::TensorDict all = nn::load_safetensors(file);
      const Tensor* position = all.find("train.position");
      const Tensor* rng = all.find("train.rng");
      TANDEM_CHECK(position && position->numel() == 3 && rng && rng->numel() == 2,
                   "[train] --resume: '{}' is not a train checkpoint (no train.position / train.rng)", file);
      model->load_state_dict(take_prefixed(all, "model."));
      if (opt) opt->load_state_dict(take_prefixed(all, "optimizer."));
      if (in_backward) in_backward->load_state_dict(take_prefixed(all, "optimizer."));
      if (schedule) schedule->load_state_dict(take_prefixed(all, "lr_scheduler."));
      auto p = position->to_vector<int64_t>();
      pos = {p[0], p[1], p[2]};
      auto r = rng->to_vector<int64_t>();
      set_rng_state({static_cast<uint64_t>(r[0]), static_cast<uint64_t>(r[1])});
      // A cosine or step schedule is shaped by the run's length, which its state does not hold:
      // resumed with another --steps/--epochs, it would go on along another curve than the one it
      // started on (and not end with the uninterrupted run's weights).
      if (const Tensor* horizon = all.find("train.total_steps"); horizon && lr_schedule != "constant") {
        const int64_t saved = horizon->item<int64_t>();
        TANDEM_CHECK(saved == total_steps,
                     "[train] --resume: '{}' was saved by a run of {} steps whose --lr-schedule {} spans them; "
                     "this run has {} steps: give the same --steps or --epochs",
                     file, saved, lr_schedule, total_steps);
      }
      if (rank == 0)
        std::fprintf(stdout, "train: resumed from %s at step %lld (epoch %lld, batch %lld)\n", file.c_str(),
                     static_cast<long long>(pos.step), static_cast<long long>(pos.epoch),
                     static_cast<long long>(pos.batch));
    }
    auto save = [&](const Position& next) {
      TANDEM_TRACE_SCOPE("checkpoint", "train");
      if (rank == 0) {
        nn::TensorDict all;
        put_prefixed(all, "model.", model->state_dict());
        if (opt) put_prefixed(all, "optimizer.", opt->state_dict());
        if (in_backward) put_prefixed(all, "optimizer.", in_backward->state_dict());
        if (schedule) put_prefixed(all, "lr_scheduler.", schedule->state_dict());
        all.insert("train.position", from_vector<int64_t>({next.step, next.epoch, next.batch}));
        all.insert("train.total_steps", from_vector<int64_t>({total_steps}));
        const PhiloxState rng = get_rng_state();
        all.insert("train.rng", from_vector<int64_t>({static_cast<int64_t>(rng.seed), static_cast<int64_t>(rng.offset)}));
        fs::create_directories(save_dir);
        char name[64];
        std::snprintf(name, sizeof name, "checkpoint-%08lld.safetensors", static_cast<long long>(next.step));
        nn::save_safetensors((fs::path(save_dir) / name).string(), all);
        // Keep the two newest: an older one is what a crash during the next save falls back on.
        std::vector<fs::path> saved;
        for (const auto& e : fs::directory_iterator(save_dir))
          if (e.path().filename().string().starts_with("checkpoint-") && e.path().extension() == ".safetensors")
            saved.push_back(e.path());
        std::sort(saved.begin(), saved.end());
        for (size_t i = 0; i + 2 < saved.size(); ++i) fs::remove(saved[i]);
      }
      world->barrier()->wait();  // no rank runs ahead of a checkpoint it might resume from
    };

    dist::DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_cap_mb;
    ddp_options.static_graph = static_graph;
    if (mixed_precision != "off")
      ddp_options.mixed_precision = dist::MixedPrecision{.param_dtype = mixed_precision == "bf16" ? bf16 : f16};
    dist::DistributedDataParallel ddp(model, world, ddp_options);
    if (rank == 0) {
      std::fprintf(stdout,
                   "train: %d rank%s (%s, %s); %s, %lld samples; %s; batch %lld per rank, %lld steps "
                   "(%lld per epoch), %s%s lr %g (%s)%s%s\n",
                   world_size, world_size == 1 ? "" : "s", info.backend.c_str(), device.str().c_str(),
                   data_name.c_str(), static_cast<long long>(train_set->size()),
                   !fmnist ? fmt::format("MLP {}x{}", layers, hidden).c_str()
                   : model_name == "cnn" ? fmt::format("CNN {}/{} channels", channels, 2 * channels).c_str()
                                         : "MLP 784-256-128-10",
                   static_cast<long long>(batch), static_cast<long long>(total_steps),
                   static_cast<long long>(batches_per_epoch), optimizer.c_str(),
                   optimizer_in_backward ? " in backward" : "", lr, lr_schedule.c_str(),
                   static_graph ? "; static graph" : "",
                   mixed_precision != "off" ? ("; mixed precision " + mixed_precision).c_str() : "");
    }

    // The test set, split across ranks (rank r takes every world_size-th sample), in chunks.
    auto evaluate = [&]() -> std::pair<double, double> {
      TANDEM_TRACE_SCOPE("evaluate", "train");
      NoGradGuard ng;
      model->eval();
      double loss_sum = 0, correct = 0, count = 0;
      std::vector<int64_t> mine;
      for (int64_t i = rank; i < test_set->size(); i += world_size) mine.push_back(i);
      for (size_t first = 0; first < mine.size(); first += 1000) {
        const size_t n = std::min<size_t>(1000, mine.size() - first);
        TensorList b = test_set->get_batch(std::span<const int64_t>(mine.data() + first, n));
        Tensor logits = (*model)(prepare(b[0])), y = b[1].to(device);
        loss_sum += nn::cross_entropy(logits, y, nn::Reduction::sum).item<double>();
        correct += sum(eq(argmax(logits, 1), y).to(f64)).item<double>();
        count += static_cast<double>(n);
      }
      model->train();
      Tensor sums = from_vector<double>({loss_sum, correct, count}).to(ctrl);
      world->allreduce(sums, dist::ReduceOp::sum)->wait();
      auto v = sums.to(kCPU).to_vector<double>();
      return {v[0] / v[2], v[1] / v[2]};
    };

    std::ofstream metrics;
    if (rank == 0 && !metrics_path.empty()) {
      metrics.open(metrics_path, pos.step > 0 ? std::ios::app : std::ios::trunc);
      TANDEM_CHECK(metrics.good(), "[train] --metrics: could not open '{}'", metrics_path);
    }
    const bool tty = progress_style == "bar" || (progress_style == "auto" && isatty(fileno(stdout)));
    const int64_t report_every = log_every > 0 ? log_every : std::max<int64_t>(1, total_steps / (tty ? 100 : 10));
    const double t0 = now_s();
    double last_report_s = t0, loss_value = 0, test_loss = 0, accuracy = -1;
    int64_t last_report_step = pos.step;
    std::optional<double> reached_s;
    double wait_s = 0;  // time the loop waited for the loader
    while (pos.step < total_steps) {
      loader.set_epoch(pos.epoch);
      int64_t b = pos.batch;  // resumed mid-epoch: the batches before were trained on
      double asked = now_s();
      for (auto it = loader.begin_at(pos.batch); it != loader.end() && pos.step < total_steps; ++it, ++b) {
        wait_s += now_s() - asked;
        Tensor loss;
        {
          TANDEM_TRACE_SCOPE("step", "train");
          Tensor xb = prepare((*it)[0]), yb = (*it)[1].to(device);
          if (opt) opt->zero_grad(true);
          {
            TANDEM_TRACE_SCOPE("forward + loss", "train");
            Tensor logits = ddp(xb);  // bf16/f16 under mixed precision: the loss is taken in f32
            loss = nn::cross_entropy(logits.dtype() == f32 ? logits : logits.to(f32), yb);
          }
          // Autograd's "backward" span: DDP's buckets launch inside it and its wait ends it. Under
          // --optimizer-in-backward every parameter is stepped there and its .grad set to none.
          loss.backward();
          if (opt) {
            TANDEM_TRACE_SCOPE("optimizer step", "train");
            opt->step();
          }
          if (schedule) schedule->step();
        }
        ++pos.step;
        pos.batch = b + 1;
        const bool epoch_done = pos.batch == batches_per_epoch;
        const bool log = pos.step % report_every == 0 || pos.step == total_steps || epoch_done;
        std::optional<std::pair<double, double>> eval;
        if (log) {
          Tensor l = loss.detach().to(f64).reshape({1}).to(ctrl);
          world->allreduce(l, dist::ReduceOp::avg)->wait();
          loss_value = l.to(kCPU).item<double>();
        }
        if (epoch_done || pos.step == total_steps) {
          eval = evaluate();
          std::tie(test_loss, accuracy) = *eval;
          if (!reached_s && accuracy >= target) {
            reached_s = now_s() - t0;
            if (rank == 0)
              std::fprintf(stdout, "%sreached %.2f%% test accuracy (target %.2f%%) at epoch %lld, step %lld, after %.1fs\n",
                           tty ? "\n" : "", accuracy * 100, target * 100, static_cast<long long>(pos.epoch + 1),
                           static_cast<long long>(pos.step), *reached_s);
          }
        }
        if (log) {
          const double now = now_s();
          const double rate = static_cast<double>((pos.step - last_report_step) * batch * world_size) /
                              std::max(now - last_report_s, 1e-9);
          if (rank == 0)
            progress(pos.step, total_steps, loss_value, rate, (now - t0) / pos.step * (total_steps - pos.step), tty);
          if (metrics.is_open()) {
            const dist::DdpStats st = ddp.stats();
            nlohmann::json row = {{"step", pos.step},
                                  {"epoch", pos.epoch + (epoch_done ? 1.0 : static_cast<double>(pos.batch) /
                                                                               static_cast<double>(batches_per_epoch))},
                                  {"loss", loss_value},
                                  {"lr", current_lr()},
                                  {"samples_per_s", rate},
                                  {"forward_ms", st.forward_ms},
                                  {"backward_ms", st.backward_compute_ms},
                                  {"comm_ms", st.comm_ms},
                                  {"overlap_ms", st.overlap_ms}};
            if (eval) {
              row["accuracy"] = eval->second;
              row["test_loss"] = eval->first;
            }
            metrics << row.dump() << '\n' << std::flush;
          }
          last_report_s = now;
          last_report_step = pos.step;
        }
        if (epoch_done) pos = {pos.step, pos.epoch + 1, 0};
        if (!save_dir.empty() && save_every > 0 && pos.step % save_every == 0 && pos.step < total_steps) save(pos);
        asked = now_s();
      }
    }
    if (!save_dir.empty()) save(pos);
    if (!trace_path.empty()) {
      trace::stop();
      write_trace(*world, ctrl, rank, trace_path);
    }
    if (accuracy < 0) std::tie(test_loss, accuracy) = evaluate();  // resumed at the very end
    const double elapsed = now_s() - t0;
    if (rank == 0) {
      std::fprintf(stdout, "final: train loss %.4f, test loss %.4f, test accuracy %.2f%% (target %.2f%%) in %.2fs",
                   loss_value, test_loss, accuracy * 100, target * 100, elapsed);
      if (reached_s)
        std::fprintf(stdout, "; time to accuracy %.1fs\n", *reached_s);
      else
        std::fputs("; target not reached\n", stdout);
      std::fprintf(stdout, "loader wait: %.2fs (%.2f%% of the run)\n", wait_s, 100 * wait_s / std::max(elapsed, 1e-9));
      std::fputs(ddp.stats().str().c_str(), stdout);
    }
    return accuracy >= target ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "train (rank %d): %s\n", rank, e.what());
    return 2;
  } catch (const std::exception& e) {  // std::filesystem's errors (a --save folder that cannot be made)
    std::fprintf(stderr, "train (rank %d): %s\n", rank, e.what());
    return 2;
  }
}
