// Matrix products on CUDA (cuBLAS) against the same products on the CPU: every rank combination
// with broadcasting, transposed / strided / expanded / permuted operands, every dtype, linear and
// addmm with their biases, the backward GEMMs through autograd, TF32, streams, threads, errors.
#include <catch2/catch.hpp>

#include <functional>
#include <thread>

#include "cuda/allocator.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using test_util::require_close;

namespace {

using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_match;

// Products of K ~ 64 terms of unit size: looser than the defaults.
constexpr cuda_test::Tolerances tol_for{.f32 = 2e-5, .f16 = 4e-3, .bf16 = 3e-2};

using View = std::function<Tensor(const Tensor&)>;
const View kSame = [](const Tensor& t) { return t; };

// matmul(view_a(a), view_b(b)) on both devices, a and b drawn with the given storage shapes.
void check_matmul(const Shape& as, const Shape& bs, Dtype dtype, const View& va = kSame, const View& vb = kSame) {
  Tensor a = random(as, dtype), b = random(bs, dtype);
  Tensor ca = va(a), cb = vb(b);
  Tensor ga = va(a.to(kGPU)), gb = vb(b.to(kGPU));
  INFO("a " << shape_str(ca.shape()) << " strides " << shape_str(ca.strides()) << ", b " << shape_str(cb.shape())
            << " strides " << shape_str(cb.strides()) << ", " << dtype);
  require_match(matmul(ga, gb), matmul(ca, cb), tol_for(dtype));
}

}  // namespace

TEST_CASE("cuda matmul: every rank combination, with batch broadcasting", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(1);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{5}, {5}},             {{5}, {5, 3}},          {{4, 5}, {5}},       {{4, 5}, {5, 3}},
      {{2, 4, 5}, {5}},       {{5}, {2, 5, 3}},       {{2, 4, 5}, {5, 3}}, {{4, 5}, {2, 5, 3}},
      {{2, 4, 5}, {2, 5, 3}}, {{2, 1, 4, 5}, {3, 5, 6}}, {{3, 1, 4, 5}, {1, 2, 5, 6}},
      {{1, 4, 5}, {3, 5, 6}}, {{64, 64}, {64, 64}},   {{3, 33, 65}, {65, 17}},
  };
  for (Dtype dtype : {f32, f64, f16, bf16, i32, i64}) {
    for (const auto& [as, bs] : cases) check_matmul(as, bs, dtype);
  }
}

TEST_CASE("cuda matmul: transposed, strided, expanded and permuted operands", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(2);
  const View t = [](const Tensor& x) { return x.transpose(-1, -2); };
  const View every_other = [](const Tensor& x) { return x.slice(-1, 0, x.size(-1), 2); };  // no unit stride
  const View both_strided = [](const Tensor& x) { return x.slice(-1, 0, x.size(-1), 2).slice(-2, 0, x.size(-2), 2); };
  const View permute_batch = [](const Tensor& x) { return x.permute({1, 0, 2, 3}); };  // batch dims do not merge
  for (Dtype dtype : {f32, f16, bf16, f64, i64}) {
    check_matmul({6, 4}, {3, 6}, dtype, t, t);                 // a^T b^T: op flags, no copies
    check_matmul({4, 6}, {3, 6}, dtype, kSame, t);             // x w^T (linear's layout)
    check_matmul({2, 6, 4}, {2, 5, 6}, dtype, t, t);           // batched transposes
    check_matmul({4, 10}, {5, 3}, dtype, every_other, kSame);  // gathered first
    check_matmul({8, 10}, {5, 6}, dtype, both_strided, every_other);
    check_matmul({3, 2, 4, 5}, {3, 2, 5, 6}, dtype, permute_batch, permute_batch);
    check_matmul({4, 5}, {5, 6}, dtype, [](const Tensor& x) { return x.expand({3, 4, 5}); }, kSame);
    check_matmul({1, 5, 6}, {4, 5}, dtype, [](const Tensor& x) { return x.expand({3, 5, 6}).transpose(1, 2); },
                 [](const Tensor& x) { return x.t(); });
    check_matmul({2, 3, 4, 5}, {3, 5, 6}, dtype, [](const Tensor& x) { return x.select(0, 1); }, kSame);
  }
}

