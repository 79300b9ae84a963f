// parallel_for (core/parallel.h) and the kernels that use it: every index once, errors back on the
// caller, and the same bits at one thread as at several.
#include <catch2/catch.hpp>

#include <functional>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "tandem.h"

using namespace tandem;

namespace {

// Restores the thread count a test changed.
struct ThreadCount {
  int saved = get_num_threads();
  explicit ThreadCount(int n) { set_num_threads(n); }
  ~ThreadCount() { set_num_threads(saved); }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.is_contiguous() && b.is_contiguous() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), static_cast<size_t>(a.nbytes())) == 0;
}

}  // namespace

TEST_CASE("parallel_for covers every index once, in chunks of at least the grain", "[parallel]") {
  if (!intra_op_parallel())
    WARN("parallel_for runs serially here (no OpenMP, or OpenBLAS's pthread build is loaded): chunks are not checked");
  ThreadCount threads(4);
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{99}, int64_t{100}, int64_t{1000}, int64_t{100003}}) {
    INFO("n " << n);
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    std::atomic<int> chunks{0}, empty_chunks{0};
    std::atomic<int64_t> shortest{INT64_MAX};
    // Catch2's assertions are not thread-safe: the chunks only count, the checks come after.
    parallel_for(n, 50, [&](int64_t begin, int64_t end) {
      if (begin >= end) ++empty_chunks;
      ++chunks;
      int64_t len = end - begin, s = shortest.load();
      while (len < s && !shortest.compare_exchange_weak(s, len)) {
      }
      for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
    });
    REQUIRE(empty_chunks == 0);
    for (int64_t i = 0; i < n; ++i) REQUIRE(hits[static_cast<size_t>(i)] == 1);
    if (n < 100 || !intra_op_parallel()) {
      REQUIRE(chunks == (n > 0 ? 1 : 0));  // under two grains (or no pool): one serial call
    } else {
      REQUIRE(shortest >= 50);
      REQUIRE(chunks > 1);
      REQUIRE(chunks <= 4);
    }
  }
}

TEST_CASE("parallel_for: a chunk's exception reaches the caller after every chunk ended", "[parallel]") {
  ThreadCount threads(3);
  std::atomic<int> ended{0};
  REQUIRE_THROWS_WITH(parallel_for(3000, 100,
                                   [&](int64_t begin, int64_t) {
                                     if (begin == 0) throw Error("[test] chunk 0 failed");
                                     ++ended;
                                   }),
                      "[test] chunk 0 failed");
  // The other chunks (three in all when the pool runs) ran to their end before the rethrow.
  REQUIRE(ended == (intra_op_parallel() ? 2 : 0));
  // Nested loops run serially inside the outer chunk (no second team): one inner call per outer chunk.
  std::atomic<int> outer_chunks{0}, inner_chunks{0};
  parallel_for(400, 100, [&](int64_t, int64_t) {
    ++outer_chunks;
    parallel_for(400, 100, [&](int64_t, int64_t) { ++inner_chunks; });
  });
  REQUIRE(outer_chunks == (intra_op_parallel() ? 3 : 1));
  REQUIRE(inner_chunks == outer_chunks);
}

TEST_CASE("parallel kernels give the same bits at one thread and at several", "[parallel]") {
  manual_seed(5);
  const int64_t n = 3 * kDefaultGrain + 17;  // several chunks and a ragged end
  Tensor a = randn({n}), b = randn({n});
  Tensor h = randn({n}).to(bf16);
  auto compute = [&] {
    std::vector<Tensor> out;
    out.push_back(a + b);
    out.push_back(a * 2.5 - b);
    out.push_back(gelu(a));
    out.push_back(relu(b));
    out.push_back(h.to(f32));
    out.push_back(a.to(bf16));
    out.push_back(a + b.slice(0, 0, 1).expand({n}));  // a broadcast operand
    return out;
  };
  std::vector<Tensor> one, several;
  {
    ThreadCount threads(1);
    one = compute();
  }
  {
    ThreadCount threads(3);
    several = compute();
  }
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result " << i);
    REQUIRE(same_bits(one[i], several[i]));
  }
}

