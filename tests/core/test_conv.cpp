// Convolution and pooling on the CPU (core/cpu/conv.cpp, core/cpu/pool.cpp, autograd/conv_grad.cpp, nn::Conv2d and the
// pooling/BatchNorm2d/Flatten modules): against naive loop references, against values printed by
// PyTorch 1.13, finite-difference gradients in f64, and the argument errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "core/cpu/onednn.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using test_util::leaf;
using test_util::require_close;
using test_util::require_gradcheck;
using test_util::vals;
using Catch::Contains;

namespace {

// f(a * i + b) for the row-major index i: inputs both this test and the PyTorch script that
// printed the references below can build exactly.
Tensor seq(const Shape& shape, double a, double b, double (*f)(double) = std::sin) {
  std::vector<double> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = f(a * static_cast<double>(i) + b);
  return from_vector(v, shape);
}

std::vector<double> at(const Tensor& t, std::initializer_list<int64_t> flat_indices) {
  auto v = vals(t);
  std::vector<double> out;
  for (int64_t i : flat_indices) out.push_back(v[static_cast<size_t>(i)]);
  return out;
}

struct ConvCase {
  Shape x, w;
  bool bias;
  Size2 stride, padding, dilation;
  int64_t groups;
};

// The definition: seven loops over n, o, oh, ow, c, i, j.
std::vector<double> naive_conv2d(const Tensor& xt, const Tensor& wt, const Tensor& bt, Size2 s, Size2 p, Size2 d,
                                 int64_t groups) {
  const auto x = vals(xt.contiguous()), w = vals(wt.contiguous());
  const auto b = bt.defined() ? vals(bt) : std::vector<double>();
  const int64_t N = xt.size(0), C = xt.size(1), H = xt.size(2), W = xt.size(3);
  const int64_t O = wt.size(0), Cg = wt.size(1), kh = wt.size(2), kw = wt.size(3);
  const int64_t OH = (H + 2 * p.h - d.h * (kh - 1) - 1) / s.h + 1, OW = (W + 2 * p.w - d.w * (kw - 1) - 1) / s.w + 1;
  const int64_t Og = O / groups;
  std::vector<double> y;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[o];
          const int64_t g = o / Og;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t i = 0; i < kh; ++i)
              for (int64_t j = 0; j < kw; ++j) {
                const int64_t ih = oh * s.h - p.h + i * d.h, iw = ow * s.w - p.w + j * d.w;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[((n * C + g * Cg + c) * H + ih) * W + iw] * w[((o * Cg + c) * kh + i) * kw + j];
              }
          y.push_back(acc);
        }
  (void)C;
  return y;
}

int64_t pool_out(int64_t in, int64_t k, int64_t p, int64_t s, int64_t d, bool ceil_mode) {
  const double span = static_cast<double>(in + 2 * p - d * (k - 1) - 1) / static_cast<double>(s);
  int64_t n = static_cast<int64_t>(ceil_mode ? std::ceil(span) : std::floor(span)) + 1;
  if (ceil_mode && (n - 1) * s >= in + p) --n;
  return n;
}

struct PoolCase {
  Shape x;
  Size2 kernel, stride, padding, dilation;
  bool ceil_mode;
};

// Max over each window's in-range positions in row-major order, the first maximum kept, a NaN
// taken; with the index h * W + w.
std::pair<std::vector<double>, std::vector<double>> naive_max_pool(const Tensor& xt, const PoolCase& c) {
  const auto x = vals(xt);
  const int64_t P = xt.size(0) * xt.size(1), H = xt.size(2), W = xt.size(3);
  const int64_t OH = pool_out(H, c.kernel.h, c.padding.h, c.stride.h, c.dilation.h, c.ceil_mode);
  const int64_t OW = pool_out(W, c.kernel.w, c.padding.w, c.stride.w, c.dilation.w, c.ceil_mode);
  std::vector<double> y, idx;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double m = -std::numeric_limits<double>::infinity();
        int64_t best = -1;
        for (int64_t i = 0; i < c.kernel.h; ++i)
          for (int64_t j = 0; j < c.kernel.w; ++j) {
            const int64_t ih = oh * c.stride.h - c.padding.h + i * c.dilation.h;
            const int64_t iw = ow * c.stride.w - c.padding.w + j * c.dilation.w;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            const double v = x[(p * H + ih) * W + iw];
            if (best < 0 || v > m || std::isnan(v)) {
              m = v;
              best = ih * W + iw;
            }
          }
        y.push_back(m);
        idx.push_back(static_cast<double>(best));
      }
  return {y, idx};
}

// The mean over each window, dividing by the window's positions inside the padded input
// (count_include_pad), the positions inside the input, or the override.
std::vector<double> naive_avg_pool(const Tensor& xt, const PoolCase& c, bool count_include_pad,
                                   std::optional<int64_t> divisor) {
  const auto x = vals(xt);
  const int64_t P = xt.size(0) * xt.size(1), H = xt.size(2), W = xt.size(3);
  const int64_t OH = pool_out(H, c.kernel.h, c.padding.h, c.stride.h, 1, c.ceil_mode);
  const int64_t OW = pool_out(W, c.kernel.w, c.padding.w, c.stride.w, 1, c.ceil_mode);
  std::vector<double> y;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        double s = 0;
        int64_t inside = 0, padded = 0;
        for (int64_t i = 0; i < c.kernel.h; ++i)
          for (int64_t j = 0; j < c.kernel.w; ++j) {
            const int64_t ih = oh * c.stride.h - c.padding.h + i, iw = ow * c.stride.w - c.padding.w + j;
            if (ih < H + c.padding.h && iw < W + c.padding.w) ++padded;
            if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
            ++inside;
            s += x[(p * H + ih) * W + iw];
          }
        const double div = divisor ? static_cast<double>(*divisor)
                                   : static_cast<double>(count_include_pad ? padded : inside);
        y.push_back(inside == 0 ? 0.0 : s / div);
      }
  return y;
}

