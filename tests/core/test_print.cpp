// Tensor::str(): PyTorch's layout for every dtype, nesting, alignment, scientific notation,
// summaries, wrapping and suffixes.
#include <catch2/catch.hpp>

#include "core/print.h"
#include "tandem.h"

using namespace tandem;

TEST_CASE("floats print with 4 decimals, nested and aligned", "[print]") {
  REQUIRE(from_vector<float>({1, 2, 3, 4}, {2, 2}).str() == "tensor([[1.0000, 2.0000],\n        [3.0000, 4.0000]])");
  REQUIRE(from_vector<float>({-1.5f, 10, 0.25f}).str() == "tensor([-1.5000, 10.0000,  0.2500])");
  REQUIRE(scalar_tensor(3.5).str() == "tensor(3.5000)");
  REQUIRE(from_vector<float>({NAN, INFINITY, -INFINITY, 1}).str() == "tensor([   nan,    inf,   -inf, 1.0000])");
  REQUIRE(from_vector<float>({0, 1, 2, 3, 4, 5, 6, 7}, {2, 2, 2}).str() ==
          "tensor([[[0.0000, 1.0000],\n         [2.0000, 3.0000]],\n\n        [[4.0000, 5.0000],\n         [6.0000, 7.0000]]])");
}

TEST_CASE("scientific notation when fixed point would hide digits", "[print]") {
  REQUIRE(from_vector<float>({1e-5f, 1}).str() == "tensor([1.0000e-05, 1.0000e+00])");
  REQUIRE(from_vector<double>({1e9}).str() == "tensor([1.0000e+09], dtype=f64)");
  REQUIRE(from_vector<float>({1, 999}).str() == "tensor([  1.0000, 999.0000])");
  REQUIRE(from_vector<float>({1, 1001}).str() == "tensor([1.0000e+00, 1.0010e+03])");
}

TEST_CASE("integers and bools print plainly; dtype suffix for non-default dtypes", "[print]") {
  REQUIRE(from_vector<int64_t>({1, -20, 300}).str() == "tensor([  1, -20, 300])");
  REQUIRE(from_vector<int32_t>({1, 2}).str() == "tensor([1, 2], dtype=i32)");
  REQUIRE(from_vector<bool>({true, false}).str() == "tensor([ True, False])");
  REQUIRE(from_vector<double>({0.5}).str() == "tensor([0.5000], dtype=f64)");
  REQUIRE(from_vector<Half>({Half(0.5f)}).str() == "tensor([0.5000], dtype=f16)");
  REQUIRE(from_vector<BFloat16>({BFloat16(2.0f)}).str() == "tensor([2.0000], dtype=bf16)");
  const int64_t big = (int64_t{1} << 60) + 1;
  REQUIRE(from_vector<int64_t>({big}).str() == "tensor([1152921504606846977])");
}

TEST_CASE("empty tensors and non-contiguous ones", "[print]") {
  REQUIRE(zeros({0}).str() == "tensor([])");
  REQUIRE(zeros({0, 3}).str() == "tensor([], size=[0, 3])");
  REQUIRE(zeros({0}, i32).str() == "tensor([], dtype=i32)");
  Tensor t = arange(6).view({2, 3}).t();
  REQUIRE(t.str() == "tensor([[0, 3],\n        [1, 4],\n        [2, 5]])");
}

TEST_CASE("more than 1000 elements are summarised", "[print]") {
  REQUIRE(arange(10000).str() == "tensor([   0,    1,    2,  ..., 9997, 9998, 9999])");
  std::string s = arange(2000).view({100, 20}).str();
  REQUIRE(s ==
          "tensor([[   0,    1,    2,  ...,   17,   18,   19],\n"
          "        [  20,   21,   22,  ...,   37,   38,   39],\n"
          "        [  40,   41,   42,  ...,   57,   58,   59],\n"
          "        ...,\n"
          "        [1940, 1941, 1942,  ..., 1957, 1958, 1959],\n"
          "        [1960, 1961, 1962,  ..., 1977, 1978, 1979],\n"
          "        [1980, 1981, 1982,  ..., 1997, 1998, 1999]])");
  REQUIRE(arange(1000).str().find("...") == std::string::npos);  // 1000 is at the threshold
}

TEST_CASE("long rows wrap at 80 columns", "[print]") {
  std::string s = arange(30).str();
  REQUIRE(s ==
          "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n"
          "        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])");
}

TEST_CASE("extra suffixes and the suffix provider", "[print]") {
  Tensor a = from_vector<double>({1});
  REQUIRE(format_tensor(a, {"requires_grad=True"}) == "tensor([1.0000], dtype=f64, requires_grad=True)");
  set_str_suffix_provider([](const Tensor&) { return std::vector<std::string>{"tag=x"}; });
  std::string s = a.str();
  set_str_suffix_provider(nullptr);
  REQUIRE(s == "tensor([1.0000], dtype=f64, tag=x)");
  std::ostringstream os;
  os << from_vector<int64_t>({7});
  REQUIRE(os.str() == "tensor([7])");
  REQUIRE(Tensor().str() == "tensor(undefined)");
}
