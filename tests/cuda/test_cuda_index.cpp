// The index family on CUDA against the same ops on the CPU: embedding (forward and the
// deterministic sorted backward), index_select, gather, scatter_add, masked_fill, cat and stack,
// every dtype, contiguous and permuted operands, gradients through autograd, bounds errors (the
// same messages as on the CPU, raised at the next synchronisation: the ops never sync the host)
// and mixed-device errors.
#include <catch2/catch.hpp>

#include <vector>

#include "cuda/detail/device_error.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using Catch::StartsWith;

namespace {

using cuda_test::bits;
using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_bit_equal;
using cuda_test::require_match;

// This file's tolerances: f16 and bf16 looser than the defaults.
constexpr cuda_test::Tolerances tol_for{.f16 = 2e-3, .bf16 = 2e-2};

// The tail of a deferred index error raised by a copy to the host (.to(kCPU)).
constexpr const char* kAtCopy =
    "; detected on cuda:0 at the next synchronisation (a copy to the host), after the op had returned";

Tensor gpu_leaf(const Tensor& cpu_value) {
  Tensor t = cpu_value.to(kGPU);
  t.requires_grad_();
  return t;
}
Tensor cpu_leaf(const Tensor& cpu_value) {
  Tensor t = cpu_value.clone();
  t.requires_grad_();
  return t;
}

}  // namespace

// ---------------------------------------------------------------- embedding

TEST_CASE("cuda embedding: rows for indices of any shape, every dtype, bit for bit", "[cuda][index][embedding]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(11);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    for (int64_t cols : {3, 64, 768}) {  // the generic kernel and the row kernel
      INFO(dt << ", " << cols << " columns");
      Tensor w = random({50, cols}, dt);
      for (Dtype it : {i64, i32}) {
        Tensor idx = randint(0, 50, {4, 7}, it);
        require_bit_equal(embedding(w.to(kGPU), idx.to(kGPU)), embedding(w, idx));
      }
    }
  }
  // A transposed (non-contiguous) weight, non-contiguous indices, a 0-dim index, no indices.
  Tensor idx = transpose(randint(0, 40, {5, 3}), 0, 1);
  Tensor wg = transpose(randn({16, 40}).to(kGPU), 0, 1);
  REQUIRE_FALSE(wg.is_contiguous());
  require_bit_equal(embedding(wg, idx.to(kGPU)), embedding(wg.to(kCPU), idx));
  Tensor w = randn({10, 4});
  Tensor one = from_vector<int64_t>({7}).squeeze();
  require_bit_equal(embedding(w.to(kGPU), one.to(kGPU)), embedding(w, one));
  REQUIRE(embedding(w.to(kGPU), from_vector<int64_t>({}, {0}).to(kGPU)).shape() == Shape{0, 4});
}

TEST_CASE("cuda embedding backward: repeated rows summed in order, deterministic", "[cuda][index][embedding][grad]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(12);
  for (Dtype dt : {f32, f64, f16, bf16}) {
    for (int64_t cols : {5, 256}) {  // one thread per run / one block per run
      INFO(dt << ", " << cols << " columns");
      Tensor w = random({30, cols}, dt);
      Tensor idx = randint(0, 30, {40, 25});  // 1000 lookups of 30 rows: long runs of repeats
      Tensor g = random({40, 25, cols}, dt);
      Tensor wc = cpu_leaf(w), wg = gpu_leaf(w);
      embedding(wc, idx).backward(g);
      embedding(wg, idx.to(kGPU)).backward(g.to(kGPU));
      REQUIRE(wg.grad().defined());
      // f32/f64: the same order of additions as the CPU; f16/bf16 round once (the CPU per step).
      if (dt == f32 || dt == f64) {
        require_bit_equal(wg.grad(), wc.grad());
      } else {
        require_match(wg.grad(), wc.grad(), 50 * tol_for(dt));
      }
      // Run to run: the same bits.
      Tensor wg2 = gpu_leaf(w);
      embedding(wg2, idx.to(kGPU)).backward(g.to(kGPU));
      REQUIRE(bits(wg2.grad()) == bits(wg.grad()));
    }
  }
  // One row hit by every index, and rows never hit.
  Tensor w = randn({8, 33});
  Tensor idx = from_vector<int32_t>(std::vector<int32_t>(5000, 3));
  Tensor g = randn({5000, 33});
  Tensor wc = cpu_leaf(w), wg = gpu_leaf(w);
  embedding(wc, idx).backward(g);
  embedding(wg, idx.to(kGPU)).backward(g.to(kGPU));
  require_bit_equal(wg.grad(), wc.grad());
}

