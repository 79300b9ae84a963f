// The tape: backward order, accumulation, retain_graph, grad mode, hooks, callbacks, custom
// functions, error messages, and flat memory.
#include <catch2/catch.hpp>

#include <thread>

#include "tandem.h"

using namespace tandem;

namespace {
Tensor leaf(std::vector<double> v, Shape shape) {
  Tensor t = from_vector(v, shape);
  t.requires_grad_();
  return t;
}
}  // namespace

TEST_CASE("backward accumulates over every use of a leaf", "[autograd]") {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = (x * x + x * 3).sum();  // dy/dx = 2x + 3
  y.backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{5, 7, 9});
  // A second graph accumulates into .grad.
  (x * 2).sum().backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{7, 9, 11});
}

TEST_CASE("backward runs only what the root needs", "[autograd]") {
  Tensor a = leaf({1}, {1});
  Tensor b = leaf({2}, {1});
  Tensor ya = (a * 2).sum();
  Tensor yb = (b * 3).sum();
  (void)yb;
  ya.backward();
  REQUIRE(a.grad().defined());
  REQUIRE_FALSE(b.grad().defined());
}

TEST_CASE("non-scalar backward needs a gradient", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 2;
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("[backward] grad can be implicitly created only for scalar outputs") &&
                                        Catch::Contains("[2]"));
  y.backward(from_vector<double>({1, 10}, {2}));
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{2, 20});
  REQUIRE_THROWS_WITH(Tensor(from_vector<double>({1}, {1})).backward(),
                      Catch::Contains("does not require grad"));
}

TEST_CASE("backward through a freed graph is an error; retain_graph keeps it", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = (x * x).sum();
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{4, 8});
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("a second time") && Catch::Contains("retain_graph"));
}

TEST_CASE("in-place change of a saved tensor is an error at backward", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor w = from_vector<double>({3, 4}, {2});
  Tensor y = (x * w).sum();  // saves w
  w.mul_(2);
  REQUIRE_THROWS_WITH(y.backward(), Catch::Contains("modified by an in-place operation") &&
                                        Catch::Contains("version 1") && Catch::Contains("version 0"));
}

TEST_CASE("in-place on a leaf that requires grad is an error in grad mode, fine under no_grad", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  REQUIRE_THROWS_WITH(x.add_(1.0), Catch::Contains("[add_] a leaf tensor that requires grad"));
  {
    NoGradGuard ng;
    x.add_(1.0);
  }
  REQUIRE(x.to_vector<double>() == std::vector<double>{2, 3});
}

TEST_CASE("grad mode guards nest and are per thread", "[autograd]") {
  Tensor x = leaf({1}, {1});
  {
    NoGradGuard ng;
    REQUIRE_FALSE((x * 2).requires_grad());
    {
      EnableGradGuard eg;
      REQUIRE((x * 2).requires_grad());
    }
    REQUIRE_FALSE((x * 2).requires_grad());
  }
  REQUIRE((x * 2).requires_grad());
  REQUIRE_FALSE(x.detach().requires_grad());
  REQUIRE(x.is_leaf());
  REQUIRE_FALSE((x * 2).is_leaf());
}

TEST_CASE("tensor hooks see and may replace the gradient", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 3;
  std::vector<double> seen;
  auto h1 = register_hook(y, [&](const Tensor& g) {
    seen = g.to_vector<double>();
    return g * 10;  // replace
  });
  auto h2 = register_hook(x, [&](const Tensor& g) { return Tensor(); });
  y.sum().backward();
  REQUIRE(seen == std::vector<double>{1, 1});
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{30, 30});

  // Dropping the handle removes the hook.
  h1.remove();
  x.set_grad(Tensor());
  Tensor z = x * 3;
  auto bad = register_hook(z, [](const Tensor& g) { return sum(g); });
  REQUIRE_THROWS_WITH(z.sum().backward(), Catch::Contains("[hook]") && Catch::Contains("shape []") &&
                                              Catch::Contains("[2]"));
}

TEST_CASE("post-accumulate-grad hooks fire once per backward, when the gradient is final", "[autograd]") {
  Tensor w = leaf({1, 2}, {2});
  int fired = 0;
  std::vector<double> at_fire;
  auto h = register_post_accumulate_grad_hook(w, [&](const Tensor& p) {
    ++fired;
    at_fire = p.grad().to_vector<double>();
  });
  // Used three times, across two forwards, before one backward.
  Tensor a = (w * 2).sum();
  Tensor b = (w * w).sum() + (w * 1).sum();
  (a + b).backward();
  REQUIRE(fired == 1);
  REQUIRE(at_fire == std::vector<double>{5, 7});  // 2 + 2w + 1
  {
    HookHandle moved = std::move(h);
  }
  (w * 2).sum().backward();
  REQUIRE(fired == 1);
  REQUIRE_THROWS_WITH(register_post_accumulate_grad_hook(w * 2, [](const Tensor&) {}),
                      Catch::Contains("only leaf tensors"));
}

