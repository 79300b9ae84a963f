// scaled_dot_product_attention on CUDA (cuda/attention.cu) against the CPU: outputs and the
// gradients of q, k, v (and of an additive mask) in f32/f64/f16/bf16, head dims from 1 to 256 with
// Ev != E, sizes that are no multiple of a tile, causal with L = S, L > S and L < S, boolean and
// additive masks broadcast from several shapes, fully masked rows (0, no gradient), dropout (the
// same generator state keeps the same elements on both devices), strided q/k/v and upstream
// gradients (transposes, a packed qkv, heads expanded from one, unbatched inputs), a deterministic
// backward, and the error for head dims too large for the kernels' shared memory.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include "core/random.h"
#include "cuda_test_util.h"
#include "tandem.h"
#include "test_util.h"

using namespace tandem;
using Catch::Contains;
using test_util::leaf;

namespace {

using cuda_test::bits;
using cuda_test::host_values;
using cuda_test::kGPU;
using cuda_test::random;
using cuda_test::require_match;

const double kInf = std::numeric_limits<double>::infinity();
const Dtype kFloats[] = {f32, f64, f16, bf16};

// Sums over a row of keys and over the queries (dk, dv): looser than the defaults. The 2-byte types
// differ by a rounding of the result where the two f32 sums fall on either side of a tie.
constexpr cuda_test::Tolerances tol_for{.f64 = 1e-10, .f32 = 1e-4, .f16 = 4e-3, .bf16 = 3e-2};

struct Options {
  double dropout_p = 0;
  bool causal = false;
  std::optional<double> scale;
};

// Builds the op's inputs from the leaves (views of them, a mask among them): strided inputs and
// their gradients go through the same code on both devices.
using Builder = std::function<Tensor(const TensorList&)>;

// One input of a comparison: its values (made on the CPU) and whether it is a leaf that requires
// grad (q, k, v, an additive mask) or a constant (a boolean mask, an additive mask without grad).
struct Input {
  Tensor value;
  bool grad = true;
};

// build(inputs) on the CPU and on copies on the GPU, the generator rewound in between so that both
// draw the same dropout bits: the outputs agree, then the gradients of sum(out * w) for every input
// that requires grad (w the upstream gradient, the same on both; transposed when `strided_grad`, so
// the kernels see a dout of any strides). Returns the GPU's output and its inputs.
std::pair<Tensor, TensorList> require_same(const Builder& build, const std::vector<Input>& in, double tol,
                                           bool strided_grad = false) {
  TensorList c, d;
  for (const Input& x : in) {
    Tensor tc = x.value.clone(), td = x.value.to(kGPU).detach();
    if (x.grad) {
      leaf(tc);
      leaf(td);
    }
    c.push_back(tc);
    d.push_back(td);
  }
  const PhiloxState state = get_rng_state();
  Tensor yc = build(c);
  set_rng_state(state);
  Tensor yd = build(d);
  INFO("output " << shape_str(yc.shape()) << " " << yc.dtype());
  require_match(yd, yc, tol);
  bool any = false;
  for (const Input& x : in) any |= x.grad;
  if (!any) return {yd, d};
  Tensor wc, wd;
  if (strided_grad) {
    Shape s = yc.shape();
    std::swap(s[s.size() - 1], s[s.size() - 2]);
    const Tensor w = random(s, yc.dtype());
    wc = w.transpose(-2, -1);
    wd = w.to(kGPU).transpose(-2, -1);
  } else {
    wc = random(yc.shape(), yc.dtype());
    wd = wc.to(kGPU);
  }
  yc.backward(wc);
  yd.backward(wd);
  for (size_t i = 0; i < in.size(); ++i) {
    if (!in[i].grad) continue;
    INFO("gradient of input " << i << " " << shape_str(in[i].value.shape()));
    require_match(d[i].grad(), c[i].grad(), tol);
  }
  return {yd, d};
}

Shape with(Shape batch, std::initializer_list<int64_t> tail) {
  for (int64_t t : tail) batch.push_back(t);
  return batch;
}

// Plain q [batch..., L, E], k [batch..., S, E], v [batch..., S, Ev] of dtype, compared on both devices.
void require_plain(Dtype dt, const Shape& batch, int64_t L, int64_t S, int64_t E, int64_t Ev, const Options& o) {
  INFO("dtype " << dt << " batch " << shape_str(batch) << " L " << L << " S " << S << " E " << E << " Ev " << Ev
                << " causal " << o.causal << " dropout " << o.dropout_p);
  require_same(
      [o](const TensorList& x) {
        return scaled_dot_product_attention(x[0], x[1], x[2], Tensor(), o.dropout_p, o.causal, o.scale);
      },
      {{random(with(batch, {L, E}), dt)}, {random(with(batch, {S, E}), dt)}, {random(with(batch, {S, Ev}), dt)}},
      tol_for(dt), true);
}

bool all_zero(const Tensor& t) {
  for (double x : host_values(t))
    if (x != 0) return false;
  return true;
}

}  // namespace

