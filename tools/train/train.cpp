// train: trains a classifier with DistributedDataParallel and reports the test accuracy, or a small
// character-level GPT and reports its validation loss and a sample. Launch it with mpirun (one
// process per CPU socket or GPU); run alone it is a world of one.
//
//   mpirun -np 2 train [--data fashion-mnist|synthetic|text] [--model cnn|mlp|gpt] [--epochs 8 | --steps N]
//                      [--batch 64] [--lr 0.05] [--optimizer sgd|adamw] [--lr-schedule constant|cosine|step]
//                      [--warmup-steps 0] [--weight-decay W] [--clip-grad NORM] [--optimizer-in-backward | --zero]
//                      [--static-graph] [--mixed-precision bf16|f16] [--delay-allreduce PARAM]
//                      [--bucket-cap-mb 25] [--backend auto|mpi|nccl]
//                      [--device cpu|cuda] [--save DIR --save-every N] [--resume DIR|FILE]
//                      [--metrics FILE.jsonl] [--trace FILE.json] [--target 0.915]
//   mpirun -np 2 train --model gpt [--text-file PATH] [--block-size 64] [--n-layer 4] [--n-head 4]
//                      [--n-embd 128] [--dropout 0] [--eval-every N] [--eval-windows 512]
//                      [--sample 500] [--temperature 1] [--top-k 0] [--prompt TEXT]
//   train --resume CKPT --sample-only [--sample 500 ...]
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
// The GPT (--model gpt, which --data text implies; tools/train/models.h): nanoGPT's model on a
// character-level corpus, data::TextDataset (default Debian's fortunes, or --text-file PATH): the
// first 90% of the bytes trains, random windows of --block-size characters; the last 10% is the
// validation split, cut into windows that share no target. Its recipe (kGptRecipe): 4 layers, 4
// heads, 128 dims, context 64, dropout 0; 1200 steps of batch 32 per rank; AdamW (betas 0.9,
// 0.95) at lr 1e-3 with weight decay 0.1 on the matrices and embeddings only, 100 warm-up steps
// then a cosine to 0; the gradients clipped to norm 1 (nn::utils::clip_grad_norm_, after DDP's
// averaging, before the step). About 10 times a run, and at its end, the validation loss (nats per
// character: the mean cross-entropy over --eval-windows windows spread evenly over the split, the
// same windows for any number of ranks, each rank taking every world_size-th) is printed and
// written to the metrics. After training rank 0 prints --sample characters generated from
// --prompt (generate in models.h; its draws seeded from --seed). --sample-only with --resume
// samples from a checkpoint without training: the model's shape and the vocabulary come from it,
// so neither the corpus nor the shape flags are needed.
// --weight-decay and --clip-grad apply to every model (unset, a classifier has the optimizer's
// default decay and no clipping).
//
// --optimizer-in-backward steps each parameter with its own optimizer as soon as DDP has reduced
// its gradient, inside backward: the loop then calls neither zero_grad() nor step(), and the
// gradients cannot be clipped (--clip-grad is 0 with it; asking for more is refused).
// --zero shards the optimizer's state across the ranks (dist::ZeroRedundancyOptimizer, ZeRO stage 1):
// the same parameters as without it; its checkpoint holds the whole state (consolidated on rank 0)
// in the plain optimizer's format, so a run saved at N ranks resumes at M, with --zero or without
// (tests/tools/check_train_zero.sh).
// --delay-allreduce PARAM (repeatable, or comma-separated) takes the parameter out of DDP's
// buckets into an allreduce of its own (DdpOptions::delay_all_reduce_named_params), hooked to the
// GPT's first block's first parameter (blocks.0.ln_1.weight), or for a classifier to its first
// parameter not delayed: `--delay-allreduce wte.weight` for the GPT's embedding table.
// --static-graph tells DDP the set of parameters that get a gradient never changes.
// --mixed-precision runs forward and backward on bf16/f16 shadows of the f32 parameters and
// reduces the buckets in that dtype; the optimizer steps the f32 masters.
//
// Checkpoints: --save DIR writes DIR/checkpoint-<step>.safetensors every --save-every steps and at
// the end with dist::save_checkpoint (dist/checkpoint.h: every rank calls it, rank 0 writes,
// atomically; the two newest are kept). A checkpoint holds the model ("model."), the optimizer
// ("optimizer.", a --zero run's state consolidated on rank 0) or the optimizers in backward
// ("in_backward.all.", the GPT's "in_backward.decay." and "in_backward.no_decay."), the schedule
// ("lr_scheduler.", with its class in the metadata), the step, the number of ranks that saved it (a
// run resumed at another number starts at the same share of the epoch) and rank 0's generator
// state; and train's own entries under "extra.": "train.position" (step, epoch, batch within the
// epoch) and "train.total_steps", the GPT's also "gpt.config" (vocab_size, block_size, n_layer,
// n_head, n_embd, bias) and "data.vocab" (data::CharVocab::to_tensor()), from which a resumed run
// rebuilds both. --resume takes such a file, or the newest one in a folder, on every rank
// (dist::load_checkpoint: a part that does not fit is an error before anything is restored), and
// continues where it stopped: on the CPU an interrupted and resumed run ends with the same bits as
// an uninterrupted one (tests/tools/check_train_resume.sh). A cosine or step schedule must be
// resumed with the run length it was saved with.
// --metrics FILE.jsonl: rank 0 writes one JSON object per logged step (step, epoch, loss, lr,
// samples_per_s, forward_ms, backward_ms, comm_ms, overlap_ms; accuracy and test_loss on the
// steps that end an epoch; the GPT's val_loss on the steps it evaluates), as tools/train/plot.py
// reads. --trace FILE.json: every rank records a Chrome trace-event timeline, one track per
// thread: each step's forward + loss, autograd's backward, DDP's end-of-backward wait for its
// buckets, the gradient clipping and the optimizer step on the main thread; the collectives on
// the communication thread; each bucket as an async span from its launch to its reduction; the
// loader's batches and any wait for them. Rank 0 merges them into one file that Perfetto
// (ui.perfetto.dev) or chrome://tracing opens.
#include "cli.h"
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <cstdlib>
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