TEST_CASE("queue_callback runs after backward, in order", "[autograd]") {
  Tensor w = leaf({1}, {1});
  std::vector<int> order;
  auto h = register_post_accumulate_grad_hook(w, [&](const Tensor&) {
    order.push_back(1);
    autograd::queue_callback([&] {
      order.push_back(3);
      autograd::queue_callback([&] { order.push_back(4); });
    });
    autograd::queue_callback([&] { order.push_back(5); });
    order.push_back(2);
  });
  (w * 2).sum().backward();
  REQUIRE(order == std::vector<int>{1, 2, 3, 5, 4});
  REQUIRE_THROWS_WITH(autograd::queue_callback([] {}), Catch::Contains("[queue_callback]"));
}

TEST_CASE("backward-start observers know which leaves are reached", "[autograd]") {
  Tensor a = leaf({1}, {1});
  Tensor b = leaf({1}, {1});
  Tensor c = leaf({1}, {1});
  (void)(c * 2);  // recorded but not part of the loss
  bool reaches_a = false, reaches_b = true, reaches_c = true;
  uint64_t id = autograd::add_backward_start_observer([&](const autograd::GraphTask& t) {
    reaches_a = t.reaches(a);
    reaches_b = t.reaches(b);
    reaches_c = t.reaches(c);
  });
  (a * 2 + b * 0).sum().backward();
  REQUIRE(reaches_a);
  REQUIRE(reaches_b);
  (a * 2).sum().backward();
  REQUIRE_FALSE(reaches_b);
  REQUIRE_FALSE(reaches_c);
  autograd::remove_backward_start_observer(id);
}

// Anchors (backward_seam.h): what DDP's BackwardWatch holds of a forward's outputs. A starting
// backward reaches an output's anchor when it runs through that output; anchors expire with the
// graph and hold none of it alive.
TEST_CASE("graph anchors: a backward reaches the outputs it runs through, anchors expire with the graph",
          "[autograd]") {
  Tensor a = leaf({1, 2}, {2});
  Tensor y1 = a * 2, y2 = a * 3;
  autograd::GraphAnchor out1 = autograd::output_anchor(y1), out2 = autograd::output_anchor(y2);
  REQUIRE(!out1.expired());
  REQUIRE(autograd::output_anchor(a).expired());        // a leaf has no producing op
  REQUIRE(autograd::output_anchor(Tensor()).expired());  // nor has an undefined tensor
  bool reached1 = false, reached2 = true, reached_leaf = false;
  uint64_t id = autograd::add_backward_start_observer([&](const autograd::GraphTask& t) {
    reached1 = t.reaches(out1);
    reached2 = t.reaches(out2);
    reached_leaf = t.reaches(autograd::leaf_anchor(a));
  });
  y1.sum().backward();
  autograd::remove_backward_start_observer(id);
  REQUIRE(reached1);
  REQUIRE_FALSE(reached2);  // y2 was not part of this loss
  REQUIRE(reached_leaf);    // the accumulator exists once the backward starts
  y1 = Tensor();
  REQUIRE(out1.expired());  // nothing holds y1's node any more
  REQUIRE(!out2.expired());
}

TEST_CASE("retain_grad keeps a non-leaf gradient", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = x * 2;
  y.retain_grad();
  (y * y).sum().backward();
  REQUIRE(y.grad().to_vector<double>() == std::vector<double>{4, 8});
}

namespace {
struct CubeFn : autograd::Function<CubeFn> {
  static Tensor forward(autograd::AutogradContext& ctx, const Tensor& x, double scale) {
    ctx.save_for_backward({x});
    ctx.data["scale"] = scale;
    return x * x * x * scale;
  }
  static TensorList backward(autograd::AutogradContext& ctx, const TensorList& g) {
    Tensor x = ctx.saved()[0];
    double scale = std::any_cast<double>(ctx.data["scale"]);
    return {g[0] * x * x * (3 * scale)};
  }
};
struct WrongShapeFn : autograd::Function<WrongShapeFn> {
  static Tensor forward(autograd::AutogradContext&, const Tensor& x) { return x * 1; }
  static TensorList backward(autograd::AutogradContext&, const TensorList& g) { return {sum(g[0])}; }
};
}  // namespace

