#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "core/cpu/onednn.h"  // onednn_bf16_gemm: the oneDNN route on its own
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using test_util::require_gradcheck;
using Catch::Contains;

namespace {

std::vector<double> vals(const Tensor& t) { return t.to_vector<double>(); }

void require_close(const std::vector<double>& got, const std::vector<double>& want, double tol = 1e-10) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": got " << got[i] << ", want " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

// torch.matmul semantics by the definition: promote 1-D operands, broadcast the batch dims,
// triple loop per batch, drop the promoted dims.
std::pair<std::vector<double>, Shape> naive_matmul(const Tensor& a, const Tensor& b) {
  Shape as = a.shape(), bs = b.shape();
  bool a1 = as.size() == 1, b1 = bs.size() == 1;
  if (a1) as = Shape{1, as[0]};
  if (b1) bs = Shape{bs[0], 1};
  const int64_t M = as[as.size() - 2], K = as.back(), N = bs.back();
  Shape ab(std::vector<int64_t>(as.begin(), as.end() - 2)), bb(std::vector<int64_t>(bs.begin(), bs.end() - 2));
  Shape batch = broadcast_shapes(ab, bb, "test");
  auto x = vals(a), y = vals(b);
  const int64_t nb = numel_of(batch);
  std::vector<double> out(nb * M * N, 0.0);
  for (int64_t bi = 0; bi < nb; ++bi) {
    // batch coordinates -> offsets into a and b (size-1 dims broadcast)
    int64_t rem = bi, ao = 0, bo = 0, amul = M * K, bmul = K * N;
    for (size_t d = batch.size(); d-- > 0;) {
      int64_t c = rem % batch[d];
      rem /= batch[d];
      int64_t ad = static_cast<int64_t>(d) - static_cast<int64_t>(batch.size() - ab.size());
      int64_t bd = static_cast<int64_t>(d) - static_cast<int64_t>(batch.size() - bb.size());
      if (ad >= 0) {
        if (ab[ad] != 1) ao += c * amul;
        amul *= ab[ad];
      }
      if (bd >= 0) {
        if (bb[bd] != 1) bo += c * bmul;
        bmul *= bb[bd];
      }
    }
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double s = 0;
        for (int64_t k = 0; k < K; ++k) s += x[ao + i * K + k] * y[bo + k * N + j];
        out[bi * M * N + i * N + j] = s;
      }
  }
  Shape os = batch;
  if (!a1) os.push_back(M);
  if (!b1) os.push_back(N);
  return {out, os};
}

void check_matmul(const Tensor& a, const Tensor& b, double tol = 1e-10) {
  INFO("a " << shape_str(a.shape()) << " b " << shape_str(b.shape()));
  Tensor c = matmul(a, b);
  auto [want, shape] = naive_matmul(a, b);
  REQUIRE(c.shape() == shape);
  REQUIRE(c.dtype() == a.dtype());
  require_close(vals(c), want, tol);
}

}  // namespace

TEST_CASE("matmul matches the naive definition for every rank combination") {
  manual_seed(1);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{4, 3}, {3, 5}}, {{3}, {3}},          {{4, 3}, {3}},          {{3}, {3, 5}},
      {{2, 4, 3}, {3}}, {{3}, {2, 3, 5}},    {{2, 4, 3}, {3, 5}},    {{4, 3}, {2, 3, 5}},
      {{2, 4, 3}, {2, 3, 5}}, {{2, 1, 4, 3}, {3, 3, 5}}, {{1, 4, 3}, {2, 3, 5}}, {{1, 3}, {3, 1}},
  };
  for (auto& [sa, sb] : cases) {
    check_matmul(randn(sa, f64), randn(sb, f64));
    check_matmul(randn(sa, f32), randn(sb, f32), 1e-5);
  }
  REQUIRE(matmul(randn({3}), randn({3})).dim() == 0);
}