TEST_CASE("cuda matmul: mm, bmm, linear and addmm", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(3);
  for (Dtype dtype : {f32, f16, bf16, f64}) {
    INFO(dtype);
    const double tol = tol_for(dtype);
    Tensor a = random({7, 9}, dtype), b = random({9, 5}, dtype);
    require_match(mm(a.to(kGPU), b.to(kGPU)), mm(a, b), tol);
    Tensor x = random({3, 7, 9}, dtype), y = random({3, 9, 5}, dtype);
    require_match(bmm(x.to(kGPU), y.to(kGPU)), bmm(x, y), tol);

    Tensor w = random({6, 9}, dtype), bias = random({6}, dtype);
    for (const Shape& xs : std::vector<Shape>{{9}, {4, 9}, {2, 3, 9}, {0, 9}}) {
      Tensor in = random(xs, dtype);
      INFO("linear input " << shape_str(xs));
      require_match(linear(in.to(kGPU), w.to(kGPU), bias.to(kGPU)), linear(in, w, bias), tol);
      require_match(linear(in.to(kGPU), w.to(kGPU), Tensor()), linear(in, w, Tensor()), tol);
    }
    // A non-contiguous input whose leading dims do not fold: materialised first.
    Tensor in = random({3, 2, 9}, dtype);
    require_match(linear(in.to(kGPU).transpose(0, 1), w.to(kGPU), bias.to(kGPU)), linear(in.transpose(0, 1), w, bias),
                 tol);

    for (const Shape& bs : std::vector<Shape>{{5}, {7, 1}, {1, 5}, {7, 5}, {}}) {
      Tensor c = random(bs, dtype);
      INFO("addmm bias " << shape_str(bs));
      require_match(addmm(c.to(kGPU), a.to(kGPU), b.to(kGPU)), addmm(c, a, b), tol);
    }
    // Transposed operands and a strided bias.
    Tensor at = random({9, 7}, dtype), bt = random({5, 9}, dtype), c = random({5, 2}, dtype);
    require_match(addmm(c.to(kGPU).select(1, 1), at.to(kGPU).t(), bt.to(kGPU).t()),
                 addmm(c.select(1, 1), at.t(), bt.t()), tol);
  }
}

TEST_CASE("cuda matmul: empty operands give empty or zero results", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  for (Dtype dtype : {f32, f16, i64}) {
    Tensor z = matmul(zeros({3, 0}, dtype).to(kGPU), zeros({0, 4}, dtype).to(kGPU));  // K = 0: zeros
    require_match(z, zeros({3, 4}, dtype), 0);
    REQUIRE(matmul(zeros({0, 5}, dtype).to(kGPU), zeros({5, 4}, dtype).to(kGPU)).shape() == Shape{0, 4});
    REQUIRE(matmul(zeros({2, 0, 3, 5}, dtype).to(kGPU), zeros({5, 4}, dtype).to(kGPU)).shape() == Shape{2, 0, 3, 4});
    Tensor bias = random({4}, dtype);
    require_match(addmm(bias.to(kGPU), zeros({3, 0}, dtype).to(kGPU), zeros({0, 4}, dtype).to(kGPU)),
                 addmm(bias, zeros({3, 0}, dtype), zeros({0, 4}, dtype)), 0);
  }
}

