// Learning-rate schedules against torch.optim.lr_scheduler (PyTorch 1.13): the rates each epoch
// of StepLR, CosineAnnealingLR, LinearLR over two groups and SequentialLR (warm-up then cosine),
// printed by PyTorch for the same settings; the state dict round trip resumes on the same rates.
#include <catch2/catch.hpp>

#include "tandem.h"

using namespace tandem;

namespace {

struct Fixture {
  Tensor a = zeros({1}).requires_grad_(), b = zeros({1}).requires_grad_();
  optim::SGD sgd{std::vector<optim::SGD::Group>{{{a}, {.lr = 0.1}}, {{b}, {.lr = 0.2}}}};
};

// The rate of group g for 12 epochs: the one in force before each step().
std::vector<double> rates(optim::LRScheduler& s, optim::Optimizer& opt, size_t g = 0, int n = 12) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(opt.lr(g));
    s.step();
  }
  return out;
}

void require_close(const std::vector<double>& got, const std::vector<double>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("epoch " << i);
    REQUIRE(got[i] == Approx(want[i]).margin(1e-15).epsilon(1e-12));
  }
}

}  // namespace

TEST_CASE("lr_scheduler: StepLR, CosineAnnealingLR, LinearLR, SequentialLR as PyTorch's", "[optim][lr_scheduler]") {
  {
    Fixture f;
    optim::StepLR s(f.sgd, 3, 0.5);
    require_close(rates(s, f.sgd), {0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025, 0.0125, 0.0125, 0.0125});
  }
  {
    Fixture f;
    optim::CosineAnnealingLR s(f.sgd, 5, 0.01);
    require_close(rates(s, f.sgd), {0.1, 0.09140576474687263, 0.06890576474687263, 0.04109423525312736,
                                    0.018594235253127367, 0.01, 0.018594235253127367, 0.04109423525312739,
                                    0.06890576474687267, 0.09140576474687269, 0.10000000000000006,
                                    0.09140576474687272});
  }
  {
    Fixture f;
    optim::LinearLR s(f.sgd, 0.25, 1.0, 4);
    std::vector<double> g0, g1;
    for (int i = 0; i < 7; ++i) {
      g0.push_back(f.sgd.lr(0));
      g1.push_back(f.sgd.lr(1));
      s.step();
    }
    require_close(g0, {0.025, 0.04375, 0.0625, 0.08125, 0.1, 0.1, 0.1});
    require_close(g1, {0.05, 0.0875, 0.125, 0.1625, 0.2, 0.2, 0.2});
  }
  {
    Fixture f;
    auto warm = std::make_shared<optim::LinearLR>(f.sgd, 0.1, 1.0, 3);
    auto cosine = std::make_shared<optim::CosineAnnealingLR>(f.sgd, 6);
    optim::SequentialLR s(f.sgd, {warm, cosine}, {3});
    require_close(rates(s, f.sgd), {0.010000000000000002, 0.04, 0.07, 0.1, 0.09330127018922195, 0.07500000000000001,
                                    0.05, 0.025000000000000012, 0.006698729810778065, 0.0, 0.006698729810778065,
                                    0.025});
  }
}

TEST_CASE("lr_scheduler: the state dict resumes on the same rates; bad arguments and states are errors",
          "[optim][lr_scheduler]") {
  Fixture run, resumed;
  optim::CosineAnnealingLR s(run.sgd, 10, 0.001);
  for (int i = 0; i < 4; ++i) s.step();
  nn::TensorDict state = s.state_dict();
  optim::CosineAnnealingLR r(resumed.sgd, 10, 0.001);
  r.load_state_dict(state);
  REQUIRE(r.last_epoch() == 4);
  for (int i = 0; i < 8; ++i) {
    REQUIRE(resumed.sgd.lr(0) == run.sgd.lr(0));
    REQUIRE(resumed.sgd.lr(1) == run.sgd.lr(1));
    s.step();
    r.step();
  }
  REQUIRE_THROWS_WITH(optim::StepLR(run.sgd, 0), Catch::Contains("[StepLR] step_size must be positive, got 0"));
  REQUIRE_THROWS_WITH(optim::LinearLR(run.sgd, 0.0), Catch::Contains("[LinearLR] start_factor must be in (0, 1]"));
  Fixture other;
  optim::StepLR a(other.sgd, 2);
  auto b = std::make_shared<optim::StepLR>(run.sgd, 2);
  REQUIRE_THROWS_WITH(optim::SequentialLR(other.sgd, {b}, {}), Catch::Contains("the same optimizer"));
  REQUIRE_THROWS_WITH(optim::SequentialLR(run.sgd, {b, b}, {}), Catch::Contains("2 schedulers need 1 milestones"));
  nn::TensorDict bad = state;
  bad.insert("extra", zeros({1}));
  const double before = resumed.sgd.lr(0);
  REQUIRE_THROWS_WITH(r.load_state_dict(bad), Catch::Contains("unexpected key 'extra'"));
  REQUIRE(resumed.sgd.lr(0) == before);  // unchanged
  nn::TensorDict wrong;
  wrong.insert("last_epoch", from_vector<int64_t>({3}));
  wrong.insert("base_lrs", from_vector<double>({0.1}));
  REQUIRE_THROWS_WITH(r.load_state_dict(wrong), Catch::Contains("but the optimizer has 2 groups"));
}