TEST_CASE("cuda attention: the CPU's output and gradients for every dtype and head dim", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(71);
  struct Dims {
    int64_t E, Ev;
  };
  // Head dims that take every tile size of the kernels (64 down to 8 rows), Ev != E both ways.
  const Dims dims[] = {{1, 1}, {16, 16}, {64, 64}, {80, 48}, {128, 128}, {24, 256}, {256, 40}, {256, 256}};
  for (Dtype dt : kFloats)
    for (const Dims& d : dims) require_plain(dt, {2, 3}, 37, 45, d.E, d.Ev, {});
  // An explicit scale, one query, one key.
  for (Dtype dt : kFloats) {
    require_plain(dt, {1, 2}, 19, 23, 32, 32, {.scale = 0.3});
    require_plain(dt, {1, 1}, 1, 1, 8, 8, {});
  }
}

TEST_CASE("cuda attention: sizes that are no multiple of a tile, many heads and long rows", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(72);
  for (Dtype dt : {f32, bf16}) {
    require_plain(dt, {1, 2}, 300, 257, 64, 64, {});
    require_plain(dt, {1, 2}, 300, 300, 64, 64, {.causal = true});
    require_plain(dt, {16, 16}, 9, 7, 8, 8, {});  // 256 (b, h) pairs of one tile each
    require_plain(dt, {2}, 65, 129, 32, 16, {});  // 3-D input: H = 1
  }
  require_plain(f64, {1, 1}, 129, 65, 64, 64, {});
}

TEST_CASE("cuda attention: causal masking with L = S, L > S and L < S", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(73);
  struct Lens {
    int64_t L, S;
  };
  for (Dtype dt : kFloats)
    for (const Lens& n : {Lens{70, 70}, Lens{90, 20}, Lens{20, 90}, Lens{1, 5}, Lens{5, 1}, Lens{33, 33}})
      require_plain(dt, {2, 2}, n.L, n.S, 16, 24, {.causal = true});
}

TEST_CASE("cuda attention: boolean and additive masks, broadcast or not", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(74);
  const int64_t B = 2, H = 3, L = 21, S = 34, E = 16;
  // Shapes that broadcast to [B, H, L, S] (stride 0 along the missing dims), and the full one.
  const Shape mask_shapes[] = {{L, S}, {S}, {1, S}, {H, 1, S}, {B, 1, L, S}, {B, H, L, S}};
  for (Dtype dt : kFloats) {
    const Tensor q = random({B, H, L, E}, dt), k = random({B, H, S, E}, dt), v = random({B, H, S, E}, dt);
    for (const Shape& ms : mask_shapes) {
      INFO("dtype " << dt << " mask " << shape_str(ms));
      const Builder op = [](const TensorList& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); };
      {
        INFO("boolean mask");
        require_same(op, {{q}, {k}, {v}, {random(ms, boolean), false}}, tol_for(dt));
      }
      {
        INFO("additive mask, differentiable (the kernels write dS as its gradient)");
        require_same(op, {{q}, {k}, {v}, {random(ms, dt), true}}, tol_for(dt));
      }
      {
        INFO("additive mask, constant");
        require_same(op, {{q}, {k}, {v}, {random(ms, dt), false}}, tol_for(dt));
      }
    }
  }
}