std::vector<double> naive_adaptive_avg_pool(const Tensor& xt, int64_t OH, int64_t OW) {
  const auto x = vals(xt);
  const int64_t P = xt.size(0) * xt.size(1), H = xt.size(2), W = xt.size(3);
  std::vector<double> y;
  for (int64_t p = 0; p < P; ++p)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const auto h0 = static_cast<int64_t>(std::floor(static_cast<double>(oh * H) / OH));
        const auto h1 = static_cast<int64_t>(std::ceil(static_cast<double>((oh + 1) * H) / OH));
        const auto w0 = static_cast<int64_t>(std::floor(static_cast<double>(ow * W) / OW));
        const auto w1 = static_cast<int64_t>(std::ceil(static_cast<double>((ow + 1) * W) / OW));
        double s = 0;
        for (int64_t ih = h0; ih < h1; ++ih)
          for (int64_t iw = w0; iw < w1; ++iw) s += x[(p * H + ih) * W + iw];
        y.push_back(s / static_cast<double>((h1 - h0) * (w1 - w0)));
      }
  return y;
}

const ConvCase kConvCases[] = {
    {{2, 3, 7, 6}, {4, 3, 3, 3}, true, 1, 0, 1, 1},
    {{2, 3, 7, 6}, {4, 3, 3, 3}, false, 1, 1, 1, 1},
    {{1, 4, 9, 8}, {6, 2, 3, 2}, true, {2, 1}, {1, 2}, {1, 2}, 2},
    {{3, 2, 5, 5}, {5, 2, 1, 1}, true, 1, 0, 1, 1},       // 1x1: the input is its own column matrix
    {{2, 4, 6, 7}, {4, 1, 3, 3}, true, 2, 1, 1, 4},       // depthwise
    {{1, 2, 8, 8}, {3, 2, 3, 3}, true, 3, 2, 2, 1},       // stride and dilation
    {{2, 2, 5, 6}, {2, 2, 1, 1}, false, 2, 1, 1, 1},      // 1x1 with stride and padding
    {{1, 1, 4, 4}, {2, 1, 4, 4}, true, 1, 0, 1, 1},       // kernel covers the input
    {{2, 6, 4, 5}, {6, 2, 2, 3}, true, {1, 2}, {0, 1}, {2, 1}, 3},
    // Stride 1, output as wide as the input: im2col/col2im shift whole planes.
    {{1, 2, 7, 6}, {3, 2, 3, 3}, true, 1, 2, 2, 1},          // dilated
    {{2, 3, 6, 5}, {2, 3, 5, 3}, true, 1, {2, 1}, 1, 1},     // 5x3
    {{1, 2, 6, 5}, {2, 2, 3, 1}, false, 1, 0, 1, 1},         // fewer output rows than input rows
    {{1, 1, 3, 2}, {2, 1, 3, 3}, true, 1, 1, 1, 1},          // a kernel wider than the input
    {{1, 2, 4, 4}, {2, 1, 3, 3}, true, 1, {3, 1}, {1, 1}, 2},  // rows entirely in the padding
};

}  // namespace

// ---- conv2d ----

TEST_CASE("conv2d matches the 7-loop definition", "[conv]") {
  manual_seed(11);
  for (const ConvCase& c : kConvCases) {
    INFO("x " << fmt::format("{}", c.x) << " w " << fmt::format("{}", c.w) << " groups " << c.groups);
    Tensor x = randn(c.x, f64), w = randn(c.w, f64);
    Tensor b = c.bias ? randn({c.w[0]}, f64) : Tensor();
    Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    require_close(vals(y), naive_conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups), 1e-12);
    // f32 through the same path.
    Tensor yf = conv2d(x.to(f32), w.to(f32), c.bias ? b.to(f32) : Tensor(), c.stride, c.padding, c.dilation, c.groups);
    REQUIRE(yf.dtype() == f32);
    require_close(vals(yf), vals(y), 1e-5);
  }
  // Non-contiguous input, weight and bias give what their contiguous copies give.
  Tensor x = randn({2, 8, 6, 3}, f64).permute({0, 3, 2, 1});  // [2, 3, 6, 8]
  Tensor w = randn({3, 3, 4, 2}, f64).transpose(0, 1);       // [3, 3, 4, 2]
  Tensor b = randn({6}, f64).slice(0, 0, 6, 2);
  require_close(vals(conv2d(x, w, b, 1, 1)), naive_conv2d(x, w, b, 1, 1, 1, 1), 1e-12);
  // An empty batch gives an empty output of the right shape.
  REQUIRE(conv2d(zeros({0, 3, 5, 5}), zeros({2, 3, 3, 3})).shape() == Shape{0, 2, 3, 3});
}

TEST_CASE("conv2d's f32 gradients (oneDNN's kernels where built) match the f64 im2col path", "[conv]") {
  // f32 runs on oneDNN's direct kernels where the build has oneDNN and it takes the geometry
  // (strides, dilation, groups, a negative right padding), f64 on im2col + GEMM: every geometry's
  // forward and gradients must agree. One larger case reaches oneDNN's blocked (16-channel) layouts.
  manual_seed(13);
  std::vector<ConvCase> cases(std::begin(kConvCases), std::end(kConvCases));
  cases.push_back({{3, 32, 12, 10}, {48, 32, 3, 3}, true, 1, 1, 1, 1});
  cases.push_back({{2, 32, 11, 11}, {32, 16, 3, 3}, true, 2, 0, 1, 2});
  cases.push_back({{2, 32, 9, 12}, {16, 32, 3, 2}, false, {1, 2}, {2, 1}, {2, 1}, 1});
  cases.push_back({{2, 32, 10, 10}, {16, 32, 3, 3}, true, 2, 0, 1, 1});  // the last row unread: right padding -1
  for (const ConvCase& c : cases) {
    INFO("x " << fmt::format("{}", c.x) << " w " << fmt::format("{}", c.w) << " groups " << c.groups);
    Tensor x = randn(c.x, f64), w = randn(c.w, f64), b = c.bias ? randn({c.w[0]}, f64) : Tensor();
    auto grads = [&](Dtype dt) {
      Tensor xl = leaf(x.detach().to(dt)), wl = leaf(w.detach().to(dt)), bl = c.bias ? leaf(b.detach().to(dt)) : Tensor();
      Tensor y = conv2d(xl, wl, bl, c.stride, c.padding, c.dilation, c.groups);
      sum(y * seq(y.shape(), 0.17, 0.2).to(dt)).backward();
      TensorList out{y, xl.grad(), wl.grad()};
      if (c.bias) out.push_back(bl.grad());
      return out;
    };
    const TensorList want = grads(f64);
    const int64_t runs_before = detail::onednn_conv_runs();
    const TensorList got = grads(f32);
    const int64_t onednn_runs = detail::onednn_conv_runs() - runs_before;
    INFO("oneDNN ran " << onednn_runs << " of the 2 calls");
    // The common geometries all take the fast path (what rejects one: a stride beyond the kernel
    // with a negative right padding, some depthwise shapes): each stride, dilation and group count
    // below runs on it at least once.
    if (detail::onednn_conv_available() && c.x[1] == 32) REQUIRE(onednn_runs == 2);
    for (size_t i = 0; i < want.size(); ++i) {
      INFO("result " << i);
      REQUIRE(got[i].dtype() == f32);
      require_close(vals(got[i]), vals(want[i]), 2e-4);
    }
  }
}