namespace {

// Forwards and input gradients of what `cases` computes, at 1 and at 3 intra-op threads, from
// `seed`: cases call record(y, inputs) for each result, or push plain results to out.
struct Results {
  std::vector<Tensor> out;
  void record(const Tensor& y, const std::vector<Tensor>& inputs) {
    out.push_back(y.detach().contiguous());
    sum(y * randn(y.shape())).backward();
    for (const Tensor& t : inputs) out.push_back(t.grad().contiguous());
  }
};

void require_same_bits_at_1_and_3_threads(uint64_t seed, const std::function<void(Results&)>& cases) {
  auto run = [&](int threads_n) {
    ThreadCount threads(threads_n);
    manual_seed(seed);
    Results r;
    cases(r);
    return r.out;
  };
  const std::vector<Tensor> one = run(1), several = run(3);
  REQUIRE(one.size() == several.size());
  for (size_t i = 0; i < one.size(); ++i) {
    INFO("result " << i);
    REQUIRE(same_bits(one[i], several[i]));
  }
}

}  // namespace

TEST_CASE("reductions, strided elementwise ops, copies, dropout, embedding and average pooling give the same bits "
          "at one thread and at several", "[parallel]") {
  // Each case is split into several chunks at 3 threads: reductions by output element (and the
  // leading-dims column sum by column block), strided and broadcast operands by runs, embedding
  // rows by index (its backward by column block), pooling by plane. Every forward and input
  // gradient is compared.
  require_same_bits_at_1_and_3_threads(23, [](Results& r) {
    Tensor a = randn({600, 300}).requires_grad_();
    r.record(sum(a, {1}), {a});                       // row sums: a slice per output element
    r.record(sum(a, {0}), {a});                       // leading dim: column blocks
    r.record(mean(a.transpose(0, 1), {1}), {a});      // strided slices
    r.record(var(a, {1}), {a});
    r.record(std::get<0>(max(a, 1)), {a});
    Tensor t3 = randn({40, 300, 30}).requires_grad_();
    r.record(sum(t3, {0, 2}), {t3});                  // reduced dims that do not coalesce: gathered slices
    r.record(logsumexp(a, {1}), {a});
    Tensor b = randn({300, 600}).requires_grad_(), c = randn({600}).requires_grad_();
    r.record(a * b.transpose(0, 1) + c.slice(0, 0, 300).unsqueeze(0).expand({600, 300}), {a, b, c});
    r.out.push_back(a.detach().transpose(0, 1).contiguous());       // a strided copy
    Tensor long_run = randn({3 * kDefaultGrain * 2});
    r.out.push_back(tandem::exp(long_run.slice(0, 0, long_run.numel(), 2)));  // one long strided run, in pieces
    r.out.push_back(masked_fill(a.detach().transpose(0, 1), a.detach().transpose(0, 1) > 0.5, 2.0));
    Tensor d = randn({64, 900}).requires_grad_();
    r.record(dropout(d.transpose(0, 1), 0.3, true), {d});
    Tensor table = randn({50, 700}).requires_grad_();
    Tensor ids = randint(0, 50, {400});  // repeated rows: their gradients add up in index order
    r.record(embedding(table, ids), {table});
    Tensor planes = randn({4, 16, 40, 40}).requires_grad_();
    r.record(avg_pool2d(planes, 3, 2, 1), {planes});
    r.record(adaptive_avg_pool2d(planes, {7, 5}), {planes});
  });
}

