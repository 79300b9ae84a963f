// safetensors: round trips for every dtype, the exact bytes of the format, a file built by hand
// from the spec, validation of malformed and truncated files (with a fuzz), atomic saves,
// model save/load, and interop with the reference Python package when it is installed.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "nn/nn.h"
#include "tandem.h"
#include "temp_dir.h"

using namespace tandem;
using Catch::Contains;
namespace fs = std::filesystem;
using test_util::TempDir;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A file image: 8-byte little-endian length, the header text, then the data bytes.
std::vector<uint8_t> image(const std::string& header, const std::vector<uint8_t>& data) {
  // Reserved up front: GCC 12 misreads the growing inserts (-Wstringop-overread, a false positive).
  std::vector<uint8_t> out;
  out.reserve(8 + header.size() + data.size());
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

template <class T>
void append_le(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

nn::TensorDict parse(const std::vector<uint8_t>& bytes, nn::Metadata* meta = nullptr) {
  return nn::parse_safetensors(bytes.data(), bytes.size(), meta, "test");
}

nn::TensorDict all_dtypes() {
  nn::TensorDict d;
  d.insert("f32", from_vector<float>({0.5f, -1.25f, 3.0f, 1e-30f, -0.0f, 7.0f}, {2, 3}));
  d.insert("f64", from_vector<double>({1.0 / 3.0, -2.5e300}, {2}));
  d.insert("f16", to_dtype(from_vector<float>({0.5f, -1.0f, 65504.0f, 0.000061035156f}, {4}), f16));
  d.insert("bf16", to_dtype(from_vector<float>({1.0f, -3.0e38f, 0.0078125f}, {3, 1}), bf16));
  d.insert("i32", from_vector<int32_t>({1, -2, 2147483647, -2147483647 - 1}, {2, 2}));
  d.insert("i64", from_vector<int64_t>({int64_t{1} << 60, -7}, {2}));
  d.insert("bool", from_vector<bool>({true, false, true, true, false}, {5}));
  d.insert("scalar", scalar_tensor(2.5, f64));
  d.insert("empty", zeros({0, 3}));
  return d;
}

void require_same(const nn::TensorDict& got, const nn::TensorDict& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO("tensor " << name);
    REQUIRE(got.contains(name));
    const Tensor& g = got[name];
    REQUIRE(g.dtype() == t.dtype());
    REQUIRE(g.shape() == t.shape());
    // Bytewise: the format must preserve every bit (signed zeros, subnormals, extremes).
    Tensor tc = t.contiguous();
    REQUIRE(std::memcmp(g.data_ptr(), tc.data_ptr(), tc.nbytes()) == 0);
  }
}

}  // namespace

TEST_CASE("safetensors: round trip of every dtype with metadata", "[safetensors]") {
  TempDir dir("tandem_st");
  auto tensors = all_dtypes();
  nn::save_safetensors(dir.file("a.safetensors"), tensors, {{"format", "pt"}, {"note", "ünïcode ✓"}});
  nn::Metadata meta;
  auto loaded = nn::load_safetensors(dir.file("a.safetensors"), &meta);
  require_same(loaded, tensors);
  REQUIRE(meta == nn::Metadata{{"format", "pt"}, {"note", "ünïcode ✓"}});
  // No temporary file is left behind.
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.is_regular_file();
  REQUIRE(files == 1);

  // Non-contiguous and std::map inputs are written as their logical contents.
  Tensor base = arange(0, 12, TensorOptions(f32)).reshape({3, 4});
  std::map<std::string, Tensor> m = {{"t", base.t()}, {"col", base.select(1, 2)}};
  nn::save_safetensors(dir.file("b.safetensors"), m);
  auto back = nn::load_safetensors(dir.file("b.safetensors"));
  REQUIRE(back["t"].equal(base.t()));
  REQUIRE(back["col"].equal(from_vector<float>({2, 6, 10})));
  REQUIRE(back["t"].is_contiguous());
}