TEST_CASE("conv2d agrees with PyTorch 1.13", "[conv]") {
  // torch.nn.functional.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
  // with x = sin(0.37 i + 0.1) [2, 4, 5, 6], w = cos(0.23 i + 0.4) [6, 2, 3, 2], b = sin(0.5 i + 0.2),
  // then (y * sin(0.11 i + 0.3)).sum().backward().
  Tensor x = leaf(seq({2, 4, 5, 6}, 0.37, 0.1));
  Tensor w = leaf(seq({6, 2, 3, 2}, 0.23, 0.4, std::cos));
  Tensor b = leaf(seq({6}, 0.5, 0.2));
  Tensor y = conv2d(x, w, b, {2, 1}, {1, 2}, {1, 2}, 2);
  REQUIRE(y.shape() == Shape{2, 6, 3, 8});
  require_close(at(y, {0, 7, 31, 100, 143, 200, 287}),
                {0.289736605149, -0.079677872488, 0.746033985216, -0.220908793799, 0.694836563588, 1.607975023057,
                 0.47376270046},
                1e-10);
  REQUIRE(sum(y).item<double>() == Approx(222.7894410460857).epsilon(1e-12));
  sum(y * seq(y.shape(), 0.11, 0.3)).backward();
  require_close(at(x.grad(), {0, 13, 77, 150, 239}),
                {-0.749707426899, 3.136244708716, -0.399508848744, 0.671328420081, -2.306794123681}, 1e-10);
  REQUIRE(sum(x.grad()).item<double>() == Approx(-32.98985768416884).epsilon(1e-12));
  require_close(
      vals(w.grad()),
      {2.117029108817,  2.132118808671,  -1.740225865819, -1.375290060761, 1.582372881671,  1.230279047806,
       -0.07709687997,  -0.47992219293,  0.397077724779,  0.996159152166,  -1.478375355457, -1.687619776647,
       -2.001920458826, -1.789501014025, 0.814217084838,  0.328785835572,  -0.695720560655, -0.237632928673,
       0.959234145083,  1.28285817177,   -1.68920026582,  -2.140497943526, 1.835800493546,  1.851140048317,
       1.393610238073,  1.00601419928,   0.312385652518,  0.798719455285,  -0.362332413076, -0.813557441392,
       -1.605050439001, -1.769743798763, 2.565164302279,  2.757494630305,  -1.740950076414, -1.558605647332,
       0.828771651203,  0.354231514323,  0.776395629562,  1.167586791173,  -1.077369159381, -1.480425966101,
       -1.682664006519, -1.746780505282, 2.971020429662,  2.938552521774,  -1.441793214303, -1.190714024534,
       0.27485477778,   0.753763265387,  -1.583894573785, -1.823663087624, 1.889920131806,  2.107496223827,
       1.706014608902,  1.580112965053,  -2.691283322553, -2.34898789378,  0.787556640392,  0.427607012355,
       -1.31076682404,  -1.676057746749, 2.001178568025,  2.030454051388,  -2.236862406587, -2.21535481988,
       -1.3090642542,   -1.024162127922, 1.748510301006,  1.180716697397,  0.060705710313,  0.440847067553},
      1e-10);
  require_close(vals(b.grad()),
                {0.139934410773, 0.993211258267, -1.881665211152, 2.306544183475, -2.163173198959, 1.486873738262},
                1e-10);
}

TEST_CASE("gradcheck: conv2d", "[conv]") {
  manual_seed(12);
  for (const ConvCase& c : kConvCases) {
    INFO("x " << fmt::format("{}", c.x) << " w " << fmt::format("{}", c.w) << " groups " << c.groups);
    TensorList in{leaf(randn(c.x, f64)), leaf(randn(c.w, f64))};
    if (c.bias) in.push_back(leaf(randn({c.w[0]}, f64)));
    require_gradcheck(
        [&c](const TensorList& t) {
          return conv2d(t[0], t[1], t.size() > 2 ? t[2] : Tensor(), c.stride, c.padding, c.dilation, c.groups);
        },
        in);
  }
  // Only some inputs need grad; a transposed input.
  Tensor x = randn({1, 2, 5, 5}, f64), w = leaf(randn({3, 2, 3, 3}, f64)), b = randn({3}, f64);
  require_gradcheck([](const TensorList& t) { return conv2d(t[0], t[1], t[2], 1, 1); }, {x, w, b});
  require_gradcheck([](const TensorList& t) { return conv2d(t[0], t[1], t[2], 2, 1); },
                    {leaf(randn({1, 2, 5, 5}, f64)), randn({3, 2, 3, 3}, f64), leaf(randn({3}, f64))});
  require_gradcheck([](const TensorList& t) { return conv2d(t[0].transpose(2, 3), t[1], Tensor(), 1, 1); },
                    {leaf(randn({2, 2, 4, 6}, f64)), leaf(randn({2, 2, 2, 3}, f64))});
}

