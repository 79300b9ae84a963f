// A DDP training job for the flight recorder's tests (tests/dist/check_flight.sh runs it under
// `mpirun -np 4` with TANDEM_FLIGHT_RECORDER set, then reads the dumps with flight_report). Each
// step trains a small MLP with DDP (three buckets) and averages the loss over the ranks (a
// collective tagged "loss average"); after kFaultStep steps one rank misbehaves:
//
//   flight_rank clean   nobody: the dumps at exit agree
//   flight_rank skip    rank 3 skips bucket 0's allreduce (its comm hook returns at once)
//   flight_rank size    rank 2 averages a loss of 1000 elements where the others average 1
//   flight_rank stop    rank 1 stops itself (SIGSTOP): the others time out
//   flight_rank usr1    every rank sends itself SIGUSR1 and waits for its dump to appear
//   flight_rank join    under a dist::Join, rank 3 runs out of data after kFaultStep steps while
//                       the loop averages the loss every step: its announcement meets the others'
//                       loss average
//
// Every rank catches its error, prints "flight_rank (rank R): <what>" and returns 3.
#include <fmt/format.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "dist/dist.h"
#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;

namespace {

constexpr int kSteps = 20;
constexpr int kFaultStep = 8;

// SIGUSR1: the dump appears in the background (the recorder's signal thread writes it).
bool wait_for_signal_dump(int rank) {
  const std::string path = fmt::format("{}/tandem_flight_rank{}.json", dist::flight_recorder_dir(), rank);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < until) {
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find("\"reason\": \"SIGUSR1\"") != std::string::npos) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int run(const std::string& mode, dist::ProcessGroupPtr world) {
  const int rank = world->rank();
  manual_seed(7);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(16, 16));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(16, 16));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(16, 16));
  // About one Linear layer (272 floats) per bucket.
  dist::DistributedDataParallel ddp(model, world, {.bucket_cap_mb = 1100.0 / (1 << 20)});
  int step = 0;
  if (mode == "skip" && rank == 3) {
    ddp.register_comm_hook([&step](dist::GradBucket& b) {
      if (step == kFaultStep && b.index == 0) return dist::Work::completed({b.buffer}, "skipped");
      return b.group->allreduce(b.buffer, dist::ReduceOp::avg);
    });
  } else if (mode == "skip") {
    ddp.register_comm_hook([](dist::GradBucket& b) { return b.group->allreduce(b.buffer, dist::ReduceOp::avg); });
  }
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  manual_seed(100 + rank);
  Tensor x = randn({32, 16});
  Tensor y = randint(0, 16, {32});
  if (mode == "join") {
    // A PyTorch-style loop with a per-step loss average inside the Join: what its rule forbids.
    dist::Join join({&ddp});
    const int steps = rank == 3 ? kFaultStep : kSteps;
    for (step = 0; step < steps; ++step) {
      opt.zero_grad(true);
      Tensor loss = nn::cross_entropy(ddp(x), y);
      loss.backward();
      opt.step();
      Tensor avg = loss.detach().reshape({1}).clone();
      dist::CollectiveTag tag("loss average");
      world->allreduce(avg, dist::ReduceOp::avg)->wait();
    }
    join.join();
    std::printf("flight_rank (rank %d): trained %d steps\n", rank, steps);
    return 0;
  }
  for (step = 0; step < kSteps; ++step) {
    if (step == kFaultStep && mode == "stop" && rank == 1) {
      std::fprintf(stderr, "flight_rank (rank %d): stopping itself (SIGSTOP) before step %d\n", rank, step);
      std::fflush(stderr);
      std::raise(SIGSTOP);
    }
    if (step == kFaultStep && mode == "usr1") {
      std::raise(SIGUSR1);
      if (!wait_for_signal_dump(rank)) fail("[flight_rank] rank {}: no dump 10 s after SIGUSR1", rank);
      std::printf("flight_rank (rank %d): dumped on SIGUSR1\n", rank);
    }
    opt.zero_grad(true);
    Tensor loss = nn::cross_entropy(ddp(x), y);
    loss.backward();
    opt.step();
    const bool odd = mode == "size" && rank == 2 && step == kFaultStep;
    Tensor avg = odd ? full({1000}, loss.item<float>()) : loss.detach().reshape({1}).clone();
    dist::CollectiveTag tag("loss average");
    world->allreduce(avg, dist::ReduceOp::avg)->wait();
  }
  std::printf("flight_rank (rank %d): trained %d steps\n", rank, kSteps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "clean" && mode != "skip" && mode != "size" && mode != "stop" && mode != "usr1" && mode != "join") {
    std::fputs("usage: flight_rank clean|skip|size|stop|usr1|join   (under mpirun -np 4)\n", stderr);
    return 2;
  }
  int rank = 0;
  try {
    dist::InitOptions init;
    init.backend = "mpi";
    dist::ProcessGroupPtr world = dist::init(init);
    rank = world->rank();
    return run(mode, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flight_rank (rank %d): %s\n", rank, e.what());
    return 3;
  }
}
