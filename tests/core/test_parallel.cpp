// parallel_for (core/parallel.h) and the kernels that use it: every index once, errors back on the
// caller, and the same bits at one thread as at several.
#include <catch2/catch.hpp>

#include <atomic>
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
    std::atomic<int> chunks{0};
    std::atomic<int64_t> shortest{INT64_MAX};
    parallel_for(n, 50, [&](int64_t begin, int64_t end) {
      REQUIRE(begin < end);
      ++chunks;
      int64_t len = end - begin, s = shortest.load();
      while (len < s && !shortest.compare_exchange_weak(s, len)) {
      }
      for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
    });
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
  // Nested loops run serially inside the outer chunk (no second team).
  std::atomic<int> inner_chunks{0};
  parallel_for(400, 100, [&](int64_t, int64_t) { parallel_for(400, 100, [&](int64_t, int64_t) { ++inner_chunks; }); });
  REQUIRE(inner_chunks >= 1);
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