TEST_CASE("matmul on strided operands: transposed, sliced and broadcast views") {
  manual_seed(2);
  Tensor x = randn({6, 4}, f64);
  Tensor w = randn({5, 4}, f64);
  check_matmul(x, w.t());                    // BLAS transpose flag
  check_matmul(w.t().t(), x.t());            // both transposed
  check_matmul(x.slice(0, 0, 6, 2), w.t());  // row stride 8: leading dimension
  check_matmul(x.slice(1, 0, 4, 2), randn({2, 3}, f64));  // column stride 2: copied
  Tensor b3 = randn({3, 4, 5}, f64);
  check_matmul(x, b3);
  check_matmul(b3.transpose(1, 2), x.t());
  check_matmul(randn({4, 1}, f64).expand({4, 3}), randn({3, 2}, f64));
  check_matmul(x.t().contiguous().t(), w.t());
  Tensor f = randn({6, 4}, f32);
  Tensor g = randn({5, 4}, f32);
  check_matmul(f, g.t(), 1e-5);
}

TEST_CASE("matmul: integers use exact arithmetic, f16/bf16 go through f32") {
  Tensor a = from_vector<int64_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector<int64_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  REQUIRE(c.dtype() == i64);
  REQUIRE(c.to_vector<int64_t>() == std::vector<int64_t>{58, 64, 139, 154});
  Tensor ai = from_vector<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor bi = from_vector<int32_t>({7, 8, 9, 10, 11, 12}, {3, 2});
  REQUIRE(mm(ai, bi).to_vector<int32_t>() == std::vector<int32_t>{58, 64, 139, 154});
  REQUIRE(matmul(ai.t(), ai).to_vector<int32_t>() == std::vector<int32_t>{17, 22, 27, 22, 29, 36, 27, 36, 45});
  manual_seed(3);
  Tensor x = randn({5, 8});
  Tensor y = randn({8, 3});
  for (Dtype dt : {f16, bf16}) {
    Tensor h = matmul(x.to(dt), y.to(dt));
    REQUIRE(h.dtype() == dt);
    auto want_rounded = vals(matmul(x.to(dt).to(f32), y.to(dt).to(f32)));
    require_close(vals(h), want_rounded, dt == f16 ? 2e-3 : 1e-2);
  }
}

TEST_CASE("integer matmul wraps on overflow, as PyTorch's does", "[matmul][fuzz]") {
  // The integer GEMM's products and sums go through core/detail/wrapping.h: defined wrapping,
  // where a signed overflow was undefined (UBSan). PyTorch 1.13:
  // torch.tensor([[2**62, 2**62]]) @ torch.tensor([[2], [2]]) == tensor([[0]]), and
  // torch.tensor([[65536]], dtype=torch.int32) @ same == tensor([[0]], dtype=torch.int32).
  const int64_t big = int64_t{1} << 62;
  Tensor a = from_vector<int64_t>({big, big}, {1, 2});
  Tensor b = from_vector<int64_t>({2, 2}, {2, 1});
  REQUIRE(matmul(a, b).to_vector<int64_t>() == std::vector<int64_t>{0});
  REQUIRE(matmul(a, from_vector<int64_t>({2, 1}, {2, 1})).to_vector<int64_t>() ==
          std::vector<int64_t>{std::numeric_limits<int64_t>::min() + big});
  Tensor h = from_vector<int32_t>({65536}, {1, 1});
  REQUIRE(mm(h, h).to_vector<int32_t>() == std::vector<int32_t>{0});
}

TEST_CASE("matmul: empty inner dimension gives zeros") {
  Tensor c = matmul(zeros({2, 0}), zeros({0, 3}));
  REQUIRE(c.shape() == Shape{2, 3});
  require_close(vals(c), std::vector<double>(6, 0.0));
  REQUIRE(matmul(zeros({0, 4}), zeros({4, 3})).shape() == Shape{0, 3});
}