TEST_CASE("cuda matmul: gradients match the CPU's", "[cuda][matmul][autograd]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(4);
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{5}, {5}},          {{4, 5}, {5, 3}},       {{2, 4, 5}, {5, 3}},       {{4, 5}, {2, 5, 3}},
      {{5}, {2, 5, 3}},    {{2, 4, 5}, {5}},       {{2, 1, 4, 5}, {3, 5, 6}}, {{3, 1, 4, 5}, {1, 2, 5, 6}},
      {{2, 4, 5}, {2, 5, 3}},
  };
  for (Dtype dtype : {f32, f16, bf16, f64}) {
    for (const auto& [as, bs] : cases) {
      INFO("a " << shape_str(as) << " b " << shape_str(bs) << " " << dtype);
      Tensor a = random(as, dtype), b = random(bs, dtype);
      Tensor ca = test_util::leaf(a.clone()), cb = test_util::leaf(b.clone());
      Tensor ga = test_util::leaf(a.to(kGPU)), gb = test_util::leaf(b.to(kGPU));
      Tensor up = random(matmul(a, b).shape(), dtype);
      sum(mul(matmul(ca, cb), up)).backward();
      sum(mul(matmul(ga, gb), up.to(kGPU))).backward();
      require_match(ga.grad(), ca.grad(), tol_for(dtype) * 4);
      require_match(gb.grad(), cb.grad(), tol_for(dtype) * 4);
    }
    // Transposed operands: the backward GEMMs read them through op flags too.
    Tensor a = random({5, 4}, dtype), b = random({3, 5}, dtype);
    Tensor ca = test_util::leaf(a.clone()), cb = test_util::leaf(b.clone());
    Tensor ga = test_util::leaf(a.to(kGPU)), gb = test_util::leaf(b.to(kGPU));
    sum(matmul(ca.t(), cb.t())).backward();
    sum(matmul(ga.t(), gb.t())).backward();
    require_match(ga.grad(), ca.grad(), tol_for(dtype) * 4);
    require_match(gb.grad(), cb.grad(), tol_for(dtype) * 4);
  }
}

TEST_CASE("cuda linear and addmm: gradients of input, weight and bias", "[cuda][matmul][autograd]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(5);
  for (Dtype dtype : {f32, f16, bf16, f64}) {
    INFO(dtype);
    const double tol = tol_for(dtype) * 4;
    for (const Shape& xs : std::vector<Shape>{{9}, {4, 9}, {2, 3, 9}}) {
      INFO("input " << shape_str(xs));
      Tensor x = random(xs, dtype), w = random({6, 9}, dtype), bias = random({6}, dtype);
      Tensor cx = test_util::leaf(x.clone()), cw = test_util::leaf(w.clone()), cbias = test_util::leaf(bias.clone());
      Tensor gx = test_util::leaf(x.to(kGPU)), gw = test_util::leaf(w.to(kGPU)), gbias = test_util::leaf(bias.to(kGPU));
      Tensor up = random(linear(x, w, bias).shape(), dtype);
      sum(mul(linear(cx, cw, cbias), up)).backward();
      sum(mul(linear(gx, gw, gbias), up.to(kGPU))).backward();
      require_match(gx.grad(), cx.grad(), tol);
      require_match(gw.grad(), cw.grad(), tol);
      require_match(gbias.grad(), cbias.grad(), tol);
    }
    Tensor c = random({7, 1}, dtype), a = random({7, 9}, dtype), b = random({9, 5}, dtype);
    Tensor cc = test_util::leaf(c.clone()), ca = test_util::leaf(a.clone()), cb = test_util::leaf(b.clone());
    Tensor gc = test_util::leaf(c.to(kGPU)), ga = test_util::leaf(a.to(kGPU)), gb = test_util::leaf(b.to(kGPU));
    Tensor up = random({7, 5}, dtype);
    sum(mul(addmm(cc, ca, cb), up)).backward();
    sum(mul(addmm(gc, ga, gb), up.to(kGPU))).backward();
    require_match(gc.grad(), cc.grad(), tol);
    require_match(ga.grad(), ca.grad(), tol);
    require_match(gb.grad(), cb.grad(), tol);
  }
}