TEST_CASE("safetensors: the bytes written follow the format exactly", "[safetensors]") {
  TempDir dir("tandem_st");
  nn::TensorDict d;
  d.insert("x", from_vector<float>({1.0f, 2.0f}));
  nn::save_safetensors(dir.file("x.safetensors"), d);
  std::string header = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  REQUIRE(header.size() == 54);
  header += "  ";  // padded with spaces to 56, a multiple of 8
  std::vector<uint8_t> data;
  append_le(data, 1.0f);
  append_le(data, 2.0f);
  REQUIRE(read_bytes(dir.file("x.safetensors")) == image(header, data));

  // Larger elements come first, then names in order; metadata leads the header.
  nn::TensorDict mixed;
  mixed.insert("c", from_vector<int32_t>({5}));
  mixed.insert("b", to_dtype(from_vector<float>({1}), f16));
  mixed.insert("a", from_vector<int32_t>({6}));
  mixed.insert("z", from_vector<int64_t>({7}));
  nn::save_safetensors(dir.file("m.safetensors"), mixed, {{"k", "v"}});
  auto bytes = read_bytes(dir.file("m.safetensors"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  REQUIRE(n % 8 == 0);
  std::string text(bytes.begin() + 8, bytes.begin() + 8 + static_cast<long>(n));
  REQUIRE(text.rfind(R"({"__metadata__":{"k":"v"},"z":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                     R"("a":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},)"
                     R"("c":{"dtype":"I32","shape":[1],"data_offsets":[12,16]},)"
                     R"("b":{"dtype":"F16","shape":[1],"data_offsets":[16,18]}})",
                     0) == 0);
  REQUIRE(bytes.size() == 8 + n + 18);
}

TEST_CASE("safetensors: a file built by hand from the spec loads", "[safetensors]") {
  // Offsets in any order, no padding (the spec allows any header length), every dtype.
  std::string header =
      R"({"b":{"dtype":"I64","shape":[],"data_offsets":[8,16]},)"
      R"("__metadata__":{"who":"hand"},)"
      R"( "a" : {"shape":[2],"dtype":"F32","data_offsets":[0,8]},)"
      R"("h":{"dtype":"BF16","shape":[1,1],"data_offsets":[16,18]},)"
      R"("g":{"dtype":"F16","shape":[1],"data_offsets":[18,20]},)"
      R"("f":{"dtype":"BOOL","shape":[2],"data_offsets":[20,22]},)"
      R"("e":{"dtype":"I32","shape":[1],"data_offsets":[22,26]},)"
      R"("d":{"dtype":"F64","shape":[1],"data_offsets":[26,34]},)"
      R"("z":{"dtype":"F32","shape":[0,5],"data_offsets":[34,34]}})";
  std::vector<uint8_t> data;
  append_le(data, 1.5f);
  append_le(data, -4.0f);
  append_le(data, int64_t{-1234567890123});
  append_le(data, uint16_t{0x3fc0});  // bf16 1.5
  append_le(data, uint16_t{0xc000});  // f16 -2
  data.push_back(1);
  data.push_back(0);
  append_le(data, int32_t{-9});
  append_le(data, 0.125);
  TempDir dir("tandem_st");
  write_bytes(dir.file("hand.safetensors"), image(header, data));
  nn::Metadata meta;
  auto d = nn::load_safetensors(dir.file("hand.safetensors"), &meta);
  REQUIRE(meta.at("who") == "hand");
  REQUIRE(d.keys() == std::vector<std::string>{"a", "b", "h", "g", "f", "e", "d", "z"});  // by offset
  REQUIRE(d["a"].equal(from_vector<float>({1.5f, -4.0f})));
  REQUIRE(d["b"].dim() == 0);
  REQUIRE(d["b"].item<int64_t>() == -1234567890123);
  REQUIRE(d["h"].shape() == Shape{1, 1});
  REQUIRE(to_dtype(d["h"], f32).item<float>() == 1.5f);
  REQUIRE(to_dtype(d["g"], f32).item<float>() == -2.0f);
  REQUIRE(d["f"].equal(from_vector<bool>({true, false})));
  REQUIRE(d["e"].item<int32_t>() == -9);
  REQUIRE(d["d"].item<double>() == 0.125);
  REQUIRE(d["z"].shape() == Shape{0, 5});
}

TEST_CASE("safetensors: malformed files are rejected with a clear error", "[safetensors]") {
  auto entry = [](const std::string& body) { return "{\"t\":" + body + "}"; };
  std::vector<uint8_t> eight(8, 0);
  struct Bad {
    std::vector<uint8_t> bytes;
    const char* message;
  };
  std::vector<Bad> cases = {
      {{1, 2, 3}, "too small"},
      {std::vector<uint8_t>(8, 255), "exceeds"},
      {std::vector<uint8_t>{100, 0, 0, 0, 0, 0, 0, 0, '{', '}'}, "runs past the end"},
      {image("{\"t\":", {}), "not valid JSON"},
      {image("[1,2]   ", {}), "does not start with '{'"},
      {image(" {}", {}), "does not start with '{'"},
      {image(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1]})"), {0}), "unsupported dtype 'U8'"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,8]})"), eight), "needs 4 bytes"},
      {image(entry(R"({"dtype":"F32","shape":[3],"data_offsets":[0,12]})"), eight), "outside the 8-byte"},
      {image(entry(R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})"), {0, 0, 0, 0}), "not a non-negative"},
      {image(entry(R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})"), {0, 0, 0, 0}), "not a non-negative"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[4,0]})"), {0, 0, 0, 0}), "outside"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0]})"), {0, 0, 0, 0}), "data_offsets [begin, end]"},
      {image(entry(R"({"dtype":"F32","shape":[1]})"), {0, 0, 0, 0}), "needs dtype, shape and data_offsets"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4],"extra":1})"), {0, 0, 0, 0}),
       "unknown field 'extra'"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[0,4]})"), eight), "cover only 4"},
      {image(entry(R"({"dtype":"F32","shape":[1],"data_offsets":[4,8]})"), eight), "belong to no tensor"},
      {image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
             eight),
       "overlap"},
      {image(entry(R"({"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]})"), {0, 0, 0, 0}),
       "needs too many bytes"},
      {image(entry(R"({"dtype":"BOOL","shape":[1],"data_offsets":[0,1]})"), {7}), "expected 0 or 1"},
      {image(R"({"__metadata__":{"k":1}})", {}), "not a string"},
      {image(R"({"__metadata__":[1]})", {}), "__metadata__ must be an object"},
      {image(R"({"t":[1]})", {}), "is not an object"},
      {image(R"({"t":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", {0, 0, 0, 0}), "non-string dtype"},
      {image("{\"t\":" + std::string(100, '[') + std::string(100, ']') + "}", {}), "nests deeper"},
      // Tied weights' aliases (written by save_safetensors for tensors that view the same data).
      {image(R"({"__metadata__":{"tandem.aliases":"{\"b\":\"a\"}"}})", {}), "alias 'b' names no tensor"},
      {image(R"({"__metadata__":{"tandem.aliases":"[1]"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
             {0, 0, 0, 0}),
       "not a JSON object of names"},
      {image(R"({"__metadata__":{"tandem.aliases":"{\"a\":\"a\"}"},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
             {0, 0, 0, 0}),
       "also a tensor of the file"},
      // The aliases are JSON inside a JSON string: the depth guard applies to them too (a deep one
      // would overflow the stack of a recursive parser or printer).
      {image("{\"__metadata__\":{\"tandem.aliases\":\"{\\\"x\\\":" + std::string(5000, '[') + "\"}}", {}),
       "nests deeper"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    INFO("case " << i << " expecting '" << cases[i].message << "'");
    REQUIRE_THROWS_WITH(parse(cases[i].bytes), Contains("[safetensors]") && Contains(cases[i].message));
  }
  TempDir dir("tandem_st");
  REQUIRE_THROWS_WITH(nn::load_safetensors(dir.file("missing.safetensors")),
                      Contains("[safetensors] cannot open") && Contains("missing.safetensors"));
  write_bytes(dir.file("short.safetensors"), {1, 0, 0});
  REQUIRE_THROWS_WITH(nn::load_safetensors(dir.file("short.safetensors")),
                      Contains("short.safetensors") && Contains("too small"));
}