// One line of progress: a bar on a terminal (redrawn in place), plain lines otherwise; the GPT's
// latest validation loss after the training loss once there is one.
void progress(int64_t step, int64_t steps, double loss, std::optional<double> val_loss, double samples_per_s,
              double eta_s, bool tty) {
  const std::string val = val_loss ? fmt::format("{}val {:.4f}", tty ? "  " : " ", *val_loss) : std::string();
  if (tty) {
    int width = 30, filled = static_cast<int>(width * step / std::max<int64_t>(steps, 1));
    std::fprintf(stdout, "\r[%.*s%*s] step %lld/%lld  loss %.4f%s  %.0f samples/s  ETA %.1fs", filled,
                 "##############################", width - filled, "", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, val.c_str(), samples_per_s, eta_s);
    if (step == steps) std::fputc('\n', stdout);
  } else {
    std::fprintf(stdout, "step %lld/%lld loss %.4f%s %.0f samples/s ETA %.1fs\n", static_cast<long long>(step),
                 static_cast<long long>(steps), loss, val.c_str(), samples_per_s, eta_s);
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
  CLI::App app{"Train a classifier with DDP on Fashion-MNIST or a synthetic set, or a character-level GPT on text "
               "(launch with mpirun)",
               "train"};
  std::string data_name = "fashion-mnist", data_root = data::FashionMnistOptions{}.root;
  int64_t hidden = 256, layers = 2, steps = 0, features = 32, classes = 10, train_n = 16384;
  int64_t channels = 32, save_every = 0, log_every = 0;
  double noise = 2.5;
  // Unset, these come from the data set's and model's recipe (tools/train/models.h).
  std::optional<std::string> model_flag, lr_schedule_flag, optimizer_flag;
  std::optional<int64_t> epochs_flag, warmup_flag, batch_flag;
  std::optional<double> lr_flag, weight_decay_flag, clip_grad_flag;
  std::optional<double> target_flag;
  std::optional<double> bucket_cap_mb;
  uint64_t seed = 0;
  std::string backend = "auto", device_name = "cpu";
  std::string save_dir, resume, metrics_path, trace_path;
  std::vector<std::string> delay_allreduce;
  int threads = 0;
  bool drop_last = false, static_graph = false, optimizer_in_backward = false, zero = false;
  std::string mixed_precision = "off";
  std::string progress_style = "auto";
  // The GPT's: its shape (unset: the recipe's, or the checkpoint's when resuming), data, evaluation and sample.
  std::string text_file = data::default_text_corpus_path();
  std::optional<int64_t> block_size_flag, n_layer_flag, n_head_flag, n_embd_flag, eval_every_flag, sample_flag;
  double dropout = kGptRecipe.model.dropout, temperature = 1.0;
  int64_t eval_windows = kGptRecipe.eval_windows, top_k = 0;
  std::string prompt = "\n";
  bool sample_only = false;
  CLI::Option* data_option =
      app.add_option("--data", data_name,
                     "fashion-mnist (Debian's dataset-fashion-mnist), synthetic, or text (the GPT's)")
          ->check(CLI::IsMember({"fashion-mnist", "synthetic", "text"}));
  app.add_option("--data-root", data_root, "folder of the Fashion-MNIST IDX files");
  app.add_option("--model", model_flag,
                 "cnn (two conv + pool blocks; Fashion-MNIST only, its default), mlp, or gpt (a character-level "
                 "transformer on --data text, which it implies)")
      ->check(CLI::IsMember({"cnn", "mlp", "gpt"}));
  app.add_option("--channels", channels, "the CNN's first conv channels (the second has twice as many)")
      ->check(tools::positive);
  app.add_option("--hidden", hidden, "synthetic MLP: hidden width")->check(tools::positive);
  app.add_option("--layers", layers, "synthetic MLP: hidden layers")->check(tools::positive);
  app.add_option("--batch", batch_flag,
                 fmt::format("batch size per rank (default: {}; GPT {} windows)", kFmnistBatch, kGptRecipe.batch))
      ->check(tools::positive);
  auto recipes = [](auto field) {
    return fmt::format("Fashion-MNIST CNN {}, MLP {}; synthetic {}", field(kFmnistCnnRecipe), field(kFmnistMlpRecipe),
                       field(kSyntheticRecipe));
  };
  app.add_option("--epochs", epochs_flag, "epochs, when --steps is not given (default: " +
                                              recipes([](const TrainRecipe& r) { return r.epochs; }) +
                                              "; the GPT counts steps)")
      ->check(tools::positive);
  app.add_option("--steps", steps,
                 fmt::format("optimizer steps (instead of --epochs; GPT default {})", kGptRecipe.steps))
      ->check(tools::positive);
  app.add_option("--lr", lr_flag, "learning rate (default: " + recipes([](const TrainRecipe& r) { return r.lr; }) +
                                      fmt::format("; GPT {})", kGptRecipe.lr))
      ->check(tools::positive);
  app.add_option("--optimizer", optimizer_flag, "sgd (momentum 0.9) or adamw (default: sgd; GPT adamw, betas 0.9/0.95)")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--lr-schedule", lr_schedule_flag,
                 "per step: constant, cosine (to 0 at the last step) or step (x0.1 after each third of the run) "
                 "(default: " + recipes([](const TrainRecipe& r) { return r.lr_schedule; }) +
                     fmt::format("; GPT {}; constant with --optimizer-in-backward)", kGptRecipe.lr_schedule))
      ->check(CLI::IsMember({"constant", "cosine", "step"}));
  app.add_option("--warmup-steps", warmup_flag, "linear warm-up from lr/10 over this many steps first (default: " +
                                                    recipes([](const TrainRecipe& r) { return r.warmup_steps; }) +
                                                    fmt::format("; GPT {})", kGptRecipe.warmup_steps))
      ->check(tools::non_negative);
  app.add_option("--weight-decay", weight_decay_flag,
                 fmt::format("weight decay (GPT: on its matrices and embeddings only, default {}; a classifier: on "
                             "every parameter, default the optimizer's: SGD 0, AdamW 0.01)",
                             kGptRecipe.weight_decay))
      ->check(tools::non_negative);
  app.add_option("--clip-grad", clip_grad_flag,
                 fmt::format("clip the gradients' total norm to this after backward, before the step; 0: off "
                             "(default: GPT {}, classifiers 0; 0 with --optimizer-in-backward, which cannot clip)",
                             kGptRecipe.clip_grad))
      ->check(tools::non_negative);
  app.add_flag("--optimizer-in-backward", optimizer_in_backward,
               "step the --optimizer inside backward, per parameter, after DDP reduced its gradient");
  app.add_flag("--zero", zero,
               "shard the optimizer state across the ranks (ZeroRedundancyOptimizer, ZeRO stage 1); checkpoints "
               "hold the whole state, so they resume at any rank count");
  app.add_flag("--static-graph", static_graph, "DDP static_graph: the same parameters get a gradient every step");
  app.add_option("--mixed-precision", mixed_precision, "DDP mixed precision: bf16, f16 or off (f32 masters either way)")
      ->check(CLI::IsMember({"off", "bf16", "f16"}));
  app.add_option("--delay-allreduce", delay_allreduce,
                 "DDP delay_all_reduce_named_params: reduce this parameter (e.g. wte.weight) in an allreduce of its "
                 "own, hooked to the GPT's first block's first parameter (a classifier's first other parameter); "
                 "repeatable or comma-separated")
      ->delimiter(',');
  app.add_option("--bucket-cap-mb", bucket_cap_mb, "DDP bucket cap in MiB (default 25, first bucket 1)")
      ->check(tools::positive);
  app.add_option("--backend", backend, "process group backend")->check(CLI::IsMember({"auto", "mpi", "nccl"}));
  app.add_option("--device", device_name, "cpu, or cuda (the local rank picks the GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--drop-last", drop_last, "drop each rank's short last batch of an epoch");
  app.add_option("--save", save_dir, "checkpoint folder (rank 0 writes checkpoint-<step>.safetensors)");
  app.add_option("--save-every", save_every, "steps between checkpoints (0: only at the end)")
      ->check(tools::non_negative);
  app.add_option("--resume", resume,
                 "a checkpoint file, or a folder whose newest checkpoint is taken (a GPT's shape and vocabulary come "
                 "from it)");
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
  app.add_option("--seed", seed, "seed for data, initialisation and shuffling (and the GPT's sample)");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks on the node)");
  app.add_option("--target", target_flag,
                 "test accuracy the run must reach, exit status 1 if not (default: CNN 0.915, Fashion-MNIST MLP "
                 "0.885, synthetic 0.95; the GPT has none)")
      ->check(CLI::Range(0.0, 1.0));
  // The GPT's own options: any of them with another model is refused.
  const std::vector<CLI::Option*> gpt_options = {
      app.add_option("--text-file", text_file,
                     "GPT: the corpus, any UTF-8 or ASCII file, or a folder of text files (default: Debian's "
                     "fortunes, " + text_file + ")"),
      app.add_option("--block-size", block_size_flag,
                     fmt::format("GPT: context length in characters (default {})", kGptRecipe.model.block_size))
          ->check(tools::positive),
      app.add_option("--n-layer", n_layer_flag,
                     fmt::format("GPT: transformer blocks (default {})", kGptRecipe.model.n_layer))
          ->check(tools::positive),
      app.add_option("--n-head", n_head_flag, fmt::format("GPT: attention heads (default {})", kGptRecipe.model.n_head))
          ->check(tools::positive),
      app.add_option("--n-embd", n_embd_flag,
                     fmt::format("GPT: embedding width, a multiple of --n-head (default {})", kGptRecipe.model.n_embd))
          ->check(tools::positive),
      app.add_option("--dropout", dropout, "GPT: dropout of embeddings, attention weights and residual branches")
          ->check(CLI::Range(0.0, 0.99)),
      app.add_option("--eval-every", eval_every_flag,
                     "GPT: steps between validation losses (default: about 10 per run; the last step always)")
          ->check(tools::positive),
      app.add_option("--eval-windows", eval_windows,
                     "GPT: validation windows per evaluation, spread evenly over the split and shared out among "
                     "the ranks (0: the whole split)")
          ->check(tools::non_negative),
      app.add_option("--sample", sample_flag,
                     fmt::format("GPT: characters to generate after training (default {}; 0: none)",
                                 kGptRecipe.sample_chars))
          ->check(tools::non_negative),
      app.add_option("--temperature", temperature, "GPT sample: divides the logits (below 1: safer, above: wilder)")
          ->check(tools::positive),
      app.add_option("--top-k", top_k, "GPT sample: draw among the k likeliest characters only (0: all)")
          ->check(tools::non_negative),
      app.add_option("--prompt", prompt, "GPT sample: the text it continues (default a newline)"),
      app.add_flag("--sample-only", sample_only,
                   "GPT: with --resume CKPT, print --sample characters from the checkpoint and exit, training "
                   "nothing (the shape and vocabulary come from the checkpoint; the corpus is not read)"),
  };
  TANDEM_TOOL_PARSE(app, argc, argv);

  // Until dist::init the launcher's environment tells the rank, so an error of the option checks
  // below names the rank that printed it (each rank prints it once).
  int rank = 0;
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* v = std::getenv(var)) {
      rank = std::atoi(v);
      break;
    }
  try {
    // --data text and --model gpt go together, and each implies the other (so does --sample-only).
    if (!model_flag && (sample_only || data_name == "text")) model_flag = "gpt";
    if (model_flag == "gpt" && data_option->count() == 0) data_name = "text";
    const bool fmnist = data_name == "fashion-mnist";
    const std::string model_name = model_flag.value_or(fmnist ? "cnn" : "mlp");
    const bool gpt = model_name == "gpt";
    // The recipe fills what the flags leave out. An optimizer stepped in backward has no schedule.
    const TrainRecipe recipe = !fmnist ? kSyntheticRecipe : model_name == "cnn" ? kFmnistCnnRecipe : kFmnistMlpRecipe;
    const int64_t epochs = epochs_flag.value_or(recipe.epochs);
    const int64_t batch = batch_flag.value_or(gpt ? kGptRecipe.batch : kFmnistBatch);
    const double lr = lr_flag.value_or(gpt ? kGptRecipe.lr : recipe.lr);
    const std::string optimizer = optimizer_flag.value_or(gpt ? "adamw" : "sgd");
    const std::string lr_schedule = lr_schedule_flag.value_or(optimizer_in_backward ? "constant"
                                                              : gpt                 ? kGptRecipe.lr_schedule
                                                                                    : recipe.lr_schedule);
    const int64_t warmup_steps =
        warmup_flag.value_or(optimizer_in_backward ? 0 : gpt ? kGptRecipe.warmup_steps : recipe.warmup_steps);
    const double clip_grad = clip_grad_flag.value_or(gpt && !optimizer_in_backward ? kGptRecipe.clip_grad : 0.0);
    const int64_t sample_chars = sample_flag.value_or(gpt ? kGptRecipe.sample_chars : 0);
    // Fashion-MNIST's own benchmark table lists 91.6% for a two-conv net and 88.3% for an MLP.
    const double target = target_flag ? *target_flag : !fmnist ? 0.95 : model_name == "cnn" ? 0.915 : 0.885;
    TANDEM_CHECK(fmnist || model_name != "cnn", "[train] --model cnn needs --data fashion-mnist (28x28 images)");
    TANDEM_CHECK(gpt == (data_name == "text"),
                 "[train] --model gpt trains on --data text, and only it does (got --model {} with --data {})",
                 model_name, data_name);
    if (!gpt) {
      for (const CLI::Option* o : gpt_options)
        TANDEM_CHECK(o->count() == 0, "[train] {} is the GPT's (--model gpt), not the {}'s", o->get_name(), model_name);
    }
    TANDEM_CHECK(!gpt || !target_flag,
                 "[train] --target is a test accuracy; the GPT reports a validation loss instead");
    TANDEM_CHECK(!optimizer_in_backward || lr_schedule == "constant" && warmup_steps == 0,
                 "[train] --lr-schedule and --warmup-steps need an optimizer the loop steps, not "
                 "--optimizer-in-backward");
    TANDEM_CHECK(!optimizer_in_backward || clip_grad == 0,
                 "[train] --clip-grad needs the gradients before the step: --optimizer-in-backward steps each "
                 "parameter inside backward, so there is nothing left to clip (it runs with --clip-grad 0)");
    TANDEM_CHECK(!(zero && optimizer_in_backward),
                 "[train] --zero and --optimizer-in-backward are two ways to step the optimizer: choose one");
    TANDEM_CHECK(!sample_only || !resume.empty(),
                 "[train] --sample-only samples from a checkpoint: give --resume CKPT");
    TANDEM_CHECK(sample_chars == 0 || !prompt.empty(),
                 "[train] --prompt is empty: the sample needs a character to start from");
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

    // --resume: every rank reads the same file. Its own entries first (the checkpoint's "extra."
    // part), before the model is built: a GPT's shape and vocabulary are in them; the model, the
    // optimizer, the schedule and the generator once they exist, before DDP wraps the module, so
    // DDP's start-up broadcast hands out weights every rank already has.
    std::string resume_file;
    nn::TensorDict resumed;  // the checkpoint's extra entries
    if (!resume.empty()) {
      resume_file = checkpoint_file(resume);
      dist::TrainingState entries;
      entries.rng = false;
      dist::load_checkpoint(resume_file, entries);
      resumed = std::move(entries.extra);
    }

    // The GPT's shape: the flags over the recipe, or the checkpoint's (a shape flag that
    // contradicts it is an error); its vocabulary: the checkpoint's, or the training split's.
    GptConfig gpt_config = kGptRecipe.model;
    std::optional<data::CharVocab> saved_vocab;
    if (gpt) {
      gpt_config.block_size = block_size_flag.value_or(gpt_config.block_size);
      gpt_config.n_layer = n_layer_flag.value_or(gpt_config.n_layer);
      gpt_config.n_head = n_head_flag.value_or(gpt_config.n_head);
      gpt_config.n_embd = n_embd_flag.value_or(gpt_config.n_embd);
      gpt_config.dropout = dropout;
      if (!resume.empty()) {
        const Tensor* config = resumed.find("gpt.config");
        const Tensor* vocab = resumed.find("data.vocab");
        TANDEM_CHECK(config && config->numel() == 6 && vocab,
                     "[train] --resume: '{}' holds no GPT (no gpt.config and data.vocab): it was not saved by train "
                     "--model gpt",
                     resume_file);
        const std::vector<int64_t> c = config->to(i64).to_vector<int64_t>();
        auto same = [&](const std::optional<int64_t>& flag, int64_t saved, const char* name) {
          TANDEM_CHECK(!flag || *flag == saved, "[train] --resume: '{}' holds a GPT with {} {}; this run asks for {}",
                       resume_file, name, saved, flag.value_or(0));
        };
        same(block_size_flag, c[1], "--block-size");
        same(n_layer_flag, c[2], "--n-layer");
        same(n_head_flag, c[3], "--n-head");
        same(n_embd_flag, c[4], "--n-embd");
        gpt_config = {.vocab_size = c[0], .block_size = c[1], .n_layer = c[2], .n_head = c[3], .n_embd = c[4],
                      .dropout = dropout, .bias = c[5] != 0};
        saved_vocab = data::CharVocab::from_tensor(*vocab);
        TANDEM_CHECK(saved_vocab->size() == gpt_config.vocab_size,
                     "[train] --resume: '{}' holds a vocabulary of {} ids for a GPT of {}", resume_file,
                     saved_vocab->size(), gpt_config.vocab_size);
      }
    }
    // Rank 0 prints a sample of the GPT: `sample_chars` characters after the prompt, drawn from
    // a generator seeded by --seed, so a checkpoint and a seed always give the same text.
    auto print_sample = [&](Gpt& model, const data::CharVocab& vocab) {
      if (rank != 0 || sample_chars == 0) return;
      manual_seed(train_sample_seed(seed));
      const Tensor ids = generate(model, vocab.encode(prompt).to(device), sample_chars, temperature, top_k);
      std::fprintf(stdout, "sample (%lld characters, temperature %g, top-k %s, seed %llu):\n%s\n",
                   static_cast<long long>(sample_chars), temperature,
                   top_k > 0 ? std::to_string(top_k).c_str() : "off", static_cast<unsigned long long>(seed),
                   vocab.decode(ids).c_str());
      std::fflush(stdout);
    };
    if (sample_only) {
      auto model = make_gpt(gpt_config);
      dist::TrainingState weights{.model = model.get(), .rng = false};
      const dist::CheckpointInfo saved = dist::load_checkpoint(resume_file, weights);
      model->to(device);
      if (rank == 0) {
        std::fprintf(stdout,
                     "train: sampling from %s (GPT %lld layers x %lld heads x %lld, context %lld, vocab %lld, step "
                     "%lld)\n",
                     resume_file.c_str(), static_cast<long long>(gpt_config.n_layer),
                     static_cast<long long>(gpt_config.n_head), static_cast<long long>(gpt_config.n_embd),
                     static_cast<long long>(gpt_config.block_size), static_cast<long long>(gpt_config.vocab_size),
                     static_cast<long long>(saved.step));
      }
      print_sample(*model, *saved_vocab);
      return 0;
    }

    // The data: both splits on the CPU; batches move to the device as the loop takes them. The
    // classifiers' test set, or the GPT's validation windows (stride block_size: no shared target).
    std::shared_ptr<const data::TensorDataset> train_set, test_set;
    std::shared_ptr<const data::TextDataset> text_train, text_val;
    if (gpt) {
      const std::string corpus = data::read_text_corpus(text_file);
      text_train = std::make_shared<const data::TextDataset>(data::TextDataset::from_text(
          corpus, {.block_size = gpt_config.block_size, .vocab = saved_vocab}, text_file));
      text_val = std::make_shared<const data::TextDataset>(
          data::TextDataset::from_text(corpus,
                                       {.block_size = gpt_config.block_size,
                                        .split = data::TextSplit::validation,
                                        .stride = gpt_config.block_size,
                                        .vocab = text_train->vocab()},
                                       text_file));
      gpt_config.vocab_size = text_train->vocab().size();
    } else if (fmnist) {
      data::FashionMnistOptions fo{.root = data_root};
      train_set = std::make_shared<data::FashionMNIST>(data::Split::train, fo);
      test_set = std::make_shared<data::FashionMNIST>(data::Split::test, fo);
      classes = data::FashionMNIST::kClasses;
    } else {
      train_set = std::make_shared<data::TensorDataset>(make_blobs(train_n, features, classes, noise, seed));
      test_set = std::make_shared<data::TensorDataset>(make_blobs(4096, features, classes, noise, seed));
    }
    const std::shared_ptr<const data::Dataset> train_data =
        gpt ? std::shared_ptr<const data::Dataset>(text_train) : std::shared_ptr<const data::Dataset>(train_set);
    data::DataLoader loader(train_data, {.batch_size = batch,
                                         .seed = train_loader_seed(seed),
                                         .drop_last = drop_last,
                                         .num_replicas = world_size,
                                         .rank = rank});
    const int64_t batches_per_epoch = loader.num_batches();
    TANDEM_CHECK(batches_per_epoch > 0, "[train] a rank's shard has {} samples: no batch of {}", loader.num_samples(),
                 batch);
    const int64_t total_steps = steps > 0             ? steps
                                : gpt && !epochs_flag ? kGptRecipe.steps
                                                      : epochs * batches_per_epoch;
    const int64_t eval_every = eval_every_flag.value_or(std::max<int64_t>(1, total_steps / 10));
    // The CNN takes [N, 1, 28, 28]; the images are [N, 28, 28].
    auto prepare = [&](const Tensor& x) { return model_name == "cnn" ? x.unsqueeze(1).to(device) : x.to(device); };

    manual_seed(train_init_seed(seed));
    std::shared_ptr<Gpt> gpt_model;
    std::shared_ptr<nn::Module> model;
    if (gpt) {
      model = gpt_model = make_gpt(gpt_config);
    } else {
      model = !fmnist              ? make_mlp(features, hidden, classes, static_cast<int>(layers))
              : model_name == "cnn" ? make_fmnist_cnn(channels)
                                    : make_fmnist_mlp();
    }
    model->to(device);
    // The optimizer over parameter groups: a classifier's one (with --weight-decay, when given,
    // on all of it); the GPT's two, nanoGPT's: weight decay on the matrices and embeddings, none
    // on the biases and LayerNorms. The loop steps a plain optimizer; in backward each parameter
    // has its own, which must be applied before DDP wraps the module (DDP takes the steps over,
    // to run each after its gradient's reduction).
    auto spec_with = [&](std::optional<double> weight_decay) -> optim::OptimizerSpec {
      if (optimizer == "sgd") {
        optim::SGDOptions o{.lr = lr, .momentum = kSgdMomentum};
        if (weight_decay) o.weight_decay = *weight_decay;
        return o;
      }
      optim::AdamWOptions o{.lr = lr};
      if (gpt) {
        o.beta1 = kGptRecipe.beta1;
        o.beta2 = kGptRecipe.beta2;
      }
      if (weight_decay) o.weight_decay = *weight_decay;
      return o;
    };
    struct Group {
      std::string name;  // of its in-backward optimizers' part in a checkpoint ("in_backward.<name>.")
      TensorList params;
      optim::OptimizerSpec spec;
    };
    std::vector<Group> groups;
    if (gpt) {
      const GptParamGroups split = gpt_param_groups(*model);
      const double weight_decay = weight_decay_flag.value_or(kGptRecipe.weight_decay);
      groups.push_back({"decay", split.decay, spec_with(weight_decay)});
      groups.push_back({"no_decay", split.no_decay, spec_with(0.0)});
    } else {
      groups.push_back({"all", model->parameters(), spec_with(weight_decay_flag)});
    }
    std::unique_ptr<optim::Optimizer> opt;
    std::vector<std::pair<std::string, std::shared_ptr<optim::InBackwardOptimizers>>> in_backward;
    if (optimizer_in_backward) {
      for (const Group& g : groups)
        in_backward.emplace_back(g.name, optim::apply_optimizer_in_backward(g.spec, g.params));
    } else if (zero) {
      std::vector<dist::ZeroParamGroup> zero_groups;
      for (const Group& g : groups) zero_groups.push_back({g.params, g.spec});
      opt = std::make_unique<dist::ZeroRedundancyOptimizer>(std::move(zero_groups), world);
    } else if (optimizer == "sgd") {
      std::vector<optim::SGD::Group> sgd_groups;
      for (const Group& g : groups) sgd_groups.push_back({g.params, std::get<optim::SGDOptions>(g.spec)});
      opt = std::make_unique<optim::SGD>(std::move(sgd_groups));
    } else {
      std::vector<optim::AdamW::Group> adamw_groups;
      for (const Group& g : groups) adamw_groups.push_back({g.params, std::get<optim::AdamWOptions>(g.spec)});
      opt = std::make_unique<optim::AdamW>(std::move(adamw_groups));
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

    // What a checkpoint holds besides train's own entries: the model, the optimizer (a ZeRO's state
    // consolidated on rank 0) or the optimizers in backward, the schedule, the step and the generator.
    auto training_state = [&] {
      dist::TrainingState state{.model = model.get(), .optimizer = opt.get(), .scheduler = schedule.get()};
      for (const auto& [name, group] : in_backward) state.in_backward.emplace_back(name, group.get());
      return state;
    };

    Position pos;
    if (!resume.empty()) {
      const std::string& file = resume_file;
      // Train's own entries are checked before anything is restored.
      const Tensor* position = resumed.find("train.position");
      TANDEM_CHECK(position && position->numel() == 3,
                   "[train] --resume: '{}' is not a train checkpoint (no train.position)", file);
      // A cosine or step schedule is shaped by the run's length, which its state does not hold:
      // resumed with another --steps/--epochs, it would go on along another curve than the one it
      // started on (and not end with the uninterrupted run's weights).
      if (const Tensor* horizon = resumed.find("train.total_steps"); horizon && lr_schedule != "constant") {
        const int64_t saved = horizon->to(i64).item<int64_t>();
        TANDEM_CHECK(saved == total_steps,
                     "[train] --resume: '{}' was saved by a run of {} steps whose --lr-schedule {} spans them; "
                     "this run has {} steps: give the same --steps or --epochs",
                     file, saved, lr_schedule, total_steps);
      }
      dist::TrainingState state = training_state();
      const dist::CheckpointInfo saved = dist::load_checkpoint(file, state);
      auto p = position->to(i64).to_vector<int64_t>();
      pos = {p[0], p[1], p[2]};
      // Saved at another number of ranks, the position within the epoch counts other batches: the
      // same share of the epoch's samples here (rounded up; at its end, the next epoch).
      if (saved.world_size != world_size && pos.batch > 0) {
        const int64_t samples = pos.batch * saved.world_size;
        pos.batch = std::min<int64_t>(batches_per_epoch, (samples + world_size - 1) / world_size);
        if (rank == 0)
          std::fprintf(stdout, "train: saved at %d ranks, resumed at %d: batch %lld of the epoch here\n",
                       saved.world_size, world_size, static_cast<long long>(pos.batch));
      }
      if (pos.batch >= batches_per_epoch) pos = {pos.step, pos.epoch + 1, 0};
      if (rank == 0)
        std::fprintf(stdout, "train: resumed from %s at step %lld (epoch %lld, batch %lld)\n", file.c_str(),
                     static_cast<long long>(pos.step), static_cast<long long>(pos.epoch),
                     static_cast<long long>(pos.batch));
    }
    auto save = [&](const Position& next) {
      TANDEM_TRACE_SCOPE("checkpoint", "train");
      dist::TrainingState state = training_state();
      state.step = next.step;
      state.extra.insert("train.position", from_vector<int64_t>({next.step, next.epoch, next.batch}));
      state.extra.insert("train.total_steps", from_vector<int64_t>({total_steps}));
      if (gpt) {
        const GptConfig& c = gpt_config;
        state.extra.insert("gpt.config", from_vector<int64_t>({c.vocab_size, c.block_size, c.n_layer, c.n_head,
                                                               c.n_embd, c.bias ? 1 : 0}));
        state.extra.insert("data.vocab", text_train->vocab().to_tensor());
      }
      char name[64];
      std::snprintf(name, sizeof name, "checkpoint-%08lld.safetensors", static_cast<long long>(next.step));
      // Collective: rank 0 writes (creating the folder), and no rank runs ahead of the file.
      dist::save_checkpoint((fs::path(save_dir) / name).string(), state, world);
      if (rank == 0) {
        // Keep the two newest: an older one is what a crash during the next save falls back on.
        std::vector<fs::path> saved;
        for (const auto& e : fs::directory_iterator(save_dir))
          if (e.path().filename().string().starts_with("checkpoint-") && e.path().extension() == ".safetensors")
            saved.push_back(e.path());
        std::sort(saved.begin(), saved.end());
        std::error_code ec;  // a file that cannot go stays; the next save tries again
        for (size_t i = 0; i + 2 < saved.size(); ++i) fs::remove(saved[i], ec);
      }
    };

    dist::DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_cap_mb;
    ddp_options.static_graph = static_graph;
    if (mixed_precision != "off")
      ddp_options.mixed_precision = dist::MixedPrecision{.param_dtype = mixed_precision == "bf16" ? bf16 : f16};
    if (!delay_allreduce.empty()) {
      // The hook: the GPT's first block's first parameter, whose gradient is among the last of a
      // backward, as the embeddings' are; a classifier's first parameter that is not delayed.
      const std::vector<std::string> names = model->named_parameters().keys();
      auto delayed = [&](const std::string& n) {
        return std::find(delay_allreduce.begin(), delay_allreduce.end(), n) != delay_allreduce.end();
      };
      auto hook = std::find_if(names.begin(), names.end(), [&](const std::string& n) {
        return gpt ? n.starts_with("blocks.0.") : !delayed(n);
      });
      ddp_options.delay_all_reduce_named_params = delay_allreduce;
      ddp_options.param_to_hook_all_reduce = hook != names.end() ? *hook : names.front();
    }
    dist::DistributedDataParallel ddp(model, world, ddp_options);
    if (rank == 0) {
      std::string modes = fmt::format("{}{}{}{}", zero ? "; ZeRO-1 sharded optimizer state" : "",
                                      static_graph ? "; static graph" : "",
                                      mixed_precision != "off" ? "; mixed precision " + mixed_precision : "",
                                      delay_allreduce.empty()
                                          ? std::string()
                                          : fmt::format("; delayed allreduce of {} (hooked to {})",
                                                        fmt::join(delay_allreduce, ", "),
                                                        ddp_options.param_to_hook_all_reduce));
      if (gpt) {
        int64_t n_params = 0;
        for (const Tensor& p : model->parameters()) n_params += p.numel();
        const GptConfig& c = gpt_config;
        std::fprintf(stdout, "%s\n",
                     fmt::format("train: {} rank{} ({}, {}); text {}, {} training / {} validation characters, "
                                 "vocab {}; GPT {} layers x {} heads x {}, context {}, {:.2f}M parameters; batch {} "
                                 "per rank, {} steps, {}{} lr {:g} ({}, {} warm-up steps), weight decay {:g}, clip {}{}",
                                 world_size, world_size == 1 ? "" : "s", info.backend, device.str(), text_file,
                                 text_train->split_bytes(), text_val->split_bytes(), c.vocab_size, c.n_layer, c.n_head,
                                 c.n_embd, c.block_size, static_cast<double>(n_params) / 1e6, batch, total_steps,
                                 optimizer, optimizer_in_backward ? " in backward" : "", lr, lr_schedule, warmup_steps,
                                 weight_decay_flag.value_or(kGptRecipe.weight_decay),
                                 clip_grad > 0 ? fmt::format("{:g}", clip_grad) : std::string("off"), modes)
                         .c_str());
      } else {
        std::fprintf(stdout,
                     "train: %d rank%s (%s, %s); %s, %lld samples; %s; batch %lld per rank, %lld steps "
                     "(%lld per epoch), %s%s lr %g (%s)%s\n",
                     world_size, world_size == 1 ? "" : "s", info.backend.c_str(), device.str().c_str(),
                     data_name.c_str(), static_cast<long long>(train_set->size()),
                     !fmnist ? fmt::format("MLP {}x{}", layers, hidden).c_str()
                     : model_name == "cnn" ? fmt::format("CNN {}/{} channels", channels, 2 * channels).c_str()
                                           : "MLP 784-256-128-10",
                     static_cast<long long>(batch), static_cast<long long>(total_steps),
                     static_cast<long long>(batches_per_epoch), optimizer.c_str(),
                     optimizer_in_backward ? " in backward" : "", lr, lr_schedule.c_str(), modes.c_str());
      }
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
    // The GPT's validation loss in nats per character: the mean cross-entropy over --eval-windows
    // windows spread evenly over the split (all of them for 0), rank r taking every
    // world_size-th, in batches of --batch; the sums are added up across the ranks, so every
    // rank gets the same figure, and any number of ranks evaluates the same windows.
    auto evaluate_text = [&]() -> double {
      TANDEM_TRACE_SCOPE("evaluate", "train");
      NoGradGuard ng;
      model->eval();
      const int64_t total = text_val->size();
      const int64_t n = eval_windows > 0 ? std::min(eval_windows, total) : total;
      std::vector<int64_t> mine;
      for (int64_t i = rank; i < n; i += world_size) mine.push_back(i * total / n);
      double loss_sum = 0, count = 0;
      for (size_t first = 0; first < mine.size(); first += static_cast<size_t>(batch)) {
        const size_t k = std::min<size_t>(static_cast<size_t>(batch), mine.size() - first);
        TensorList b = text_val->get_batch(std::span<const int64_t>(mine.data() + first, k));
        loss_sum += gpt_loss((*model)(prepare(b[0])), b[1].to(device), nn::Reduction::sum).item<double>();
        count += static_cast<double>(b[1].numel());
      }
      model->train();
      Tensor sums = from_vector<double>({loss_sum, count}).to(ctrl);
      world->allreduce(sums, dist::ReduceOp::sum)->wait();
      auto v = sums.to(kCPU).to_vector<double>();
      return v[0] / v[1];
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
    std::optional<double> val_loss;  // the GPT's latest
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
            loss = gpt ? gpt_loss(logits, yb) : nn::cross_entropy(logits.dtype() == f32 ? logits : logits.to(f32), yb);
          }
          // Autograd's "backward" span: DDP's buckets launch inside it and its wait ends it. Under
          // --optimizer-in-backward every parameter is stepped there and its .grad set to none.
          loss.backward();
          if (clip_grad > 0) {  // on the gradients DDP has averaged, the same on every rank
            TANDEM_TRACE_SCOPE("clip gradients", "train");
            nn::utils::clip_grad_norm_(model->named_parameters(), clip_grad);
          }
          if (opt) {
            TANDEM_TRACE_SCOPE("optimizer step", "train");
            opt->step();
          }
          if (schedule) schedule->step();
        }
        ++pos.step;
        pos.batch = b + 1;
        const bool epoch_done = pos.batch == batches_per_epoch;
        const bool evaluates = gpt ? pos.step % eval_every == 0 || pos.step == total_steps
                                   : epoch_done || pos.step == total_steps;
        const bool log = pos.step % report_every == 0 || pos.step == total_steps || epoch_done || evaluates;
        std::optional<std::pair<double, double>> eval;
        if (log) {
          Tensor l = loss.detach().to(f64).reshape({1}).to(ctrl);
          world->allreduce(l, dist::ReduceOp::avg)->wait();
          loss_value = l.to(kCPU).item<double>();
        }
        if (evaluates && gpt) {
          val_loss = evaluate_text();
        } else if (evaluates) {
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
            progress(pos.step, total_steps, loss_value, val_loss, rate,
                     (now - t0) / pos.step * (total_steps - pos.step), tty);
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
            if (evaluates && gpt) row["val_loss"] = *val_loss;
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
    // Resumed at the very end: nothing was evaluated yet.
    if (gpt && !val_loss) val_loss = evaluate_text();
    if (!gpt && accuracy < 0) std::tie(test_loss, accuracy) = evaluate();
    const double elapsed = now_s() - t0;
    if (rank == 0) {
      if (gpt) {
        std::fprintf(stdout, "final: train loss %.4f, validation loss %.4f nats per character (%.3f bits) in %.2fs\n",
                     loss_value, *val_loss, *val_loss / std::log(2.0), elapsed);
      } else {
        std::fprintf(stdout, "final: train loss %.4f, test loss %.4f, test accuracy %.2f%% (target %.2f%%) in %.2fs",
                     loss_value, test_loss, accuracy * 100, target * 100, elapsed);
        if (reached_s)
          std::fprintf(stdout, "; time to accuracy %.1fs\n", *reached_s);
        else
          std::fputs("; target not reached\n", stdout);
      }
      std::fprintf(stdout, "loader wait: %.2fs (%.2f%% of the run)\n", wait_s, 100 * wait_s / std::max(elapsed, 1e-9));
      std::fputs(ddp.stats().str().c_str(), stdout);
    }
    if (gpt) {
      print_sample(*gpt_model, text_train->vocab());
      return 0;
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