TEST_CASE("conv2d on an unbatched [C, H, W] input and in f16/bf16", "[conv]") {
  manual_seed(13);
  Tensor x = randn({3, 6, 6}, f64), w = randn({2, 3, 3, 3}, f64), b = randn({2}, f64);
  Tensor y = conv2d(x, w, b, 1, 1);
  REQUIRE(y.shape() == Shape{2, 6, 6});
  require_close(vals(y), vals(conv2d(x.unsqueeze(0), w, b, 1, 1)), 0);
  Tensor xl = leaf(x.clone());
  sum(conv2d(xl, w, b, 1, 1)).backward();
  REQUIRE(xl.grad().shape() == x.shape());
  // The CPU computes the 2-byte floats in f32 and rounds once.
  Tensor xf = randn({2, 4, 7, 7}), wf = randn({3, 4, 3, 3}), bf = randn({3});
  Tensor ref = conv2d(xf, wf, bf, 2, 1);
  for (Dtype dt : {f16, bf16}) {
    INFO("dtype " << dt);
    Tensor xd = leaf(xf.to(dt)), wd = leaf(wf.to(dt)), bd = leaf(bf.to(dt));
    Tensor yd = conv2d(xd, wd, bd, 2, 1);
    REQUIRE(yd.dtype() == dt);
    require_close(vals(yd), vals(conv2d(xd.to(f32), wd.to(f32), bd.to(f32), 2, 1).to(dt)), 0);
    require_close(vals(yd), vals(ref), dt == f16 ? 2e-2 : 1e-1);
    sum(yd).backward();
    REQUIRE(xd.grad().dtype() == dt);
    REQUIRE(wd.grad().shape() == wf.shape());
    REQUIRE(bd.grad().shape() == Shape{3});
  }
}

TEST_CASE("conv2d errors name the op and the shapes", "[conv]") {
  Tensor x = zeros({2, 3, 8, 8}), w = zeros({4, 3, 3, 3});
  REQUIRE_THROWS_WITH(conv2d(x, zeros({4, 2, 3, 3})),
                      "[conv2d] input [2, 3, 8, 8] has 3 channels but weight [4, 2, 3, 3] expects 2 x groups 1");
  REQUIRE_THROWS_WITH(conv2d(zeros({2, 4, 8, 8}), zeros({4, 1, 3, 3}), Tensor(), 1, 0, 1, 3),
                      Contains("[conv2d] groups 3 does not divide the 4 input channels of input [2, 4, 8, 8]"));
  REQUIRE_THROWS_WITH(conv2d(zeros({2, 4, 8, 8}), zeros({3, 2, 3, 3}), Tensor(), 1, 0, 1, 2),
                      Contains("[conv2d] groups 2 does not divide the 3 output channels of weight [3, 2, 3, 3]"));
  REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), 0), Contains("[conv2d] stride must be positive, got [0, 0]"));
  REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), {1, -2}), Contains("[conv2d] stride must be positive, got [1, -2]"));
  REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), 1, -1), Contains("[conv2d] padding must be non-negative"));
  REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), 1, 0, 0), Contains("[conv2d] dilation must be positive"));
  REQUIRE_THROWS_WITH(conv2d(x, w, Tensor(), 1, 0, 1, 0), Contains("[conv2d] groups must be positive, got 0"));
  REQUIRE_THROWS_WITH(conv2d(zeros({1, 3, 2, 2}), w),
                      Contains("[conv2d] kernel 3x3 (dilation [1, 1], so 3x3 in effect) is larger than the padded "
                               "input 2x2 (input [1, 3, 2, 2], padding [0, 0])"));
  REQUIRE_THROWS_WITH(conv2d(zeros({1, 3, 4, 4}), w, Tensor(), 1, 0, 2),
                      Contains("[conv2d] kernel 3x3 (dilation [2, 2], so 5x5 in effect) is larger than the padded"));
  REQUIRE_THROWS_WITH(conv2d(x, w, zeros({3})),
                      Contains("[conv2d] bias must have shape [4] (out_channels of weight [4, 3, 3, 3]), got [3]"));
  REQUIRE_THROWS_WITH(conv2d(x, w, zeros({4}, f64)), Contains("[conv2d] bias has dtype f64 but input has f32"));
  REQUIRE_THROWS_WITH(conv2d(x, w.to(f64)), Contains("[conv2d] weight has dtype f64 but input has f32"));
  REQUIRE_THROWS_WITH(conv2d(zeros({8, 8}), w), Contains("[conv2d] expected input [N, C, H, W] or [C, H, W], got [8, 8]"));
  REQUIRE_THROWS_WITH(conv2d(x, zeros({4, 3, 3})), Contains("[conv2d] expected weight [out_channels, in_channels / "
                                                            "groups, kh, kw], got [4, 3, 3]"));
  REQUIRE_THROWS_WITH(conv2d(zeros({2, 3, 8, 8}, i64), zeros({4, 3, 3, 3}, i64)),
                      Contains("[conv2d] input must be floating, got i64"));
}

// ---- pooling ----

namespace {
const PoolCase kPoolCases[] = {
    {{2, 3, 6, 7}, 2, 2, 0, 1, false},
    {{1, 2, 7, 7}, 3, 2, 1, 1, false},
    {{1, 2, 7, 7}, 3, 2, 1, 1, true},
    {{2, 1, 6, 8}, {2, 3}, {1, 2}, {1, 1}, 1, false},
    {{1, 2, 9, 8}, 3, 2, 1, {2, 1}, false},  // dilation (max only)
    {{1, 1, 5, 6}, {3, 2}, {2, 3}, {1, 0}, 1, true},
    {{1, 1, 4, 4}, 4, 1, 2, 1, false},  // every window reaches into the padding
    {{2, 2, 5, 5}, 2, 2, 0, 1, true},   // 2x2/2 whose last windows stick out: the clipped walk
};
}  // namespace

TEST_CASE("max_pool2d matches the definition, first maximum and NaN included", "[conv][pool]") {
  manual_seed(14);
  for (const PoolCase& c : kPoolCases) {
    INFO("x " << fmt::format("{}", c.x) << " kernel " << fmt::format("{}", c.kernel) << " stride "
              << fmt::format("{}", c.stride) << " ceil " << c.ceil_mode);
    // Few distinct values, so many windows tie.
    Tensor x = to_dtype(randint(0, 4, c.x), f64);
    auto [y, idx] = max_pool2d_with_indices(x, c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode);
    auto [want_y, want_idx] = naive_max_pool(x, c);
    require_close(vals(y), want_y, 0);
    require_close(vals(idx), want_idx, 0);
    REQUIRE(idx.dtype() == i64);
    require_close(vals(max_pool2d(x.to(f32), c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode)), want_y, 0);
  }
  Tensor x = from_vector<double>({1, std::nan(""), 3, 2}, {1, 1, 2, 2});
  auto [y, idx] = max_pool2d_with_indices(x, 2);
  REQUIRE(std::isnan(y.item<double>()));
  REQUIRE(idx.item<int64_t>() == 1);
  // The last NaN of a window wins; a window of -inf keeps its first position (2x2/2 and the
  // general walk alike: a 3x3 window with padding 1 holds the same four values).
  const double inf = std::numeric_limits<double>::infinity();
  for (int64_t k : {2, 3}) {
    INFO("kernel " << k);
    const int64_t pad = k == 3 ? 1 : 0;
    auto [yn, in] = max_pool2d_with_indices(from_vector<double>({std::nan(""), 5, std::nan(""), 7}, {1, 1, 2, 2}), k,
                                            2, pad);
    REQUIRE(std::isnan(yn.item<double>()));
    REQUIRE(in.item<int64_t>() == 2);
    auto [yi, ii] = max_pool2d_with_indices(from_vector<double>({-inf, -inf, -inf, -inf}, {1, 1, 2, 2}), k, 2, pad);
    REQUIRE(yi.item<double>() == -inf);
    REQUIRE(ii.item<int64_t>() == 0);
  }
  // Stride defaults to the kernel size.
  REQUIRE(max_pool2d(zeros({1, 1, 6, 6}), 2).shape() == Shape{1, 1, 3, 3});
  REQUIRE(max_pool2d(zeros({1, 1, 6, 6}), 2, 1).shape() == Shape{1, 1, 5, 5});
}