TEST_CASE("cuda attention: fully masked rows give 0 and no gradient", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(75);
  const int64_t B = 2, H = 2, L = 40, S = 70, E = 16;
  const Builder op = [](const TensorList& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3]); };
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const Tensor q = random({B, H, L, E}, dt), k = random({B, H, S, E}, dt), v = random({B, H, S, E}, dt);
    // Boolean: queries 0, 7 and 33 to 39 (a whole last tile of some tilings) take no key.
    Tensor bmask = random({L, S}, boolean);
    bmask.narrow(0, 0, 1).fill_(false);
    bmask.narrow(0, 7, 1).fill_(false);
    bmask.narrow(0, 33, 7).fill_(false);
    auto [out, in] = require_same(op, {{q}, {k}, {v}, {bmask, false}}, tol_for(dt));
    for (int64_t i : {0, 7, 33, 39}) {
      INFO("query " << i);
      REQUIRE(all_zero(out.narrow(2, i, 1)));
      REQUIRE(all_zero(in[0].grad().narrow(2, i, 1)));
    }
    // Additive: -inf over whole rows of one batch element; its gradient there is 0 as well.
    Tensor amask = random({B, 1, L, S}, dt);
    amask.narrow(0, 1, 1).narrow(2, 3, 2).fill_(-kInf);
    auto [out2, in2] = require_same(op, {{q}, {k}, {v}, {amask, true}}, tol_for(dt));
    REQUIRE(all_zero(out2.narrow(0, 1, 1).narrow(2, 3, 2)));
    REQUIRE(all_zero(in2[0].grad().narrow(0, 1, 1).narrow(2, 3, 2)));
    REQUIRE(all_zero(in2[3].grad().narrow(0, 1, 1).narrow(2, 3, 2)));
  }
}

TEST_CASE("cuda attention: dropout keeps the CPU's elements for the same generator state", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(76);
  for (Dtype dt : kFloats) {
    for (double p : {0.1, 0.5}) {
      require_plain(dt, {2, 3}, 37, 45, 32, 16, {.dropout_p = p});
      require_plain(dt, {1, 2}, 70, 70, 16, 16, {.dropout_p = p, .causal = true});
    }
    INFO("dropout with an additive mask " << dt);
    const int64_t L = 23, S = 41;
    require_same(
        [](const TensorList& x) { return scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.25); },
        {{random({2, 2, L, 8}, dt)}, {random({2, 2, S, 8}, dt)}, {random({2, 2, S, 8}, dt)}, {random({L, S}, dt)}},
        tol_for(dt));
  }
  // The same state twice on the GPU: the same output bits; a later state other bits.
  const Tensor q = random({1, 2, 50, 16}, f32).to(kGPU), k = random({1, 2, 60, 16}, f32).to(kGPU);
  const Tensor v = random({1, 2, 60, 16}, f32).to(kGPU);
  const PhiloxState state = get_rng_state();
  const Tensor a = scaled_dot_product_attention(q, k, v, Tensor(), 0.5);
  const Tensor b = scaled_dot_product_attention(q, k, v, Tensor(), 0.5);
  set_rng_state(state);
  const Tensor c = scaled_dot_product_attention(q, k, v, Tensor(), 0.5);
  REQUIRE(bits(a) == bits(c));
  REQUIRE(bits(a) != bits(b));
}