TEST_CASE("cuda matmul: large products (cuBLAS workspace, split reductions)", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(6);
  // Compared with the f64 CPU product; K = 1024 keeps f32 rounding well under the tolerance.
  Tensor a = randn({256, 1024}), b = randn({1024, 384});
  Tensor want = matmul(to_dtype(a, f64), to_dtype(b, f64));
  require_close(to_dtype(matmul(a.to(kGPU), b.to(kGPU)).to(kCPU), f64).to_vector<double>(), want.to_vector<double>(),
                1e-4);
  Tensor a16 = to_dtype(a, bf16), b16 = to_dtype(b, bf16);
  Tensor want16 = matmul(to_dtype(a16, f64), to_dtype(b16, f64));  // exact products of the rounded inputs
  require_close(to_dtype(matmul(a16.to(kGPU), b16.to(kGPU)).to(kCPU), f64).to_vector<double>(),
                want16.to_vector<double>(), 1e-2);
  // A long K from a stacked batch (the weight gradient of an [8, 128, 256] input).
  Tensor x = randn({8, 128, 256}), g = randn({8, 128, 64});
  Tensor cx = test_util::leaf(x.clone()), gx = test_util::leaf(x.to(kGPU));
  Tensor w = randn({64, 256});
  Tensor cw = test_util::leaf(w.clone()), gw = test_util::leaf(w.to(kGPU));
  sum(mul(linear(cx, cw, Tensor()), g)).backward();
  sum(mul(linear(gx, gw, Tensor()), g.to(kGPU))).backward();
  require_match(gw.grad(), cw.grad(), 1e-4);
  require_match(gx.grad(), cx.grad(), 1e-4);
}

TEST_CASE("cuda matmul: TF32 only when allowed", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(7);
  REQUIRE_FALSE(cuda::allow_tf32());  // PyTorch's default
  Tensor a = randn({128, 512}), b = randn({512, 128});
  Tensor want = matmul(to_dtype(a, f64), to_dtype(b, f64));
  Tensor exact = matmul(a.to(kGPU), b.to(kGPU)).to(kCPU);
  cuda::set_allow_tf32(true);
  Tensor fast;
  try {
    fast = matmul(a.to(kGPU), b.to(kGPU)).to(kCPU);
  } catch (...) {
    cuda::set_allow_tf32(false);
    throw;
  }
  cuda::set_allow_tf32(false);
  auto err = [&](const Tensor& t) { return max(abs(sub(to_dtype(t, f64), want))).item<double>(); };
  INFO("f32 error " << err(exact) << ", tf32 error " << err(fast));
  REQUIRE(err(exact) < 1e-3);
  REQUIRE(err(fast) < 0.5);  // TF32 has a 10-bit mantissa: sums of 512 terms err by ~1e-2
  REQUIRE(err(exact) <= err(fast));
}

TEST_CASE("cuda matmul: runs on the current stream and from several threads", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(8);
  Tensor a = randn({64, 96}), b = randn({96, 80});
  Tensor want = matmul(a, b);
  Tensor ga = a.to(kGPU), gb = b.to(kGPU);
  {
    cuda::Stream s = cuda::Stream::create(0);
    cuda::synchronize(0);  // ga, gb were written on the default stream
    cuda::StreamGuard guard(s);
    Tensor c = matmul(ga, gb);
    Tensor c2 = matmul(c, gb.t());  // ordered after c on s
    s.synchronize();
    require_match(c, want, tol_for(f32));
    require_match(c2, matmul(want, b.t()), 1e-4);
  }
  std::vector<Tensor> results(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      Tensor c;
      for (int r = 0; r < 10; ++r) c = matmul(ga, gb);
      results[i] = c.to(kCPU);
    });
  }
  for (auto& th : threads) th.join();
  for (const Tensor& r : results) require_close(r.to_vector<double>(), want.to_vector<double>(), tol_for(f32));
}