TEST_CASE("safetensors: fuzzed truncations and corruptions never crash", "[safetensors][fuzz]") {
  TempDir dir("tandem_st");
  nn::save_safetensors(dir.file("f.safetensors"), all_dtypes(), {{"a", "b"}});
  const std::vector<uint8_t> good = read_bytes(dir.file("f.safetensors"));
  require_same(parse(good), all_dtypes());
  std::mt19937_64 rng(20240601);
  int rejected = 0, accepted = 0;
  // Every strict prefix is invalid: the tiling check needs the buffer to end exactly.
  for (int i = 0; i < 300; ++i) {
    size_t len = std::uniform_int_distribution<size_t>(0, good.size() - 1)(rng);
    std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<long>(len));
    INFO("truncated to " << len << " of " << good.size());
    REQUIRE_THROWS_AS(parse(cut), Error);
    ++rejected;
  }
  // Corruptions of random bytes (header and data) and appended garbage: either a clean load
  // or a tandem::Error, nothing else.
  for (int i = 0; i < 400; ++i) {
    std::vector<uint8_t> bad = good;
    int flips = std::uniform_int_distribution<int>(1, 4)(rng);
    for (int f = 0; f < flips; ++f) {
      size_t at = std::uniform_int_distribution<size_t>(0, bad.size() - 1)(rng);
      // Half the time aim at the header, where the structure lives.
      if (i % 2 == 0) at = std::uniform_int_distribution<size_t>(0, std::min<size_t>(bad.size() - 1, 200))(rng);
      bad[at] = static_cast<uint8_t>(rng());
    }
    if (i % 10 == 0) bad.push_back(static_cast<uint8_t>(rng()));
    try {
      auto d = parse(bad);
      ++accepted;
      for (const auto& [name, t] : d) REQUIRE(t.defined());
    } catch (const Error& e) {
      REQUIRE_THAT(e.what(), Contains("[safetensors]"));
      ++rejected;
    }
  }
  REQUIRE(rejected > 300);
  WARN("fuzz: " << rejected << " rejected, " << accepted << " accepted (corrupted data bytes are valid data)");
}

