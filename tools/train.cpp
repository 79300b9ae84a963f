// train: trains an MLP classifier with DistributedDataParallel on a built-in synthetic dataset
// and reports the final loss and held-out accuracy. Launch it with mpirun (one process per CPU
// socket or GPU); run alone it is a world of one.
//
//   mpirun -np 2 train [--hidden 256] [--layers 2] [--batch 128] [--steps 600] [--lr 0.05]
//                      [--optimizer sgd|adamw] [--optimizer-in-backward] [--static-graph]
//                      [--mixed-precision bf16|f16]
//                      [--bucket-cap-mb 25] [--backend auto|mpi] [--device cpu|cuda]
//
// Every rank builds the same dataset from the seed and reads its own shard of each epoch through
// a DistributedSampler (seeded shuffle per epoch, padded to equal shards as in PyTorch); --batch
// is per rank, so a step sees batch x ranks samples.
// --optimizer-in-backward steps each parameter with its own optimizer (the --optimizer one, same
// learning rate) as soon as DDP has reduced its gradient, inside backward: the loop then calls
// neither zero_grad() nor step(), and .grad is none between steps. --static-graph tells DDP the
// set of parameters that get a gradient never changes (no per-iteration search).
// --mixed-precision runs forward and backward on bf16/f16 shadows of the f32 parameters and
// reduces the buckets in that dtype; the optimizer steps the f32 masters.
// The data: `classes` Gaussian clusters in `features` dims, centres drawn once from the seed,
// with noise; the classes overlap only slightly, so a small MLP reaches > 97% held-out accuracy.
#include "cli.h"
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <variant>

#include "bench_common.h"
#include "mlp.h"
#include "tandem.h"

using namespace tandem;

namespace {

struct Dataset {
  Tensor x, y;
};

Dataset make_blobs(int64_t n, int64_t features, int64_t classes, double noise, uint64_t seed) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train an MLP with DDP on a built-in synthetic classification set (launch with mpirun)", "train"};
  int64_t hidden = 256, layers = 2, batch = 128, steps = 600, features = 32, classes = 10, train_n = 16384;
  double lr = 0.05, noise = 2.5, target = 0.95;
  std::optional<double> bucket_cap_mb;
  uint64_t seed = 0;
  std::string optimizer = "sgd", backend = "auto", device_name = "cpu";
  int threads = 0;
  bool drop_last = false, static_graph = false, optimizer_in_backward = false;
  std::string mixed_precision = "off";
  std::string progress_style = "auto";
  app.add_option("--hidden", hidden, "hidden width")->check(tools::positive);
  app.add_option("--layers", layers, "hidden layers")->check(tools::positive);
  app.add_option("--batch", batch, "batch size per rank")->check(tools::positive);
  app.add_option("--steps", steps, "optimizer steps")->check(tools::positive);
  app.add_option("--lr", lr, "learning rate")->check(tools::positive);
  app.add_option("--optimizer", optimizer, "sgd (momentum 0.9) or adamw")->check(CLI::IsMember({"sgd", "adamw"}));
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
  app.add_flag("--drop-last", drop_last, "drop the tail of each epoch instead of padding the shards");
  // mpirun hands ranks a pseudo-terminal even when its own output goes to a file, so "auto" can
  // only see what the rank sees: say --progress lines for logs.
  app.add_option("--progress", progress_style, "bar (redrawn in place), lines, or auto (bar on a terminal)")
      ->check(CLI::IsMember({"auto", "bar", "lines"}));
  app.add_option("--features", features, "input features")->check(tools::positive);
  app.add_option("--classes", classes, "classes")->check(CLI::Range(2, 1000));
  app.add_option("--samples", train_n, "training samples")->check(tools::positive);
  app.add_option("--noise", noise, "cluster noise (std)")->check(tools::non_negative);
  app.add_option("--seed", seed, "seed for data, initialisation and shuffling");
  app.add_option("--threads", threads, "intra-op threads per rank (default: cores / ranks on the node)");
  app.add_option("--target", target, "accuracy the run must reach (exit status 1 if not)");
  TANDEM_TOOL_PARSE(app, argc, argv);