TEST_CASE("cuda embedding errors: out-of-range index as on the CPU at the next sync, mixed devices",
          "[cuda][index][embedding][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor w = randn({5, 3});
  Tensor bad = from_vector<int64_t>({0, 4, 7, 9, -1}, {5});
  std::string cpu_msg;
  try {
    embedding(w, bad);
  } catch (const Error& e) {
    cpu_msg = e.what();
  }
  REQUIRE(cpu_msg ==
          "[embedding] index 7 (at flat position 2) is out of range for an embedding table of 5 rows (weight [5, 3])");
  const Tensor wg = w.to(kGPU), badg = bad.to(kGPU), bad32 = bad.to(i32).to(kGPU);
  const Tensor badrows = bad.reshape({1, 5}).to(kGPU);
  const Tensor wide = randn({5, 64}).to(kGPU);  // the row kernel
  // The op returns at once; the kernel records the first bad index (by position, as the CPU's
  // loop meets it), which the next sync raises with the CPU's text and says where.
  Tensor out;
  REQUIRE_NOTHROW(out = embedding(wg, badg));
  REQUIRE_THROWS_WITH(out.to(kCPU), cpu_msg + kAtCopy);
  Tensor out32 = embedding(wg, bad32);
  REQUIRE_THROWS_WITH(out32.to(kCPU), StartsWith("[embedding] index 7 (at flat position 2)") && Contains("5 rows"));
  Tensor out_rows = embedding(wide, badrows);
  REQUIRE_THROWS_WITH(out_rows.to(kCPU), StartsWith("[embedding] index 7 (at flat position 2)") && Contains("[5, 64]"));
  REQUIRE_THROWS_WITH(embedding(wg, from_vector<int64_t>({1})),
                      Contains("[embedding] tensors are on different devices: weight on cuda:0, indices on cpu"));
  // The device is still usable after a failed check, and a reported error is not raised again.
  require_bit_equal(embedding(wg, from_vector<int64_t>({4, 0}).to(kGPU)), embedding(w, from_vector<int64_t>({4, 0})));
  REQUIRE_NOTHROW(out.to(kCPU));
}

// ---------------------------------------------------------------- index_select

TEST_CASE("cuda index_select: every dim, dtype and layout; gradient", "[cuda][index][index_select]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(13);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    Tensor a = random({6, 7, 40}, dt);
    for (int64_t dim : {0, 1, 2, -1}) {
      INFO(dt << ", dim " << dim);
      const int64_t n = a.size(dim < 0 ? dim + 3 : dim);
      Tensor idx = randint(0, n, {9});
      require_bit_equal(index_select(a.to(kGPU), dim, idx.to(kGPU)), index_select(a, dim, idx));
      Tensor p = permute(a, {2, 0, 1});
      const int64_t np = p.size(dim < 0 ? dim + 3 : dim);
      Tensor pidx = randint(0, np, {9}, i32);
      require_bit_equal(index_select(permute(a.to(kGPU), {2, 0, 1}), dim, pidx.to(kGPU)), index_select(p, dim, pidx));
    }
  }
  Tensor s = from_vector<double>({2.5}).squeeze();
  Tensor zero = from_vector<int64_t>({0});
  require_bit_equal(index_select(s.to(kGPU), 0, zero.to(kGPU)), index_select(s, 0, zero));

  for (Dtype dt : {f32, f64, f16, bf16}) {
    for (int64_t dim : {0, 1}) {
      INFO(dt << ", dim " << dim);
      Tensor a = random({12, 40}, dt);
      Tensor idx = randint(0, a.size(dim), {30});
      Tensor g = random(dim == 0 ? Shape{30, 40} : Shape{12, 30}, dt);
      Tensor ac = cpu_leaf(a), ag = gpu_leaf(a);
      index_select(ac, dim, idx).backward(g);
      index_select(ag, dim, idx.to(kGPU)).backward(g.to(kGPU));
      require_match(ag.grad(), ac.grad(), 30 * tol_for(dt));
    }
  }
}