TEST_CASE("safetensors: saving validates names and is atomic", "[safetensors]") {
  TempDir dir("tandem_st");
  nn::TensorDict bad;
  bad.insert("__metadata__", zeros({1}));
  REQUIRE_THROWS_WITH(nn::save_safetensors(dir.file("x"), bad), Contains("reserved"));
  nn::TensorDict empty_name;
  empty_name.insert("", zeros({1}));
  REQUIRE_THROWS_WITH(nn::save_safetensors(dir.file("x"), empty_name), Contains("must not be empty"));
  nn::TensorDict undefined;
  undefined.insert("u", Tensor());
  REQUIRE_THROWS_WITH(nn::save_safetensors(dir.file("x"), undefined), Contains("'u' is undefined"));

  nn::TensorDict ok;
  ok.insert("w", ones({2}));
  std::string missing_dir = dir.file("no/such/dir/w.safetensors");
  REQUIRE_THROWS_WITH(nn::save_safetensors(missing_dir, ok), Contains("[safetensors] cannot create"));

  // Overwriting replaces the old file in one step.
  std::string path = dir.file("w.safetensors");
  nn::save_safetensors(path, ok);
  ok.at("w") = full({3}, 2.0);
  nn::save_safetensors(path, ok);
  REQUIRE(nn::load_safetensors(path)["w"].equal(full({3}, 2.0)));
  for (const auto& e : fs::directory_iterator(dir.path)) {
    REQUIRE(e.path().filename().string().find(".tmp.") == std::string::npos);
  }
}