TEST_CASE("max_pool2d 2x2/2 in f32 (AVX-512 where the CPU has it) equals the f64 walk, indices and gradients too",
          "[conv][pool]") {
  // f32's 2x2/2 pool runs 16 outputs of a row at a time on AVX-512 CPUs, with masked tails; f64
  // keeps the scalar walk. Widths around the 16-lane steps, odd input sizes (an unused last row
  // and column), few distinct values (ties: the first maximum in row-major order), signed zeros,
  // and a NaN in some planes (the plane is rewritten by the general rule).
  manual_seed(29);
  for (int64_t ow : {1, 7, 8, 9, 14, 15, 16, 17, 31, 33}) {
    for (int64_t extra : {0, 1}) {
      INFO("output width " << ow << ", input " << 2 * ow + extra << " wide");
      const Shape shape{2, 3, 2 * 3 + extra, 2 * ow + extra};
      Tensor xd = to_dtype(randint(-2, 3, shape), f64) * 0.5;
      std::vector<double> v = vals(xd);
      for (size_t i = 0; i < v.size(); i += 5) v[i] = -0.0 * (i % 2 ? 1 : -1);
      v[v.size() / 3] = std::nan("");  // one plane with a NaN
      xd = from_vector<double>(v, shape);
      Tensor xf = leaf(xd.to(f32));
      Tensor xl = leaf(xd);
      auto [yd, id] = max_pool2d_with_indices(xl, 2);
      auto [yf, jf] = max_pool2d_with_indices(xf, 2);
      const std::vector<double> a = vals(yd), b = vals(yf);
      REQUIRE(a.size() == b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        INFO("output " << i);
        REQUIRE((std::isnan(a[i]) ? std::isnan(b[i]) : (a[i] == b[i] && std::signbit(a[i]) == std::signbit(b[i]))));
      }
      require_close(vals(jf), vals(id), 0);
      // Backward scatters through the indices: the same gradient at each input.
      Tensor g = to_dtype(randint(1, 9, yd.shape()), f64);
      sum(yd * g).backward();
      sum(yf * g.to(f32)).backward();
      require_close(vals(xf.grad()), vals(xl.grad()), 0);
    }
  }
}

TEST_CASE("max_pool2d agrees with PyTorch 1.13, ties and overlapping windows", "[conv][pool]") {
  // x[i] = (7 i) % 5 as [1, 2, 5, 5]; max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True),
  // then y.sum().backward().
  std::vector<double> xv;
  for (int i = 0; i < 50; ++i) xv.push_back((i * 7) % 5);
  Tensor x = leaf(from_vector(xv, {1, 2, 5, 5}));
  auto [y, idx] = max_pool2d_with_indices(x, 3, 2, 1, 1, true);
  REQUIRE(y.shape() == Shape{1, 2, 3, 3});
  require_close(vals(y), {2, 4, 3, 2, 4, 3, 2, 4, 3, 2, 4, 3, 2, 4, 3, 2, 4, 3}, 0);
  require_close(vals(idx), {1, 2, 4, 6, 7, 9, 16, 17, 19, 1, 2, 4, 6, 7, 9, 16, 17, 19}, 0);
  sum(y).backward();
  require_close(vals(x.grad()), {0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0,
                                 0, 1, 1, 0, 1, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0, 1, 0, 0, 0, 0, 0},
                0);
  // sin(0.9 i) as [1, 1, 6, 7]; max_pool2d(x, (2, 3), (1, 2), (1, 1), dilation=(2, 2)).
  auto [yd, idd] = max_pool2d_with_indices(seq({1, 1, 6, 7}, 0.9, 0.0), {2, 3}, Size2{1, 2}, {1, 1}, {2, 2});
  REQUIRE(yd.shape() == Shape{1, 1, 6, 3});
  require_close(vals(yd), {0.793667863849, 0.793667863849, 0.412118485242, 0.803784426552, 0.803784426552,
                           0.427379880234, 0.813673737507, 0.813673737507, 0.412118485242, 0.823333000738,
                           0.823333000738, 0.396740573131, 0.832759485308, 0.832759485308, 0.381250491655,
                           0.823333000738, 0.823333000738, 0.365652620283},
                1e-11);
  require_close(vals(idd), {8, 8, 10, 15, 15, 3, 22, 22, 10, 29, 29, 17, 36, 36, 24, 29, 29, 31}, 0);
}

TEST_CASE("avg_pool2d matches the definition", "[conv][pool]") {
  manual_seed(15);
  for (const PoolCase& c : kPoolCases) {
    if (c.dilation != Size2(1)) continue;
    for (bool cip : {true, false}) {
      for (std::optional<int64_t> div : {std::optional<int64_t>(), std::optional<int64_t>(5)}) {
        INFO("x " << fmt::format("{}", c.x) << " kernel " << fmt::format("{}", c.kernel) << " ceil " << c.ceil_mode
                  << " count_include_pad " << cip << " divisor " << div.value_or(0));
        Tensor x = randn(c.x, f64);
        Tensor y = avg_pool2d(x, c.kernel, c.stride, c.padding, c.ceil_mode, cip, div);
        require_close(vals(y), naive_avg_pool(x, c, cip, div), 1e-12);
      }
    }
  }
}