// cuBLAS's workspace (32 MiB on sm_90) is taken from the caching allocator on the product's
// stream and given back when the product is queued: nothing stays allocated per stream, so a
// program that makes many short-lived streams holds no workspace for the ones that are gone.
TEST_CASE("cuda matmul: short-lived streams leave no cuBLAS workspace allocated", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(9);
  Tensor a = randn({64, 96}), b = randn({96, 80});
  Tensor want = matmul(a, b);
  Tensor ga = a.to(kGPU), gb = b.to(kGPU);
  cuda::synchronize(0);  // ga, gb were written on the default stream; the streams below read them
  cuda::empty_cache();
  const cuda::MemoryStats base = cuda::memory_stats(0);
  cuda::reset_peak_memory_stats(0);
  const int64_t workspace = 32 << 20, product = 64 * 80 * 4;  // at most; a product's own buffers
  for (int i = 0; i < 200; ++i) {
    INFO("stream " << i);
    cuda::Stream s = cuda::Stream::create(0);
    {
      cuda::StreamGuard guard(s);
      Tensor c = matmul(ga, gb);
      if (i % 50 == 0) require_match(c, want, tol_for(f32));
      s.synchronize();
    }
    const cuda::MemoryStats now = cuda::memory_stats(0);
    REQUIRE(now.allocated_bytes == base.allocated_bytes);  // neither c nor a workspace is held
    REQUIRE(now.active_blocks == base.active_blocks);
  }
  // One product's workspace at a time, never one per stream.
  REQUIRE(cuda::memory_stats(0).peak_allocated_bytes <= base.allocated_bytes + workspace + 2 * product);
  // What the streams cached (each its own blocks, reused only on it) all goes back to CUDA.
  cuda::empty_cache();
  const cuda::MemoryStats after = cuda::memory_stats(0);
  REQUIRE(after.reserved_bytes == base.reserved_bytes);
  REQUIRE(after.segments == base.segments);
  // On a stream that lives on (the default one), the next product gets the cached workspace back.
  {
    Tensor warm = matmul(ga, gb);
  }
  const int64_t mallocs = cuda::memory_stats(0).num_device_mallocs;
  Tensor c = matmul(ga, gb);
  REQUIRE(cuda::memory_stats(0).num_device_mallocs == mallocs);
  require_match(c, want, tol_for(f32));
}

TEST_CASE("cuda matmul: mixed devices are an error", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  Tensor a = randn({3, 4}), b = randn({4, 5});
  REQUIRE_THROWS_WITH(matmul(a.to(kGPU), b), Contains("[matmul] tensors are on different devices") &&
                                                 Contains("cuda:0") && Contains("cpu"));
  REQUIRE_THROWS_WITH(mm(a, b.to(kGPU)), Contains("[mm] tensors are on different devices"));
  REQUIRE_THROWS_WITH(linear(a.to(kGPU), randn({5, 4}), Tensor()), Contains("different devices"));
  REQUIRE_THROWS_WITH(linear(a.to(kGPU), randn({5, 4}).to(kGPU), randn({5})),
                      Contains("[linear] tensors are on different devices: input on cuda:0, bias on cpu"));
  REQUIRE_THROWS_WITH(addmm(randn({5}), a.to(kGPU), b.to(kGPU)),
                      Contains("[addmm] tensors are on different devices: bias on cpu, a on cuda:0, b on cuda:0"));
  REQUIRE_THROWS_WITH(matmul(a.to(kGPU), randn({5, 5}).to(kGPU)), Contains("[matmul] inner dimensions differ"));
}

// ---- size-1 dims with odd strides (issue 15) ----