TEST_CASE("cuda index_select errors", "[cuda][index][index_select][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = randn({3, 4}).to(kGPU);
  Tensor rows = randn({3, 40}).to(kGPU);  // contiguous rows of 40: the row kernel
  const Tensor bad = from_vector<int64_t>({0, 4}).to(kGPU), bad_rows = from_vector<int32_t>({1, -2, 3}).to(kGPU);
  Tensor y = index_select(a, 1, bad);
  REQUIRE_THROWS_WITH(y.to(kCPU),
                      std::string("[index_select] index 4 is out of range for dim 1 of size 4 (input [3, 4])") +
                          kAtCopy);
  Tensor z = index_select(rows, 0, bad_rows);
  REQUIRE_THROWS_WITH(z.to(kCPU),
                      StartsWith("[index_select] index -2 is out of range for dim 0 of size 3 (input [3, 40])"));
  REQUIRE_THROWS_WITH(index_select(a, 0, from_vector<int64_t>({0})),
                      Contains("[index_select] tensors are on different devices: input on cuda:0, index on cpu"));
}

// ---------------------------------------------------------------- gather / scatter_add

TEST_CASE("cuda gather: every dim and dtype, permuted inputs; gradient", "[cuda][index][gather]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(14);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    Tensor a = random({5, 6, 7}, dt);
    for (int64_t dim : {0, 1, 2}) {
      INFO(dt << ", dim " << dim);
      Shape is = {4, 5, 6};
      is[static_cast<size_t>(dim)] = 9;  // larger than the input along dim, smaller elsewhere
      Tensor idx = randint(0, a.size(dim), is);
      require_bit_equal(gather(a.to(kGPU), dim, idx.to(kGPU)), gather(a, dim, idx));
      Tensor ap = permute(random({7, 5, 6}, dt), {1, 2, 0});  // [5, 6, 7], non-contiguous
      Tensor ip = permute(randint(0, a.size(dim), {is[2], is[0], is[1]}), {1, 2, 0});
      require_bit_equal(gather(ap.to(kGPU).contiguous(), dim, ip.to(kGPU)), gather(ap, dim, ip));
      require_bit_equal(gather(permute(ap.permute({2, 0, 1}).contiguous().to(kGPU), {1, 2, 0}), dim, ip.to(kGPU)),
                        gather(ap, dim, ip));
    }
  }
  for (Dtype dt : {f32, f64, f16, bf16}) {
    Tensor a = random({6, 8}, dt);
    Tensor idx = randint(0, 6, {10, 8});  // repeats: the backward sums them (scatter_add)
    Tensor g = random({10, 8}, dt);
    Tensor ac = cpu_leaf(a), ag = gpu_leaf(a);
    gather(ac, 0, idx).backward(g);
    gather(ag, 0, idx.to(kGPU)).backward(g.to(kGPU));
    require_match(ag.grad(), ac.grad(), 10 * tol_for(dt));
  }
}

TEST_CASE("cuda scatter_add: repeated indices summed in order, src larger than index; gradients",
          "[cuda][index][scatter_add]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(15);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64}) {
    for (int64_t dim : {0, 1, 2}) {
      INFO(dt << ", dim " << dim);
      Tensor a = random({4, 5, 6}, dt);
      Shape is = {3, 4, 5};
      is[static_cast<size_t>(dim)] = 20;  // many sources per destination
      Tensor idx = randint(0, a.size(dim), is);
      Shape ss = is;
      for (auto& s : ss) s += 1;  // src larger than index in every dim
      Tensor src = random(ss, dt);
      Tensor want = scatter_add(a, dim, idx, src);
      Tensor got = scatter_add(a.to(kGPU), dim, idx.to(kGPU), src.to(kGPU));
      if (dt == f16 || dt == bf16) {
        require_match(got, want, 20 * tol_for(dt));
      } else {
        require_bit_equal(got, want);  // same order of additions
      }
      REQUIRE(bits(scatter_add(a.to(kGPU), dim, idx.to(kGPU), src.to(kGPU))) == bits(got));  // run to run
      // permuted input and index
      Tensor ap = permute(a, {2, 0, 1}).contiguous().permute({1, 2, 0});
      require_match(scatter_add(ap.to(kGPU).permute({2, 0, 1}).contiguous().permute({1, 2, 0}), dim,
                               idx.to(i32).to(kGPU), src.to(kGPU)),
                   scatter_add(ap, dim, idx.to(i32), src), 20 * tol_for(dt));
    }
  }
  for (Dtype dt : {f32, f64, f16, bf16}) {
    Tensor a = random({3, 4}, dt), src = random({3, 5}, dt);
    Tensor idx = from_vector<int64_t>({0, 2, 2, 1, 0, 0}, {2, 3});
    Tensor g = random({3, 4}, dt);
    Tensor ac = cpu_leaf(a), sc = cpu_leaf(src), ag = gpu_leaf(a), sg = gpu_leaf(src);
    scatter_add(ac, 0, idx, sc).backward(g);
    scatter_add(ag, 0, idx.to(kGPU), sg).backward(g.to(kGPU));
    require_match(ag.grad(), ac.grad(), tol_for(dt));
    require_match(sg.grad(), sc.grad(), tol_for(dt));
  }
}