TEST_CASE("matmul family errors name the op and the shapes") {
  REQUIRE_THROWS_WITH(matmul(zeros({4, 3}), zeros({5, 2})),
                      Contains("[matmul] inner dimensions differ: a is [4, 3], b is [5, 2]"));
  REQUIRE_THROWS_WITH(matmul(zeros({3}), zeros({4})), Contains("[matmul] inner dimensions differ"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 3, 4}), zeros({3, 4, 5})),
                      Contains("[matmul] batch dimensions cannot be broadcast") && Contains("[2, 3, 4]"));
  REQUIRE_THROWS_WITH(matmul(scalar_tensor(1.0), zeros({3})), Contains("[matmul]") && Contains("at least 1 dim"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 2}), zeros({2, 2}, f64)), Contains("[matmul] dtypes differ") && Contains("f64"));
  REQUIRE_THROWS_WITH(matmul(zeros({2, 2}, boolean), zeros({2, 2}, boolean)), Contains("[matmul]"));
  REQUIRE_THROWS_WITH(mm(zeros({3}), zeros({3, 2})), Contains("[mm] a must be 2-D, got shape [3]"));
  REQUIRE_THROWS_WITH(mm(zeros({2, 3}), zeros({4, 2})), Contains("[mm] inner dimensions differ"));
  REQUIRE_THROWS_WITH(bmm(zeros({2, 3, 4}), zeros({3, 4, 5})), Contains("[bmm] batch sizes differ"));
  REQUIRE_THROWS_WITH(bmm(zeros({3, 4}), zeros({3, 4, 5})), Contains("[bmm] a must be 3-D"));
  REQUIRE_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 5})), Contains("[linear] input has 3 features"));
  REQUIRE_THROWS_WITH(linear(zeros({2, 3}), zeros({3})), Contains("[linear] weight must be 2-D"));
  REQUIRE_THROWS_WITH(linear(zeros({2, 3}), zeros({4, 3}), zeros({3})), Contains("[linear] bias must have shape [4]"));
  REQUIRE_THROWS_WITH(addmm(zeros({3}), zeros({2, 4}), zeros({4, 5})), Contains("[addmm]"));
  REQUIRE_THROWS_WITH(addmm(zeros({5}), zeros({2, 4}), zeros({3, 5})), Contains("[addmm] inner dimensions differ"));
}

TEST_CASE("mm, bmm, linear and addmm values") {
  manual_seed(4);
  Tensor a = randn({4, 3}, f64), b = randn({3, 5}, f64);
  require_close(vals(mm(a, b)), naive_matmul(a, b).first);
  Tensor ba = randn({2, 4, 3}, f64), bb = randn({2, 3, 5}, f64);
  require_close(vals(bmm(ba, bb)), naive_matmul(ba, bb).first);
  // linear: x W^T + b for any leading dims, and for a 1-D input.
  Tensor x = randn({2, 3, 4}, f64), w = randn({5, 4}, f64), bias = randn({5}, f64);
  Tensor y = linear(x, w, bias);
  REQUIRE(y.shape() == Shape{2, 3, 5});
  auto xw = naive_matmul(x, w.t().contiguous()).first;
  auto bv = vals(bias);
  for (size_t i = 0; i < xw.size(); ++i) xw[i] += bv[i % 5];
  require_close(vals(y), xw);
  require_close(vals(linear(x, w)), naive_matmul(x, w.t().contiguous()).first);
  Tensor x1 = randn({4}, f64);
  REQUIRE(linear(x1, w, bias).shape() == Shape{5});
  // Non-foldable leading dims (a transposed batch) are handled too.
  Tensor xt = randn({3, 2, 4}, f64).transpose(0, 1);
  auto want = naive_matmul(xt.contiguous(), w.t().contiguous()).first;
  for (size_t i = 0; i < want.size(); ++i) want[i] += bv[i % 5];
  require_close(vals(linear(xt, w, bias)), want);
  // addmm with a row bias, a full bias and a column bias.
  auto ab = naive_matmul(a, b).first;
  Tensor row = randn({5}, f64), full_b = randn({4, 5}, f64), col = randn({4, 1}, f64);
  auto rv = vals(row), fv = vals(full_b), cv = vals(col);
  std::vector<double> w1(20), w2(20), w3(20);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; ++j) {
      w1[i * 5 + j] = ab[i * 5 + j] + rv[j];
      w2[i * 5 + j] = ab[i * 5 + j] + fv[i * 5 + j];
      w3[i * 5 + j] = ab[i * 5 + j] + cv[i];
    }
  require_close(vals(addmm(row, a, b)), w1);
  require_close(vals(addmm(full_b, a, b)), w2);
  require_close(vals(addmm(col, a, b)), w3);
}