namespace {

// dense's values in a CPU view whose dims of size > 1 are dense row-major (so is_contiguous()
// holds) and whose size-1 dims carry odd strides, over a NaN-filled buffer; then the same
// geometry on the GPU (its whole storage copied: .to() would make a dense copy).
Tensor odd_on_gpu(const Tensor& dense) {
  const Shape& s = dense.shape();
  Strides st(s.size(), 0);
  int64_t run = 1, odd = 97;
  for (size_t d = s.size(); d-- > 0;) {
    if (s[d] == 1) {
      st[d] = odd;
      odd = odd == 97 ? 5 : 97;
    } else {
      st[d] = run;
      run *= s[d];
    }
  }
  const int64_t n = 3 + run + 97 * (dense.numel() + 1) * 8;
  Tensor cpu = make_view(full({n}, std::nan(""), dense.dtype()), s, st, 3);
  {
    NoGradGuard no_grad;
    cpu.copy_(dense);
  }
  Tensor buf = make_view(cpu, Shape{n}, Strides{1}, 0).to(kGPU);
  return make_view(buf, s, st, 3);
}

}  // namespace

TEST_CASE("cuda matmul: operands and gradients whose size-1 dims carry odd strides", "[cuda][matmul]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  // The report: linear read storage elements 0, 3, 6 of this view.
  const Tensor base = arange(1, 10, TensorOptions(f64)).view({3, 3}).to(kGPU);
  const Tensor y = base.t().narrow(1, 0, 1).unsqueeze(1);
  REQUIRE(y.is_contiguous());
  require_close(cuda_test::host_values(linear(y, full({1, 1}, 0.7, TensorOptions(f64, kGPU)))), {0.7, 1.4, 2.1});

  // linear / matmul / addmm on odd views, the output transposed so the incoming gradient is odd
  // too, against the CPU on dense leaves: values and every gradient.
  using Fn = std::function<Tensor(const TensorList&)>;
  const std::vector<std::pair<Fn, TensorList>> cases = {
      {[](const TensorList& t) { return linear(t[0], t[1]).transpose(0, 1).permute({2, 1, 0}); },
       {randn({3, 1, 1}, f64), randn({1, 1}, f64)}},
      {[](const TensorList& t) { return linear(t[0], t[1], t[2]).transpose(0, -1); },
       {randn({2, 1, 3}, f64), randn({4, 3}, f64), randn({4}, f64)}},
      {[](const TensorList& t) { return linear(t[0], t[1], t[2]).transpose(0, -1); },
       {randn({4, 1, 1, 3}, f64), randn({1, 3}, f64), randn({1}, f64)}},
      {[](const TensorList& t) { return matmul(t[0], t[1]).transpose(0, -1); },
       {randn({4, 1, 3}, f64), randn({3, 2}, f64)}},
      {[](const TensorList& t) { return matmul(t[0], t[1]).transpose(0, -1); },
       {randn({2, 3, 1}, f64), randn({1, 1, 4}, f64)}},
      {[](const TensorList& t) { return bmm(t[0], t[1]).transpose(0, -1); },
       {randn({3, 1, 2}, f64), randn({3, 2, 1}, f64)}},
      {[](const TensorList& t) { return addmm(t[0], t[1], t[2]).t(); },
       {randn({1, 4}, f64), randn({1, 3}, f64), randn({3, 4}, f64)}},
  };
  for (const auto& [fn, in] : cases) {
    TensorList cpu, gpu;
    for (const Tensor& t : in) {
      cpu.push_back(test_util::leaf(t.clone()));
      gpu.push_back(test_util::leaf(odd_on_gpu(t)));
    }
    const Tensor want = fn(cpu), got = fn(gpu);
    require_match(got, want, 1e-12);
    const Tensor ct = randn(want.shape(), f64);
    want.backward(ct.contiguous());
    got.backward(odd_on_gpu(ct));
    for (size_t i = 0; i < in.size(); ++i) {
      INFO("gradient of input " << i << " (shape " << fmt::format("{}", in[i].shape()) << ")");
      require_match(gpu[i].grad(), cpu[i].grad(), 1e-12);
    }
  }
}