TEST_CASE("avg_pool2d agrees with PyTorch 1.13", "[conv][pool]") {
  Tensor x = seq({1, 1, 5, 5}, 0.61, 0.2);
  // avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=True / False)
  require_close(vals(avg_pool2d(x, 3, 2, 1, true, true)),
                {0.01739721117, 0.005244699461, -0.012773913066, -0.06648038848, -0.274728576987, -0.175697856116,
                 -0.019078620009, -0.012193080302, 0.008330197634},
                1e-10);
  require_close(vals(avg_pool2d(x, 3, 2, 1, true, false)),
                {0.039143725133, 0.007867049192, -0.028741304399, -0.099720582719, -0.274728576987, -0.263546784174,
                 -0.04292689502, -0.018289620453, 0.018742944677},
                1e-10);
  // avg_pool2d(x, (2, 3), (2, 1), (1, 0), divisor_override=4)
  require_close(vals(avg_pool2d(x, {2, 3}, Size2{2, 1}, {1, 0}, false, true, 4)),
                {0.477902067004, 0.652336169593, 0.591470029748, -0.047255613976, -0.017170408466, 0.019108231446,
                 -0.053321496576, -0.02743443068, 0.008348343121},
                1e-10);
  Tensor xg = leaf(x.clone());
  sum(avg_pool2d(xg, 3, 2, 1, true, false)).backward();
  require_close(vals(xg.grad()),
                {0.25, 0.416666666667, 0.166666666667, 0.416666666667, 0.25, 0.416666666667, 0.694444444444,
                 0.277777777778, 0.694444444444, 0.416666666667, 0.166666666667, 0.277777777778, 0.111111111111,
                 0.277777777778, 0.166666666667, 0.416666666667, 0.694444444444, 0.277777777778, 0.694444444444,
                 0.416666666667, 0.25, 0.416666666667, 0.166666666667, 0.416666666667, 0.25},
                1e-10);
}

TEST_CASE("adaptive_avg_pool2d matches the definition and PyTorch 1.13", "[conv][pool]") {
  manual_seed(16);
  const std::pair<Shape, Size2> cases[] = {
      {{2, 3, 7, 5}, {3, 2}}, {{1, 2, 5, 7}, {3, 4}}, {{1, 1, 4, 4}, {4, 4}}, {{1, 2, 3, 5}, {5, 7}},  // upsampling
      {{2, 2, 6, 6}, 1},
  };
  for (const auto& [shape, out] : cases) {
    INFO("x " << fmt::format("{}", shape) << " output " << fmt::format("{}", out));
    Tensor x = randn(shape, f64);
    Tensor y = adaptive_avg_pool2d(x, out);
    REQUIRE(y.shape() == Shape{shape[0], shape[1], out.h, out.w});
    require_close(vals(y), naive_adaptive_avg_pool(x, out.h, out.w), 1e-12);
  }
  // adaptive_avg_pool2d(sin(0.29 i + 0.5) [1, 2, 5, 7], (3, 4)), then (y * sin(0.7 i)).sum().backward().
  Tensor x = leaf(seq({1, 2, 5, 7}, 0.29, 0.5));
  Tensor y = adaptive_avg_pool2d(x, {3, 4});
  require_close(vals(y), {0.520007230898,  0.444057233555,  0.230740455832,  0.016491244948,  -0.037445565068,
                          -0.033477622271, -0.019641662809, -0.004786967633, 0.519263152511,  0.485086211599,
                          0.314397490455,  0.116367043565,  -0.358298386592, -0.162018558548, 0.131185405963,
                          0.333784462452,  0.028205998203,  0.014933159044,  -0.005935319469, -0.021052258209,
                          -0.42453553549,  -0.252438798351, 0.033544428646,  0.250503381017},
                1e-10);
  sum(y * seq({1, 2, 3, 4}, 0.7, 0.0)).backward();
  require_close(
      vals(x.grad()),
      {0.0,             0.10736961454,   0.10736961454,   0.271611236204,  0.164241621665,  0.380043963327,
       0.215802341662,  0.055831358359,  0.124225058711,  0.068393700352,  0.135793569526,  0.067399869174,
       0.119460108733,  0.052060239558,  0.055831358359,  0.016855444172,  -0.038975914188, -0.135817666678,
       -0.09684175249,  -0.260583854594, -0.163742102104, -0.101985301109, -0.138158898549, -0.03617359744,
       -0.023517583478, 0.012656013963,  0.095955970328,  0.083299956365,  -0.157816659468, -0.155014342721,
       0.002802316747,  0.112300083201,  0.109497766453,  0.356539824922,  0.247042058469,  0.213649727022,
       0.266832787414,  0.053183060392,  -0.007896794484, -0.061079854875, -0.281003794868, -0.219923939993,
       0.05045343883,   0.034954597862,  -0.015498840968, -0.072842801708, -0.05734396074,  -0.165672940366,
       -0.108328979627, -0.163196288192, -0.231878189552, -0.06868190136,  -0.064946007224, 0.003735894136,
       0.115330854502,  0.111594960366,  0.084455550732,  0.156731454563,  0.072275903831,  0.126531524091,
       0.05425562026,   0.07033272633,   0.01607710607,   0.247651838924,  0.388609644114,  0.14095780519,
       0.191477531315,  0.050519726124,  -0.044998128172, -0.095517854296},
      1e-10);
}

TEST_CASE("gradcheck: pooling", "[conv][pool]") {
  manual_seed(17);
  for (const PoolCase& c : kPoolCases) {
    INFO("x " << fmt::format("{}", c.x) << " kernel " << fmt::format("{}", c.kernel) << " ceil " << c.ceil_mode);
    // Distinct values (ties would make the maximum non-differentiable).
    Tensor x = leaf(randn(c.x, f64));
    require_gradcheck(
        [&c](const TensorList& t) { return max_pool2d(t[0], c.kernel, c.stride, c.padding, c.dilation, c.ceil_mode); },
        {x});
    if (c.dilation != Size2(1)) continue;
    for (bool cip : {true, false}) {
      require_gradcheck(
          [&c, cip](const TensorList& t) { return avg_pool2d(t[0], c.kernel, c.stride, c.padding, c.ceil_mode, cip); },
          {x});
    }
    require_gradcheck([&c](const TensorList& t) { return avg_pool2d(t[0], c.kernel, c.stride, c.padding, c.ceil_mode,
                                                                     true, 3); },
                      {x});
  }
  for (Size2 out : {Size2(3, 2), Size2(1), Size2(5, 7)}) {
    require_gradcheck([out](const TensorList& t) { return adaptive_avg_pool2d(t[0], out); },
                      {leaf(randn({2, 2, 4, 5}, f64))});
  }
  // Unbatched and non-contiguous inputs.
  require_gradcheck([](const TensorList& t) { return max_pool2d(t[0].transpose(1, 2), 2); },
                    {leaf(randn({2, 6, 4}, f64))});
  require_gradcheck([](const TensorList& t) { return avg_pool2d(t[0].transpose(2, 3), 3, 1, 1); },
                    {leaf(randn({1, 2, 5, 4}, f64))});
}