TEST_CASE("cuda attention: strided q, k, v and upstream gradients", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(77);
  const int64_t B = 2, H = 3, L = 29, S = 29, E = 16;
  for (Dtype dt : kFloats) {
    INFO("dtype " << dt);
    const double tol = tol_for(dt);
    // [B, L, H, E] tensors seen as [B, H, L, E]: the layout of a projection split into heads.
    require_same(
        [](const TensorList& x) {
          return scaled_dot_product_attention(x[0].transpose(1, 2), x[1].transpose(1, 2), x[2].transpose(1, 2),
                                              Tensor(), 0.0, true);
        },
        {{random({B, L, H, E}, dt)}, {random({B, S, H, E}, dt)}, {random({B, S, H, E}, dt)}}, tol, true);
    // A GPT's packed qkv [B, L, 3 H E]: q, k and v are strided views of one leaf.
    require_same(
        [](const TensorList& x) {
          const Tensor qkv = x[0].view({B, L, 3, H, E});
          auto head = [&](int64_t which) { return qkv.select(2, which).transpose(1, 2); };
          return scaled_dot_product_attention(head(0), head(1), head(2), Tensor(), 0.0, true);
        },
        {{random({B, L, 3 * H * E}, dt)}}, tol, true);
    // k and v of one head expanded over H (stride 0), E transposed into the rows of q.
    require_same(
        [](const TensorList& x) {
          return scaled_dot_product_attention(x[0].transpose(-2, -1), x[1].expand({B, H, S, E}),
                                              x[2].expand({B, H, S, 2 * E}));
        },
        {{random({B, H, E, L}, dt)}, {random({B, 1, S, E}, dt)}, {random({B, 1, S, 2 * E}, dt)}}, tol);
    // Unbatched [L, E] inputs (stride-0 batch dims inside), and sum(out): a dout of stride 0.
    require_same([](const TensorList& x) { return scaled_dot_product_attention(x[0], x[1], x[2]); },
                 {{random({L, E}, dt)}, {random({S, E}, dt)}, {random({S, 8}, dt)}}, tol);
    require_same([](const TensorList& x) { return sum(scaled_dot_product_attention(x[0], x[1], x[2])); },
                 {{random({B, H, L, E}, dt)}, {random({B, H, S, E}, dt)}, {random({B, H, S, E}, dt)}}, tol);
  }
}

TEST_CASE("cuda attention: the backward is deterministic", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  manual_seed(78);
  const Tensor q = random({2, 4, 150, 64}, f32), k = random({2, 4, 170, 64}, f32), v = random({2, 4, 170, 64}, f32);
  const Tensor mask = random({150, 170}, f32), w = random({2, 4, 150, 64}, f32).to(kGPU);
  std::vector<std::vector<unsigned char>> first;
  const PhiloxState state = get_rng_state();
  for (int run = 0; run < 2; ++run) {
    set_rng_state(state);  // the same dropout bits both times
    TensorList x = {leaf(q.to(kGPU).detach()), leaf(k.to(kGPU).detach()), leaf(v.to(kGPU).detach()),
                    leaf(mask.to(kGPU).detach())};
    scaled_dot_product_attention(x[0], x[1], x[2], x[3], 0.2).backward(w);
    for (size_t i = 0; i < x.size(); ++i) {
      if (run == 0) {
        first.push_back(bits(x[i].grad()));
      } else {
        INFO("gradient of input " << i);
        REQUIRE(bits(x[i].grad()) == first[i]);
      }
    }
  }
}

TEST_CASE("cuda attention: head dims too large for the kernels are an error that names them", "[cuda][attention]") {
  TANDEM_REQUIRE_CUDA_OR_SKIP();
  // f64 with E = Ev = 4096: even 8-row tiles need more than an H100's 227 KiB of shared memory.
  const Tensor q = random({1, 1, 2, 4096}, f64).to(kGPU), k = random({1, 1, 3, 4096}, f64).to(kGPU);
  const Tensor v = random({1, 1, 3, 4096}, f64).to(kGPU);
  REQUIRE_THROWS_WITH(scaled_dot_product_attention(q, k, v),
                      Contains("[scaled_dot_product_attention] head dims E = 4096 and Ev = 4096"));
}