TEST_CASE("cuda gather and scatter_add errors", "[cuda][index][gather][scatter_add][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = randn({3, 4}).to(kGPU);
  const Tensor bad0 = from_vector<int64_t>({0, 1, 7, 2}, {1, 4}).to(kGPU);
  const Tensor bad1 = from_vector<int32_t>({-1}, {1, 1}).to(kGPU);
  const Tensor bad_scatter = from_vector<int64_t>({0, 5}, {1, 2}).to(kGPU), src = randn({2, 4}).to(kGPU);
  Tensor g0 = gather(a, 0, bad0);
  REQUIRE_THROWS_WITH(g0.to(kCPU),
                      std::string("[gather] index 7 is out of range for dim 0 of size 3 (input [3, 4])") + kAtCopy);
  Tensor g1 = gather(a, 1, bad1);
  REQUIRE_THROWS_WITH(g1.to(kCPU), StartsWith("[gather] index -1 is out of range for dim 1 of size 4"));
  Tensor s = scatter_add(a, 0, bad_scatter, src);
  REQUIRE_THROWS_WITH(s.to(kCPU), StartsWith("[scatter_add] index 5 is out of range for dim 0 of size 3"));
  // The in-range element was still added; the bad one was skipped (nothing written out of bounds).
  const Tensor want = a.to(kCPU).clone();
  want.narrow(0, 0, 1).narrow(1, 0, 1).add_(src.to(kCPU).narrow(0, 0, 1).narrow(1, 0, 1));
  require_bit_equal(s, want);
  REQUIRE_THROWS_WITH(gather(a, 0, from_vector<int64_t>({0}, {1, 1})),
                      Contains("[gather] tensors are on different devices: input on cuda:0, index on cpu"));
  REQUIRE_THROWS_WITH(scatter_add(a, 0, from_vector<int64_t>({0}, {1, 1}).to(kGPU), randn({1, 1})),
                      Contains("[scatter_add] tensors are on different devices") && Contains("src on cpu"));
}

// ---------------------------------------------------------------- deferred errors, host syncs

// The order of deferred errors (host logic, no device needed): in one epoch the first launch to
// fail keeps the record and, within it, the lowest position wins; after a report (a new epoch)
// any new error replaces it, across the 16-bit wrap too.
TEST_CASE("cuda deferred error keys: first launch wins, then the lowest position; a new epoch beats all",
          "[cuda][index][errors]") {
  using cuda::error_beats;
  using cuda::error_key;
  const auto a5 = error_key(1, 7, 5), a2 = error_key(1, 7, 2), b0 = error_key(1, 8, 0);
  REQUIRE(a5 != 0);
  REQUIRE(error_beats(a5, 0));          // nothing recorded yet
  REQUIRE(error_beats(a2, a5));         // same launch, lower position
  REQUIRE_FALSE(error_beats(a5, a2));
  REQUIRE_FALSE(error_beats(a5, a5));   // a tie keeps the record
  REQUIRE_FALSE(error_beats(b0, a5));   // another launch of the same epoch comes second
  REQUIRE(error_beats(error_key(2, 8, 9), a2));           // the next epoch: after a report
  REQUIRE_FALSE(error_beats(a2, error_key(2, 8, 9)));     // a launch from before the report is dropped
  REQUIRE(error_beats(error_key(0x10001, 1, 0), error_key(0xffff, 1, 0)));  // across the wrap
  REQUIRE(error_key(1, 0x1ffff, int64_t{1} << 40) == error_key(1, 0xffff, 0xffffffffll));  // saturated
}