TEST_CASE("pooling in f32, f16 and bf16 accumulates in f32", "[conv][pool]") {
  manual_seed(18);
  Tensor x = randn({2, 3, 9, 9});
  for (Dtype dt : {f16, bf16}) {
    INFO("dtype " << dt);
    Tensor xd = x.to(dt);
    Tensor xf = xd.to(f32);  // the same values
    require_close(vals(max_pool2d(xd, 3, 2, 1)), vals(max_pool2d(xf, 3, 2, 1)), 0);
    require_close(vals(avg_pool2d(xd, 3, 2, 1)), vals(avg_pool2d(xf, 3, 2, 1).to(dt)), 0);
    require_close(vals(adaptive_avg_pool2d(xd, 4)), vals(adaptive_avg_pool2d(xf, 4).to(dt)), 0);
    Tensor xl = leaf(xd.clone());
    sum(max_pool2d(xl, 3, 2, 1) + avg_pool2d(xl, 3, 2, 1)).backward();
    REQUIRE(xl.grad().dtype() == dt);
  }
}

TEST_CASE("pooling errors name the op and the shapes", "[conv][pool]") {
  Tensor x = zeros({1, 2, 5, 5});
  REQUIRE_THROWS_WITH(max_pool2d(x, 0), Contains("[max_pool2d] kernel_size must be positive, got [0, 0]"));
  REQUIRE_THROWS_WITH(max_pool2d(x, 2, Size2{0, 1}), Contains("[max_pool2d] stride must be positive, got [0, 1]"));
  REQUIRE_THROWS_WITH(max_pool2d(x, 3, 1, 2),
                      Contains("[max_pool2d] padding [2, 2] must be at most half of kernel_size [3, 3]"));
  REQUIRE_THROWS_WITH(max_pool2d(x, 2, 1, 0, 0), Contains("[max_pool2d] dilation must be positive"));
  REQUIRE_THROWS_WITH(max_pool2d(x, 6),
                      Contains("[max_pool2d] input [1, 2, 5, 5] is too small for kernel_size [6, 6] (dilation [1, 1], "
                               "padding [0, 0]): the output would be 0x0"));
  REQUIRE_THROWS_WITH(max_pool2d(zeros({5, 5}), 2),
                      Contains("[max_pool2d] expected input [N, C, H, W] or [C, H, W], got [5, 5]"));
  REQUIRE_THROWS_WITH(avg_pool2d(x, 3, 1, -1), Contains("[avg_pool2d] padding must be non-negative, got [-1, -1]"));
  REQUIRE_THROWS_WITH(avg_pool2d(x, {2, 7}), Contains("[avg_pool2d] input [1, 2, 5, 5] is too small"));
  REQUIRE_THROWS_WITH(avg_pool2d(x, 2, 2, 0, false, true, 0), Contains("[avg_pool2d] divisor_override must be non-zero"));
  REQUIRE_THROWS_WITH(avg_pool2d(zeros({1, 2, 5, 5}, i32), 2), Contains("[avg_pool2d] input must be floating, got i32"));
  REQUIRE_THROWS_WITH(adaptive_avg_pool2d(x, {0, 2}),
                      Contains("[adaptive_avg_pool2d] output_size must be positive, got [0, 2]"));
  REQUIRE_THROWS_WITH(adaptive_avg_pool2d(zeros({1, 2, 0, 5}), 2),
                      Contains("[adaptive_avg_pool2d] expected non-empty channel and spatial dims, got input [1, 2, 0, 5]"));
}

// ---- modules ----

TEST_CASE("nn::Conv2d: PyTorch's init, shapes, unbatched input, repr", "[conv][nn]") {
  manual_seed(19);
  nn::Conv2d conv(4, 8, 3, 1, 1);
  REQUIRE(conv.weight.shape() == Shape{8, 4, 3, 3});
  REQUIRE(conv.bias.shape() == Shape{8});
  REQUIRE(conv.named_parameters().size() == 2);
  // kaiming_uniform(a = sqrt(5)) and the bias both give U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
  const double bound = 1.0 / std::sqrt(4.0 * 9.0);
  REQUIRE(amax(abs(conv.weight), {}).item<double>() <= bound);
  REQUIRE(amax(abs(conv.weight), {}).item<double>() > 0.9 * bound);  // 288 draws fill the range
  REQUIRE(amax(abs(conv.bias), {}).item<double>() <= bound);
  // Var of U(-b, b) is b^2 / 3.
  REQUIRE(var(conv.weight).item<double>() == Approx(bound * bound / 3).epsilon(0.2));
  nn::Conv2d grouped(6, 4, {3, 2}, 2, 0, 1, 2, false);
  REQUIRE(grouped.weight.shape() == Shape{4, 3, 3, 2});
  REQUIRE(!grouped.bias.defined());
  REQUIRE(amax(abs(grouped.weight), {}).item<double>() <= 1.0 / std::sqrt(3.0 * 6.0));

  Tensor x = randn({2, 4, 10, 10});
  Tensor y = conv(x);
  REQUIRE(y.shape() == Shape{2, 8, 10, 10});
  require_close(vals(y), vals(conv2d(x, conv.weight, conv.bias, 1, 1)), 0);
  REQUIRE(conv(randn({4, 5, 5})).shape() == Shape{8, 5, 5});
  sum(y).backward();
  REQUIRE(conv.weight.grad().shape() == conv.weight.shape());
  REQUIRE(conv.bias.grad().shape() == Shape{8});

  REQUIRE(conv.extra_repr() == "4, 8, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1)");
  REQUIRE(grouped.extra_repr() == "6, 4, kernel_size=(3, 2), stride=(2, 2), groups=2, bias=False");
  REQUIRE_THROWS_WITH(conv(randn({2, 3, 10, 10})),
                      Contains("[Conv2d] expected input [N, 4, H, W] or [4, H, W] (in_channels 4), got [2, 3, 10, 10]"));
  REQUIRE_THROWS_WITH(nn::Conv2d(6, 4, 3, 1, 0, 1, 4), Contains("[Conv2d] groups 4 must divide in_channels 6"));
  REQUIRE_THROWS_WITH(nn::Conv2d(0, 4, 3), Contains("[Conv2d] channels must be positive"));
  REQUIRE_THROWS_WITH(nn::Conv2d(2, 4, {3, 0}), Contains("[Conv2d] kernel_size must be positive, got [3, 0]"));
}