TEST_CASE("custom functions join the tape and are gradchecked", "[autograd]") {
  Tensor x = leaf({1, -2, 0.5}, {3});
  Tensor y = CubeFn::apply(x, 2.0);
  REQUIRE(y.grad_fn() != nullptr);
  y.sum().backward();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{6, 24, 1.5});
  auto r = gradcheck([](const TensorList& in) { return CubeFn::apply(in[0], 0.5); }, {x});
  INFO(r.report);
  REQUIRE(r.ok);
  Tensor z = WrongShapeFn::apply(x);
  REQUIRE_THROWS_WITH(z.sum().backward(), Catch::Contains("[Function]") && Catch::Contains("shape []"));
}

TEST_CASE("gradcheck catches a wrong backward and names the worst element", "[autograd]") {
  struct BadSquare : autograd::Function<BadSquare> {
    static Tensor forward(autograd::AutogradContext& ctx, const Tensor& x) {
      ctx.save_for_backward({x});
      return x * x;
    }
    static TensorList backward(autograd::AutogradContext& ctx, const TensorList& g) {
      return {g[0] * ctx.saved()[0] * 2.1};  // should be 2
    }
  };
  Tensor x = leaf({1, 2, 3}, {3});
  auto r = gradcheck([](const TensorList& in) { return BadSquare::apply(in[0]); }, {x});
  REQUIRE_FALSE(r.ok);
  REQUIRE_THAT(r.report, Catch::Contains("input 0") && Catch::Contains("element"));
}

TEST_CASE("graphs that are never backwarded, and trained ones, keep nothing alive", "[autograd]") {
  Tensor w = leaf({1, 2, 3, 4}, {4});
  int64_t live_before = autograd::live_node_count();
  std::weak_ptr<autograd::Node> first_node;
  for (int step = 0; step < 100000; ++step) {
    Tensor y = (w * 2 + 1).sum();
    if (step == 0) first_node = y.grad_fn();
    if (step % 2 == 0) {
      y.backward();
    }
  }
  REQUIRE(first_node.expired());
  REQUIRE(autograd::live_node_count() == live_before);
  REQUIRE(w.grad().defined());
}

TEST_CASE("a backward started inside a hook does not disturb the outer one", "[autograd]") {
  Tensor w = leaf({1}, {1});
  Tensor c = w * 5;
  Tensor a = w * 2;
  Tensor l = a.sum() + c.sum();
  Tensor b = (w * 3 * 1 * 1 * 1).sum();
  auto h = register_hook(a, [&](const Tensor& g) {
    b.backward();  // shares w's AccumulateGrad with the outer graph
    return Tensor();
  });
  l.backward();
  REQUIRE(w.grad().to_vector<double>() == std::vector<double>{10});  // 3 from b, then 2 + 5
}

TEST_CASE("a graph built on one thread backwards on another", "[autograd]") {
  Tensor x = leaf({1, 2}, {2});
  Tensor y;
  std::thread builder([&] {
    for (int i = 0; i < 10; ++i) (void)(x * 1);  // advance the tape on this thread
    y = x * 3;
  });
  builder.join();
  std::thread runner([&] { (y * 2).sum().backward(); });
  runner.join();
  REQUIRE(x.grad().to_vector<double>() == std::vector<double>{6, 6});
}

TEST_CASE("freeing a very long graph does not overflow the stack", "[autograd]") {
  Tensor x = leaf({1}, {1});
  int64_t live_before = autograd::live_node_count();
  {
    Tensor y = x;
    for (int i = 0; i < 300000; ++i) y = y * 1.0;
  }
  REQUIRE(autograd::live_node_count() == live_before);
}

TEST_CASE("seed gradients and custom outputs are checked", "[autograd]") {
  Tensor w = leaf({1, 2, 3}, {3});
  REQUIRE_THROWS_WITH((w * 2).backward(ones({3}, i64)), Catch::Contains("[backward] gradient is [3] (i64"));
  struct Undefined : autograd::Function<Undefined> {
    static TensorList forward(autograd::AutogradContext&, const Tensor& x) { return {x * 2, Tensor()}; }
    static TensorList backward(autograd::AutogradContext&, const TensorList& g) { return {g[0]}; }
  };
  REQUIRE_THROWS_WITH(Undefined::apply(w), Catch::Contains("returned an undefined tensor as output 1"));
}