TEST_CASE("cuda index errors: raised at the next sync of any kind, first op wins, then cleared",
          "[cuda][index][errors]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = randn({3, 4}).to(kGPU);
  const Tensor bad0 = from_vector<int64_t>({5, 1}).to(kGPU);  // dim 0 has 3
  const Tensor bad1 = from_vector<int64_t>({0, 9}).to(kGPU);  // dim 1 has 4
  const Tensor good = from_vector<int64_t>({2, 0}).to(kGPU);
  const char* first = "[index_select] index 5 is out of range for dim 0 of size 3 (input [3, 4])";

  (void)index_select(a, 0, bad0);
  cuda::Stream current = cuda::Stream::borrow(cuda::current_stream(0), 0);
  REQUIRE_THROWS_WITH(current.synchronize(),
                      StartsWith(first) && Contains("at the next synchronisation (Stream::synchronize)"));
  REQUIRE_NOTHROW(current.synchronize());  // reported once, then cleared

  // Two bad ops before a sync: the first one's error is raised; the second, launched before that
  // report, is dropped with it.
  (void)index_select(a, 0, bad0);
  (void)index_select(a, 1, bad1);
  REQUIRE_THROWS_WITH(cuda::synchronize(0), StartsWith(first) && Contains("(cuda::synchronize)"));
  REQUIRE_NOTHROW(cuda::synchronize(0));

  // An event's synchronize raises it too.
  (void)index_select(a, 1, bad1);
  cuda::Event done;
  done.record(cuda::current_stream(0));
  REQUIRE_THROWS_WITH(done.synchronize(), StartsWith("[index_select] index 9 is out of range for dim 1 of size 4") &&
                                              Contains("(Event::synchronize)"));

  // A new error after a report is raised again; good ops around it are right.
  Tensor y = index_select(a, 1, bad1);
  Tensor z = index_select(a, 0, good);
  REQUIRE_THROWS_WITH(y.to(kCPU), StartsWith("[index_select] index 9"));
  require_bit_equal(z, index_select(a.to(kCPU), 0, good.to(kCPU)));
}

TEST_CASE("cuda index ops check their indices without a host sync", "[cuda][index][sync]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(18);
  const Tensor a = randn({6, 40}).to(kGPU), w = randn({10, 64}).to(kGPU), src = randn({4, 40}).to(kGPU);
  const Tensor idx = from_vector<int64_t>({0, 5, 2}).to(kGPU);
  const Tensor gidx = randint(0, 6, {4, 40}).to(kGPU);
  const Tensor tokens = randint(0, 10, {3, 5}, i32).to(kGPU);
  const Tensor bad = from_vector<int64_t>({0, 6}).to(kGPU);
  (void)index_select(a, 0, idx);  // the first checked launch sets the device's error record up
  cuda::synchronize(0);

  const uint64_t before = cuda::host_sync_count();
  Tensor s0 = index_select(a, 0, idx), s1 = index_select(a, 1, idx), s2 = index_select(a, 0, bad);
  Tensor g = gather(a, 0, gidx), e = embedding(w, tokens), sa = scatter_add(a, 0, gidx, src);
  REQUIRE(cuda::host_sync_count() == before);  // a bad index included: recorded, not synced for

  // s2's bad index surfaces at the first sync, whichever tensor it copies.
  REQUIRE_THROWS_WITH(s0.to(kCPU), StartsWith("[index_select] index 6 is out of range for dim 0 of size 6"));
  REQUIRE(cuda::host_sync_count() == before + 1);  // the copy to the host: one sync, counted
  require_bit_equal(s1, index_select(a.to(kCPU), 1, idx.to(kCPU)));
  require_bit_equal(g, gather(a.to(kCPU), 0, gidx.to(kCPU)));
  require_bit_equal(e, embedding(w.to(kCPU), tokens.to(kCPU)));
}