TEST_CASE("gradcheck: matmul over rank combinations, batch broadcasting and strided inputs") {
  manual_seed(5);
  std::vector<std::pair<Shape, Shape>> cases = {
      {{4, 3}, {3, 5}}, {{3}, {3}},       {{4, 3}, {3}},       {{3}, {3, 5}},        {{2, 4, 3}, {3}},
      {{3}, {2, 3, 5}}, {{2, 4, 3}, {3, 5}}, {{4, 3}, {2, 3, 5}}, {{2, 1, 4, 3}, {3, 3, 5}}, {{1, 4, 3}, {2, 3, 5}},
  };
  auto fn = [](const TensorList& in) { return matmul(in[0], in[1]); };
  for (auto& [sa, sb] : cases) {
    INFO("a " << shape_str(sa) << " b " << shape_str(sb));
    require_gradcheck(fn, {leaf(randn(sa, f64)), leaf(randn(sb, f64))});
  }
  // Strided: a transposed weight (x W^T) and a transposed batch.
  // (gradcheck clones its inputs contiguous, so the views are taken inside the function.)
  require_gradcheck([](const TensorList& in) { return matmul(in[0], in[1].t()); },
                    {leaf(randn({4, 3}, f64)), leaf(randn({5, 3}, f64))});
  require_gradcheck([](const TensorList& in) { return matmul(in[0].transpose(1, 2), in[1]); },
                    {leaf(randn({2, 3, 4}, f64)), leaf(randn({3, 2}, f64))});
  require_gradcheck([](const TensorList& in) { return matmul(in[0].t(), in[1].transpose(1, 2)); },
                    {leaf(randn({3, 4}, f64)), leaf(randn({2, 5, 3}, f64))});
  // Only one input requiring grad.
  require_gradcheck(fn, {randn({4, 3}, f64), leaf(randn({3, 2}, f64))});
  require_gradcheck([](const TensorList& in) { return mm(in[0].t(), in[1]); },
                    {leaf(randn({3, 4}, f64)), leaf(randn({3, 2}, f64))});
  require_gradcheck([](const TensorList& in) { return bmm(in[0], in[1]); },
                    {leaf(randn({2, 4, 3}, f64)), leaf(randn({2, 3, 5}, f64))});
}

TEST_CASE("gradcheck: linear and addmm") {
  manual_seed(6);
  auto lin = [](const TensorList& in) { return linear(in[0], in[1], in[2]); };
  require_gradcheck(lin, {leaf(randn({4, 3}, f64)), leaf(randn({5, 3}, f64)), leaf(randn({5}, f64))});
  require_gradcheck(lin, {leaf(randn({2, 3, 4}, f64)), leaf(randn({5, 4}, f64)), leaf(randn({5}, f64))});
  require_gradcheck([](const TensorList& in) { return linear(in[0].transpose(0, 1), in[1].t(), in[2]); },
                    {leaf(randn({3, 2, 4}, f64)), leaf(randn({4, 5}, f64)), leaf(randn({5}, f64))});
  require_gradcheck(lin, {leaf(randn({4}, f64)), leaf(randn({2, 4}, f64)), leaf(randn({2}, f64))});
  require_gradcheck([](const TensorList& in) { return linear(in[0], in[1]); },
                    {leaf(randn({3, 4}, f64)), leaf(randn({2, 4}, f64))});
  auto am = [](const TensorList& in) { return addmm(in[0], in[1], in[2]); };
  require_gradcheck(am, {leaf(randn({5}, f64)), leaf(randn({4, 3}, f64)), leaf(randn({3, 5}, f64))});
  require_gradcheck([](const TensorList& in) { return addmm(in[0], in[1].t(), in[2]); },
                    {leaf(randn({4, 1}, f64)), leaf(randn({3, 4}, f64)), leaf(randn({3, 5}, f64))});
  require_gradcheck(am, {leaf(randn({4, 5}, f64)), leaf(randn({4, 3}, f64)), leaf(randn({3, 5}, f64))});
}