TEST_CASE("nn pooling modules and Flatten", "[conv][nn]") {
  manual_seed(20);
  Tensor x = randn({2, 3, 8, 8});
  nn::MaxPool2d mp(2);
  REQUIRE(mp.stride == Size2(2));
  require_close(vals(mp(x)), vals(max_pool2d(x, 2)), 0);
  nn::AvgPool2d ap(3, 2, 1, false, false);
  require_close(vals(ap(x)), vals(avg_pool2d(x, 3, 2, 1, false, false)), 0);
  nn::AdaptiveAvgPool2d gap(1);
  REQUIRE(gap(x).shape() == Shape{2, 3, 1, 1});
  require_close(vals(gap(x).flatten()), vals(mean(x, {2, 3}).flatten()), 1e-6);
  nn::Flatten flat;
  REQUIRE(flat(x).shape() == Shape{2, 192});
  REQUIRE(nn::Flatten(0, 1)(x).shape() == Shape{6, 8, 8});
  REQUIRE(nn::Flatten(2)(x).shape() == Shape{2, 3, 64});
  REQUIRE(mp.extra_repr() == "kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), dilation=(1, 1), ceil_mode=false");
  REQUIRE(ap.extra_repr() == "kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), count_include_pad=False");
  REQUIRE(gap.extra_repr() == "output_size=(1, 1)");
  REQUIRE(flat.extra_repr() == "start_dim=1, end_dim=-1");

  // A small CNN trains end to end: a loss that goes down.
  nn::Sequential net(nn::Conv2d(1, 4, 3, 1, 1), nn::BatchNorm2d(4), nn::ReLU(), nn::MaxPool2d(2),
                     nn::Conv2d(4, 8, 3, 1, 1), nn::ReLU(), nn::AdaptiveAvgPool2d(2), nn::Flatten(),
                     nn::Linear(32, 3));
  optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.05, .momentum = 0.9});
  Tensor xs = randn({8, 1, 8, 8}), ys = randint(0, 3, {8});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = nn::cross_entropy(net(xs), ys);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  REQUIRE(last < 0.5 * first);
}

TEST_CASE("nn::BatchNorm2d: agrees with PyTorch 1.13, eval mode, gradcheck in training", "[conv][nn]") {
  nn::BatchNorm2d bn(2);
  bn.to(f64);
  {
    NoGradGuard g;
    bn.weight.copy_(from_vector<double>({1.5, -0.5}));
    bn.bias.copy_(from_vector<double>({0.1, 0.2}));
  }
  // x = 2 sin(0.83 i + 0.3) + 1 as [3, 2, 2, 2], BatchNorm2d(2) with the weight and bias above.
  Tensor x = seq({3, 2, 2, 2}, 0.83, 0.3) * 2.0 + 1.0;
  require_close(vals(bn(x)),
                {-0.868894378887, 1.365630782925, 1.441960625824, -0.689538214504, 0.140127727428, 0.678893543792,
                 0.548217157658, -0.166929309536, 0.287382739295, 1.703487161877, 0.741705668721, -1.972564786293,
                 0.439759588327, 0.710630754483, 0.291422645134, -0.54527530387, 1.161384645139, 1.580679319332,
                 -0.298056309284, -3.253177254146, 0.639825528296, 0.608679956798, -0.04625153899, -0.89910074952},
                1e-10);
  require_close(vals(bn.running_mean()), {0.211907386713, -0.003306217235}, 1e-10);
  require_close(vals(bn.running_var()), {0.972901184399, 0.99599891312}, 1e-10);
  REQUIRE(bn.num_batches_tracked().item<int64_t>() == 1);
  bn.eval();
  require_close(vals(bn(x)),
                {2.197301270175, 4.049232743228, 4.112493448819, 2.345948209303, 0.158630168379, 0.665048905105,
                 0.54221822733, -0.129991403442, 3.155601504752, 4.329241611441, 3.532135609765, 1.282600465601,
                 0.440272365918, 0.694880638405, 0.300841457163, -0.485621799203, 3.879957472902, 4.227460833746,
                 2.670400882201, 0.221253484806, 0.628326502805, 0.599050887141, -0.016559032169, -0.818203840908},
                1e-10);
  REQUIRE(bn.num_batches_tracked().item<int64_t>() == 1);
  REQUIRE(bn.type_name() == "BatchNorm2d");
  REQUIRE(bn.extra_repr() == "2, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true");

  bn.train();
  manual_seed(21);
  {
    NoGradGuard g;
    bn.weight.normal_();
    bn.bias.normal_();
  }
  Tensor xr = leaf(randn({3, 2, 3, 2}, f64));
  auto r = gradcheck([&](const TensorList& in) { return bn(in[0]); }, {xr, bn.weight, bn.bias});
  INFO(r.report);
  REQUIRE(r.ok);

  REQUIRE_THROWS_WITH(bn(zeros({2, 3, 4, 4}, f64)),
                      Contains("[BatchNorm2d] expected input of shape [N, 2, H, W], got [2, 3, 4, 4]"));
  REQUIRE_THROWS_WITH(bn(zeros({2, 2, 4}, f64)), Contains("[BatchNorm2d]"));
  REQUIRE_THROWS_WITH(bn(zeros({1, 2, 1, 1}, f64)),
                      Contains("[BatchNorm2d] expected more than 1 value per channel when training"));
  REQUIRE_THROWS_WITH(nn::BatchNorm2d(0), Contains("[BatchNorm2d] num_features must be positive"));
}