TEST_CASE("SGD and Adam steps give the same bits at one thread and at several", "[parallel][optim]") {
  auto train = [](int threads_n, bool adam) {
    ThreadCount threads(threads_n);
    manual_seed(9);
    Tensor w = randn({2 * kDefaultGrain + 5}).requires_grad_();
    std::unique_ptr<optim::Optimizer> opt;
    if (adam) {
      opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{w}, optim::AdamWOptions{.lr = 0.01});
    } else {
      opt = std::make_unique<optim::SGD>(std::vector<Tensor>{w}, optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
    }
    for (int step = 0; step < 3; ++step) {
      opt->zero_grad(true);
      sum(w * w * 0.5 + tandem::exp(w * 0.1)).backward();
      opt->step();
    }
    return w.detach().clone();
  };
  for (bool adam : {false, true}) {
    INFO((adam ? "AdamW" : "SGD"));
    REQUIRE(same_bits(train(1, adam), train(3, adam)));
  }
}

TEST_CASE("nn kernels and their gradients give the same bits at one thread and at several", "[parallel]") {
  // Each case is big enough to be split (several grains, several (batch, head) pairs, channels,
  // planes and layer-norm blocks); its forward and every input gradient are compared.
  require_same_bits_at_1_and_3_threads(21, [](Results& r) {
    Tensor a = randn({300, 400}).requires_grad_();
    r.record(softmax(a, 1), {a});
    Tensor a2 = randn({400, 300}).requires_grad_();
    r.record(log_softmax(a2, 0), {a2});
    Tensor x = randn({1000, 96}).requires_grad_(), w = randn({96}).requires_grad_(), b = randn({96}).requires_grad_();
    r.record(layer_norm(x, {96}, w, b), {x, w, b});
    Tensor q = randn({2, 3, 70, 16}).requires_grad_(), k = randn({2, 3, 90, 16}).requires_grad_(),
           v = randn({2, 3, 90, 8}).requires_grad_();
    r.record(scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true), {q, k, v});
    Tensor img = randn({2, 8, 40, 40}).requires_grad_(), kw = randn({16, 8, 3, 3}).requires_grad_();
    r.record(conv2d(img, kw, Tensor(), 1, 1), {img, kw});
    Tensor planes = randn({4, 16, 48, 48}).requires_grad_();
    r.record(max_pool2d(planes, 2), {planes});
  });
}

TEST_CASE("a thread's intra-op cap bounds its chunks; rank threads of run_threads get a share", "[parallel]") {
  ThreadCount threads(4);
  std::atomic<int> chunks{0};
  std::thread capped([&] {
    set_thread_intra_op_cap(2);
    parallel_for(100000, 100, [&](int64_t, int64_t) { ++chunks; });
  });
  capped.join();
  REQUIRE(chunks == (intra_op_parallel() ? 2 : 1));
  REQUIRE(intra_op_threads() == 4);  // the cap was the other thread's
  std::atomic<int> most{0};
  dist::run_threads(2, [&](dist::ProcessGroup&) {
    int mine = intra_op_threads(), seen = most.load();
    while (mine > seen && !most.compare_exchange_weak(seen, mine)) {
    }
  });
  REQUIRE(most == 2);  // 4 threads over 2 ranks
}

TEST_CASE("a forked child runs its kernels on one thread instead of waiting for its parent's pool",
          "[parallel]") {
  // GNU OpenMP's worker threads are not copied by fork(): a parallel region in the child would wait
  // for them forever (as would OpenBLAS's OpenMP GEMMs). The child drops to one thread instead.
  ThreadCount threads(2);
  Tensor a = randn({4 * kDefaultGrain});
  Tensor warm = a + a;  // the parent's team exists now
  Tensor g = matmul(randn({256, 256}), randn({256, 256}));
  const pid_t pid = fork();
  if (pid == 0) {
    const bool ok = (a * 2 + 1).numel() == a.numel() && matmul(g, g).numel() == g.numel() && get_num_threads() == 1;
    _exit(ok ? 0 : 1);
  }
  REQUIRE(pid > 0);
  int status = 0;
  bool ended = false;
  for (int i = 0; i < 300 && !ended; ++i) {  // 30 s
    ended = waitpid(pid, &status, WNOHANG) == pid;
    if (!ended) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!ended) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  REQUIRE(ended);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}