TEST_CASE("safetensors: save_model / load_model", "[safetensors][nn]") {
  TempDir dir("tandem_st");
  manual_seed(1);
  auto make = [] {
    auto seq = std::make_shared<nn::Sequential>();
    seq->push_back(std::make_shared<nn::Linear>(4, 8));
    seq->push_back(std::make_shared<nn::BatchNorm1d>(8));
    seq->push_back(std::make_shared<nn::ReLU>());
    seq->push_back(std::make_shared<nn::Linear>(8, 2));
    return seq;
  };
  auto a = make();
  (*a)(randn({16, 4}));
  nn::save_model(*a, dir.file("model.safetensors"), {{"epoch", "3"}});
  auto b = make();
  nn::load_model(*b, dir.file("model.safetensors"));
  for (const auto& [name, t] : a->state_dict()) {
    INFO(name);
    REQUIRE(b->state_dict()[name].equal(t));
  }
  nn::Metadata meta;
  nn::load_safetensors(dir.file("model.safetensors"), &meta);
  REQUIRE(meta.at("format") == "pt");
  REQUIRE(meta.at("epoch") == "3");
  a->eval();
  b->eval();
  Tensor x = randn({3, 4});
  REQUIRE((*a)(x).equal((*b)(x)));

  nn::Linear other(4, 8);
  REQUIRE_THROWS_WITH(nn::load_model(other, dir.file("model.safetensors")),
                      Contains("[load_state_dict]") && Contains("unexpected keys"));
}

namespace {

nn::TensorDict expected_interop_tensors() {
  // Must match expected() in tests/nn/safetensors_interop.py.
  nn::TensorDict d;
  d.insert("f32", from_vector<float>({0, 0.5, 1, 1.5, 2, 2.5}, {2, 3}));
  d.insert("f64", from_vector<double>({1.5, -2.25}));
  d.insert("f16", to_dtype(from_vector<float>({0.5, -1, 65504}), f16));
  d.insert("i32", from_vector<int32_t>({1, -2, 3, 4}, {2, 2}));
  d.insert("i64", from_vector<int64_t>({int64_t{1} << 40, -7}));
  d.insert("bool", from_vector<bool>({true, false, true}));
  d.insert("scalar", scalar_tensor(3.25, f32));
  d.insert("empty", zeros({0, 3}));
  return d;
}

bool python_safetensors_available() {
  return std::system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") == 0;
}

}  // namespace

TEST_CASE("safetensors: interop with the reference Python package", "[safetensors][interop]") {
  if (!python_safetensors_available()) {
    WARN("SKIP: python3 cannot import safetensors and numpy (pip install safetensors numpy to run this check)");
    return;
  }
  const std::string script = (fs::path(__FILE__).parent_path() / "safetensors_interop.py").string();
  REQUIRE(fs::exists(script));
  TempDir dir("tandem_st");
  // Tandem writes, Python reads.
  std::string ours = dir.file("tandem.safetensors");
  nn::save_safetensors(ours, expected_interop_tensors(), {{"origin", "tandem"}});
  REQUIRE(std::system(("python3 '" + script + "' check '" + ours + "'").c_str()) == 0);
  // Python writes, Tandem reads.
  std::string theirs = dir.file("python.safetensors");
  REQUIRE(std::system(("python3 '" + script + "' write '" + theirs + "'").c_str()) == 0);
  nn::Metadata meta;
  require_same(nn::load_safetensors(theirs, &meta), expected_interop_tensors());
  REQUIRE(meta.at("origin") == "python");
}