// ---------------------------------------------------------------- masked_fill

TEST_CASE("cuda masked_fill: broadcast masks, every dtype, layouts; gradient", "[cuda][index][masked_fill]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(16);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO(dt);
    Tensor a = random({4, 5, 6}, dt);
    for (const Shape& ms : {Shape{4, 5, 6}, Shape{6}, Shape{5, 1}, Shape{4, 1, 1}, Shape{}}) {
      Tensor mask = randint(0, 2, ms, boolean);
      require_bit_equal(masked_fill(a.to(kGPU), mask.to(kGPU), 3), masked_fill(a, mask, 3));
      require_bit_equal(masked_fill(a.to(kGPU), mask.to(kGPU), -0.75), masked_fill(a, mask, -0.75));
    }
    Tensor at = transpose(a, 0, 2);  // [6, 5, 4]
    Tensor mt = transpose(randint(0, 2, {4, 5, 6}, boolean), 0, 2);
    require_bit_equal(masked_fill(transpose(a.to(kGPU), 0, 2), mt.to(kGPU), 1), masked_fill(at, mt, 1));
  }
  Tensor s = from_vector<float>({2}).squeeze();
  Tensor m = from_vector<bool>({true}).squeeze();
  require_bit_equal(masked_fill(s.to(kGPU), m.to(kGPU), 5), masked_fill(s, m, 5));

  Tensor a = randn({7, 9});
  Tensor mask = randint(0, 2, {9}, boolean);
  Tensor g = randn({7, 9});
  Tensor ac = cpu_leaf(a), ag = gpu_leaf(a);
  masked_fill(ac, mask, 0.5).backward(g);
  masked_fill(ag, mask.to(kGPU), 0.5).backward(g.to(kGPU));
  require_bit_equal(ag.grad(), ac.grad());
  REQUIRE_THROWS_WITH(masked_fill(a.to(kGPU), mask, 1),
                      Contains("[masked_fill] tensors are on different devices: input on cuda:0, mask on cpu"));
}

// ---------------------------------------------------------------- cat / stack

TEST_CASE("cuda cat and stack: dims, promotion, skipped empties, non-contiguous; gradients", "[cuda][index][cat]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(17);
  for (Dtype dt : {f32, f64, f16, bf16, i32, i64, boolean}) {
    INFO(dt);
    Tensor a = random({3, 4, 5}, dt), b = random({3, 2, 5}, dt), c = random({5, 3, 4}, dt);
    Tensor cp = permute(c, {1, 2, 0});  // [3, 4, 5], non-contiguous
    require_bit_equal(cat({a.to(kGPU), b.to(kGPU)}, 1), cat({a, b}, 1));
    require_bit_equal(cat({a.to(kGPU), permute(c.to(kGPU), {1, 2, 0}), a.to(kGPU)}, 0), cat({a, cp, a}, 0));
    require_bit_equal(cat({a.to(kGPU), a.to(kGPU)}, -1), cat({a, a}, -1));
    require_bit_equal(stack({a.to(kGPU), permute(c.to(kGPU), {1, 2, 0})}, 1), stack({a, cp}, 1));
  }
  // promotion and skipped empty 1-D tensors
  Tensor x = randn({2, 3}), y = randint(0, 9, {4, 3}), e = from_vector<float>({});
  require_bit_equal(cat({x.to(kGPU), e.to(kGPU), y.to(kGPU)}, 0), cat({x, e, y}, 0));
  require_bit_equal(cat({e.to(kGPU), e.to(kGPU)}, 0), cat({e, e}, 0));

  Tensor p = randn({2, 3}), q = randn({2, 5});
  Tensor g = randn({2, 8});
  Tensor pc = cpu_leaf(p), qc = cpu_leaf(q), pg = gpu_leaf(p), qg = gpu_leaf(q);
  cat({pc, qc}, 1).backward(g);
  cat({pg, qg}, 1).backward(g.to(kGPU));
  require_bit_equal(pg.grad(), pc.grad());
  require_bit_equal(qg.grad(), qc.grad());
  REQUIRE_THROWS_WITH(cat({p.to(kGPU), q}, 1),
                      Contains("[cat] tensors are on different devices: tensor 0 on cuda:0, tensor 1 on cpu"));
}
