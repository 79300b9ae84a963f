// A small DDP training job in which one rank misbehaves on purpose, between two steps: the
// program behind the fault tests (tests/dist/check_faults.sh runs it under mpirun and `timeout`,
// and measures how long the job takes to end).
//
//   mpirun -np N fault_rank stop  [--escape]   the last rank stops itself (SIGSTOP): a hung rank
//   mpirun -np N fault_rank throw [--escape]   the last rank throws: a rank that dies of an error
//   fault_rank threads                         the same throw, with the ranks as threads of this
//                                              process (dist::run_threads)
//
// Every rank catches its error, prints it as "fault_rank (rank R): <what>" and returns 3 from
// main; with --escape the other ranks let theirs leave main instead (std::terminate). Their next
// collective times out after TANDEM_DIST_TIMEOUT (set it small). A correct library ends the whole
// job soon after, with a non-zero status; a job that hangs is the bug these tests catch. (The
// faulting rank always returns: one that aborts makes mpirun end the job at once, which says
// nothing about the other ranks.)
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "dist/dist.h"
#include "nn/nn.h"
#include "tandem.h"

using namespace tandem;

namespace {

constexpr int kSteps = 40;
constexpr int kFaultStep = 10;  // the misbehaving rank trains this many steps first

enum class Fault { stop, raise_error };

// Trains a 16-32-4 MLP with DDP on `group`; the group's last rank faults after kFaultStep steps.
void train(dist::ProcessGroupPtr group, Fault fault) {
  const int rank = group->rank();
  manual_seed(7);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Linear>(16, 32));
  model->push_back(std::make_shared<nn::ReLU>());
  model->push_back(std::make_shared<nn::Linear>(32, 4));
  dist::DistributedDataParallel ddp(model, group);
  optim::SGD opt(model->parameters(), {.lr = 0.05});
  manual_seed(100 + rank);  // each rank its own shard
  Tensor x = randn({32, 16});
  Tensor y = randint(0, 4, {32});
  for (int step = 0; step < kSteps; ++step) {
    if (rank == group->size() - 1 && step == kFaultStep) {
      // Between collectives: the previous step's allreduces are complete on every rank.
      if (fault == Fault::stop) {
        std::fprintf(stderr, "fault_rank (rank %d): stopping itself (SIGSTOP) before step %d\n", rank, step);
        std::fflush(stderr);
        std::raise(SIGSTOP);
      } else {
        fail("[fault_rank] rank {} gives up before step {} (a deliberate error)", rank, step);
      }
    }
    opt.zero_grad(true);
    nn::cross_entropy(ddp(x), y).backward();
    opt.step();
  }
}

int usage() {
  std::fputs("usage: fault_rank stop|throw [--escape]   (under mpirun)\n       fault_rank threads\n", stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string mode = argv[1];
  const bool escape = argc > 2 && std::strcmp(argv[2], "--escape") == 0;
  if (mode != "stop" && mode != "throw" && mode != "threads") return usage();
  if (argc > 2 && !escape) return usage();
  int rank = 0;
  bool faulting_rank = false;
  try {
    if (mode == "threads") {
      // run_threads rethrows the first error, the faulting rank's: print what each peer saw here.
      dist::run_threads(2, [](dist::ProcessGroup& g) {
        try {
          train(dist::ProcessGroupPtr(std::shared_ptr<void>(), &g), Fault::raise_error);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "fault_rank (rank %d): %s\n", g.rank(), e.what());
          throw;
        }
      });
    } else {
      dist::InitOptions init;
      init.backend = "mpi";
      dist::ProcessGroupPtr world = dist::init(init);
      rank = world->rank();
      faulting_rank = rank == world->size() - 1;
      train(world, mode == "stop" ? Fault::stop : Fault::raise_error);
    }
    std::printf("fault_rank (rank %d): trained %d steps\n", rank, kSteps);
    return 0;
  } catch (const std::exception& e) {
    if (escape && !faulting_rank) throw;  // std::terminate: libstdc++ prints what() and aborts
    if (mode != "threads") std::fprintf(stderr, "fault_rank (rank %d): %s\n", rank, e.what());
    return 3;
  }
}