TEST_CASE("linear backward: weight gradient is g^T x over all leading dims, bias gradient sums them") {
  manual_seed(7);
  Tensor x = leaf(randn({2, 3, 4}, f64));
  Tensor w = leaf(randn({5, 4}, f64));
  Tensor b = leaf(randn({5}, f64));
  linear(x, w, b).sum().backward();
  // d/dW of sum(x W^T) is sum over rows of x, broadcast to each output row.
  auto xv = vals(x);
  std::vector<double> colsum(4, 0.0);
  for (size_t i = 0; i < xv.size(); ++i) colsum[i % 4] += xv[i];
  std::vector<double> want_w;
  for (int o = 0; o < 5; ++o) want_w.insert(want_w.end(), colsum.begin(), colsum.end());
  require_close(vals(w.grad()), want_w);
  require_close(vals(b.grad()), std::vector<double>(5, 6.0));
  auto wv = vals(w);
  std::vector<double> rowsum(4, 0.0);
  for (size_t i = 0; i < wv.size(); ++i) rowsum[i % 4] += wv[i];
  std::vector<double> want_x;
  for (int r = 0; r < 6; ++r) want_x.insert(want_x.end(), rowsum.begin(), rowsum.end());
  require_close(vals(x.grad()), want_x);
}

// Found by fuzz_ops (corpus/ops/crash-linear-empty-huge-stride): linear of an empty [1048576, 0]
// input whose row stride is INT64_MAX folded its rows by multiplying that stride by the row count
// (UBSan: signed overflow). Empty operands take no geometry: the result is the bias (or zeros).
TEST_CASE("linear and matmul of empty operands whose strides are near INT64_MAX", "[matmul][fuzz]") {
  const int64_t highest = std::numeric_limits<int64_t>::max();
  Tensor x = zeros({1048576, 0, highest}).select(2, 0);  // [1048576, 0], strides [INT64_MAX, INT64_MAX]
  REQUIRE(x.stride(0) == highest);
  Tensor w = zeros({3, 0});
  Tensor b = from_vector<float>({1, 2, 3});
  Tensor y = linear(x.narrow(0, 0, 2), w, b);
  REQUIRE(y.shape() == Shape{2, 3});
  REQUIRE(y.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  Tensor z = matmul(zeros({2, 0, highest}).select(2, 0), zeros({0, 5}));  // K = 0: zeros
  REQUIRE(z.shape() == Shape{2, 5});
  REQUIRE(z.abs().sum().item<float>() == 0.0f);
}

namespace {
// GEMMs of element type T over layouts (transposed operands, C accumulated), through the public
// ops and through `direct` (a oneDNN route called on its own, true when it ran; `runs` says
// whether it must): each within `bound` of the exact f64 product. Both routes sum in f32 and
// round C once (`result_bits`: the mantissa bits of C's type), so they differ only in the order
// of the f32 sums.
template <class T, class Direct>
void check_gemm_routes(Dtype dtype, int result_bits, bool runs, const Direct& direct) {
  manual_seed(11);
  struct Case {
    int64_t M, N, K;
    bool a_t, b_t, accumulate;
  };
  for (Case c : {Case{1, 1, 1, false, false, false}, Case{1, 7, 5, false, false, false}, Case{9, 1, 300, true, false, true},
                 Case{33, 65, 17, false, true, false}, Case{64, 48, 129, true, true, true},
                 Case{5, 3, 1, false, false, true}, Case{128, 256, 64, false, true, false}}) {
    INFO("M " << c.M << " N " << c.N << " K " << c.K << " a_t " << c.a_t << " b_t " << c.b_t << " acc " << c.accumulate);
    Tensor a = (c.a_t ? randn({c.K, c.M}).t() : randn({c.M, c.K})).to(dtype);
    Tensor b = (c.b_t ? randn({c.N, c.K}).t() : randn({c.K, c.N})).to(dtype);
    Tensor c0 = randn({c.M, c.N}).to(dtype);
    const auto A = vals(a), B = vals(b), C0 = vals(c0);
    std::vector<double> exact(c.M * c.N), bound(c.M * c.N);
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) {
        double s = c.accumulate ? C0[i * c.N + j] : 0, m = std::abs(s);
        for (int64_t k = 0; k < c.K; ++k) {
          s += A[i * c.K + k] * B[k * c.N + j];
          m += std::abs(A[i * c.K + k] * B[k * c.N + j]);
        }
        exact[i * c.N + j] = s;
        // one rounding of the result to T, plus the f32 sums' error
        bound[i * c.N + j] = std::ldexp(std::abs(s), -result_bits) + (c.K + 1) * std::ldexp(m, -23);
      }
    auto check = [&](const Tensor& got) {
      const auto g = vals(got);
      for (size_t e = 0; e < g.size(); ++e) {
        INFO("element " << e << ": got " << g[e] << ", exact " << exact[e]);
        REQUIRE(std::abs(g[e] - exact[e]) <= bound[e]);
      }
    };
    // The public ops: oneDNN where it is used, else the portable route.
    check(c.accumulate ? addmm(c0, a, b) : matmul(a, b));
    // oneDNN called directly, when it runs here.
    Tensor out = c0.clone();
    const bool ran = direct(c.M, c.N, c.K, a.template data_ptr<T>(), a.stride(0), a.stride(1), b.template data_ptr<T>(),
                            b.stride(0), b.stride(1), out.template data_ptr<T>(), c.N, c.accumulate, "test");
    REQUIRE(ran == runs);
    if (ran) check(out);
  }
}
}  // namespace