  int rank = 0;
  try {
    dist::InitOptions init;
    init.backend = backend;
    dist::ProcessGroupPtr world = dist::init(init);
    dist::WorldInfo info = dist::world_info();
    rank = info.rank;
    const int world_size = info.size;
    const Device device = device_name == "cuda" ? Device::cuda(info.local_rank) : kCPU;
    const Device ctrl = world->control_device(device);  // where small collectives' tensors live
    if (threads > 0) set_num_threads(threads);

    Dataset train = make_blobs(train_n, features, classes, noise, seed);
    Dataset test = make_blobs(4096, features, classes, noise, seed);
    train.x = train.x.to(device);
    train.y = train.y.to(device);
    manual_seed(seed + 7);
    auto model = make_mlp(features, hidden, classes, static_cast<int>(layers));
    model->to(device);
    // The optimizer: a plain one stepped by the loop, or one per parameter stepped in backward,
    // which must be applied before DDP wraps the module (DDP takes the steps over, to run each
    // after its gradient's reduction).
    const optim::OptimizerSpec spec = optimizer == "sgd"
                                          ? optim::OptimizerSpec{optim::SGDOptions{.lr = lr, .momentum = 0.9}}
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
    dist::DdpOptions ddp_options;
    ddp_options.bucket_cap_mb = bucket_cap_mb;
    ddp_options.static_graph = static_graph;
    if (mixed_precision != "off")
      ddp_options.mixed_precision = dist::MixedPrecision{.param_dtype = mixed_precision == "bf16" ? bf16 : f16};
    dist::DistributedDataParallel ddp(model, world, ddp_options);
    dist::DistributedSampler sampler(train_n, world_size, rank, {.seed = seed + 1000, .drop_last = drop_last});
    if (rank == 0) {
      std::fprintf(stdout,
                   "train: %d rank%s (%s, %s); %lld samples, %lld features, %lld classes; MLP %lldx%lld, batch %lld "
                   "per rank, %lld steps, %s%s lr %g%s%s\n",
                   world_size, world_size == 1 ? "" : "s", info.backend.c_str(), device.str().c_str(),
                   static_cast<long long>(train_n), static_cast<long long>(features), static_cast<long long>(classes),
                   static_cast<long long>(layers), static_cast<long long>(hidden), static_cast<long long>(batch),
                   static_cast<long long>(steps), optimizer.c_str(), optimizer_in_backward ? " in backward" : "", lr,
                   static_graph ? "; static graph" : "",
                   mixed_precision != "off" ? ("; mixed precision " + mixed_precision).c_str() : "");
    }
    const bool tty = progress_style == "bar" || (progress_style == "auto" && isatty(fileno(stdout)));
    const int64_t report_every = std::max<int64_t>(1, steps / (tty ? 100 : 10));
    const double t0 = bench::now_s();
    double loss_value = 0;
    std::vector<int64_t> shard;
    size_t cursor = 0;
    for (int64_t step = 1; step <= steps; ++step) {
      if (cursor + static_cast<size_t>(batch) > shard.size()) {  // next epoch: this rank's shard, reshuffled
        sampler.set_epoch(sampler.epoch() + (shard.empty() ? 0 : 1));
        shard = sampler.indices();
        cursor = 0;
        TANDEM_CHECK(shard.size() >= static_cast<size_t>(batch),
                     "[train] a rank's shard has {} samples, fewer than the batch of {}", shard.size(), batch);
      }
      Tensor idx = from_vector(std::vector<int64_t>(shard.begin() + cursor, shard.begin() + cursor + batch)).to(device);
      cursor += static_cast<size_t>(batch);
      Tensor xb = index_select(train.x, 0, idx), yb = index_select(train.y, 0, idx);
      if (opt) opt->zero_grad(true);
      Tensor logits = ddp(xb);  // bf16/f16 under mixed precision: the loss is taken in f32
      Tensor loss = nn::cross_entropy(logits.dtype() == f32 ? logits : logits.to(f32), yb);
      loss.backward();  // in backward: every parameter is stepped here and its .grad set to none
      if (opt) opt->step();
      if (step % report_every == 0 || step == steps) {
        Tensor l = loss.detach().to(f64).reshape({1}).to(ctrl);
        world->allreduce(l, dist::ReduceOp::avg)->wait();
        loss_value = l.to(kCPU).item<double>();
        double elapsed = bench::now_s() - t0;
        if (rank == 0)
          progress(step, steps, loss_value, static_cast<double>(step * batch * world_size) / elapsed,
                   elapsed / step * (steps - step), tty);
      }
    }
    // Held-out evaluation, split across ranks (rank r takes every world_size-th sample).
    NoGradGuard ng;
    model->eval();
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < test.x.size(0); i += world_size) mine.push_back(i);
    Tensor tidx = from_vector(mine);
    Tensor tx = index_select(test.x, 0, tidx).to(device), ty = index_select(test.y, 0, tidx).to(device);
    Tensor logits = (*model)(tx);
    Tensor sums = from_vector<double>({nn::cross_entropy(logits, ty, nn::Reduction::sum).item<double>(),
                                        sum(eq(argmax(logits, 1), ty).to(f64)).item<double>(),
                                        static_cast<double>(mine.size())})
                     .to(ctrl);
    world->allreduce(sums, dist::ReduceOp::sum)->wait();
    auto v = sums.to(kCPU).to_vector<double>();
    double test_loss = v[0] / v[2], accuracy = v[1] / v[2];
    if (rank == 0) {
      std::fprintf(stdout, "final: train loss %.4f, test loss %.4f, test accuracy %.2f%% (target %.0f%%) in %.2fs\n",
                   loss_value, test_loss, accuracy * 100, target * 100, bench::now_s() - t0);
      std::fputs(ddp.stats().str().c_str(), stdout);
    }
    return accuracy >= target ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "train (rank %d): %s\n", rank, e.what());
    return 2;
  }
}