TEST_CASE("f32 GEMM: oneDNN (where OpenBLAS has no AVX-512 kernel for this CPU) agrees with the exact product",
          "[matmul]") {
  if (!detail::onednn_f32_gemm_preferred())
    WARN("oneDNN's f32 GEMM is not used here (not built in, no AVX-512, OpenBLAS runs an AVX-512 kernel, or "
         "TANDEM_ONEDNN=0): only OpenBLAS is checked");
  check_gemm_routes<float>(f32, 24, detail::onednn_f32_gemm_preferred(), detail::onednn_f32_gemm);
  // A batched product and linear's three GEMMs take the same route.
  Tensor x = randn({3, 20, 30}), w = randn({30, 40});
  require_close(vals(matmul(x, w)), vals(matmul(x.to(f64), w.to(f64))), 1e-4);
}

TEST_CASE("bf16 GEMM: the oneDNN route and the f32 route agree with the exact product", "[matmul][bf16]") {
  if (!detail::onednn_bf16_available())
    WARN("oneDNN's bf16 GEMM is not used here (not built in, no AVX512_BF16, or TANDEM_ONEDNN=0): "
         "only the f32 route is checked");
  check_gemm_routes<BFloat16>(bf16, 8, detail::onednn_bf16_available(), detail::onednn_bf16_gemm);
  // Operands with no unit stride are not oneDNN's: the caller copies them (the f32 route here).
  Tensor s = randn({8, 8}).to(bf16);
  Tensor strided = s.slice(0, 0, 8, 2).slice(1, 0, 8, 2);
  Tensor out = zeros({4, 4}, bf16);
  REQUIRE_FALSE(detail::onednn_bf16_gemm(4, 4, 4, strided.data_ptr<BFloat16>(), strided.stride(0), strided.stride(1),
                                         strided.data_ptr<BFloat16>(), strided.stride(0), strided.stride(1),
                                         out.data_ptr<BFloat16>(), 4, false, "test"));
}
