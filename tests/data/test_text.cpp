// Character-level text (data/text.h): the byte vocabulary, the 90/10 split, next-character
// windows, folders of text files, the DataLoader's sharded random windows, every error, and the
// real fortunes corpus.
#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>

#include "tandem.h"
#include "temp_dir.h"

using namespace tandem;
namespace fs = std::filesystem;
using test_util::TempDir;
using Catch::Contains;

namespace {

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// `n` letters from a fixed generator: long enough windows of it occur once.
std::string random_letters(size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::string s;
  for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>('a' + gen() % 26));
  return s;
}

// The start of every window of `batch` in `split` (a REQUIREd unique match), checking y is x one
// byte on.
std::vector<int64_t> window_starts(const TensorList& batch, const std::map<std::string, int64_t>& start_of,
                                   const data::CharVocab& vocab) {
  std::vector<int64_t> starts;
  for (int64_t k = 0; k < batch[0].size(0); ++k) {
    const std::string x = vocab.decode(batch[0][k]), y = vocab.decode(batch[1][k]);
    REQUIRE(x.substr(1) == y.substr(0, y.size() - 1));
    auto it = start_of.find(x + y.back());
    REQUIRE(it != start_of.end());
    starts.push_back(it->second);
  }
  return starts;
}

}  // namespace

// ---------------------------------------------------------------- CharVocab

TEST_CASE("CharVocab: ids in byte order, an unknown id, decode and the checkpoint form", "[data][text]") {
  const data::CharVocab v = data::CharVocab::of("banana");
  REQUIRE(v.bytes() == "abn");
  REQUIRE(v.size() == 4);
  REQUIRE(v.unknown_id() == 3);
  REQUIRE(v.id('a') == 0);
  REQUIRE(v.id('n') == 2);
  REQUIRE(v.contains('b'));
  REQUIRE_FALSE(v.contains('s'));

  Tensor ids = v.encode("bananas");
  REQUIRE(ids.dtype() == i64);
  REQUIRE(ids.shape() == Shape{7});
  REQUIRE(ids.to_vector<int64_t>() == std::vector<int64_t>{1, 0, 2, 0, 2, 0, 3});
  REQUIRE(v.decode(ids) == "banana\xEF\xBF\xBD");  // the unknown id is U+FFFD
  REQUIRE(v.decode(ids.view({7, 1}).to(i32)) == "banana\xEF\xBF\xBD");  // any integer tensor, row-major
  REQUIRE(v.decode(std::vector<int64_t>{2, 0}) == "na");
  REQUIRE(v.encode("").numel() == 0);

  // Bytes above 0x7f sort as unsigned; a saved vocabulary keeps its own order.
  const data::CharVocab high = data::CharVocab::of("\xff\x80z");
  REQUIRE(high.bytes() == "z\x80\xff");
  const data::CharVocab mine(std::string("ba"));
  REQUIRE(mine.id('b') == 0);
  REQUIRE(mine.id('a') == 1);
  REQUIRE(mine.id('c') == 2);

  // The checkpoint form: byte values as an i64 tensor, read back equal, from i32 as well.
  Tensor saved = high.to_tensor();
  REQUIRE(saved.dtype() == i64);
  REQUIRE(saved.to_vector<int64_t>() == std::vector<int64_t>{0x7a, 0x80, 0xff});
  REQUIRE(data::CharVocab::from_tensor(saved) == high);
  REQUIRE(data::CharVocab::from_tensor(saved.to(i32)) == high);
  REQUIRE_FALSE(data::CharVocab::from_tensor(saved) == v);

  // All 256 bytes: every one has an id below 256 and the unknown id is still decodable.
  std::string every;
  for (int b = 255; b >= 0; --b) every.push_back(static_cast<char>(b));
  const data::CharVocab full = data::CharVocab::of(every);
  REQUIRE(full.size() == 257);
  for (int b = 0; b < 256; ++b) REQUIRE(full.id(static_cast<char>(b)) == b);
  REQUIRE(full.decode(std::vector<int64_t>{256, 65}) == "\xEF\xBF\xBD"
                                                        "A");
}

TEST_CASE("CharVocab: errors", "[data][text]") {
  REQUIRE_THROWS_WITH(data::CharVocab(std::string()), Contains("[CharVocab]") && Contains("at least one byte"));
  REQUIRE_THROWS_WITH(data::CharVocab(std::string("abca")), Contains("0x61 ('a') appears twice"));
  REQUIRE_THROWS_WITH(data::CharVocab::of(""), Contains("[CharVocab] the text is empty"));
  const data::CharVocab v = data::CharVocab::of("ab");
  REQUIRE_THROWS_WITH(v.decode(std::vector<int64_t>{0, 3}), Contains("[CharVocab] decode: id 3 is outside [0, 3)"));
  REQUIRE_THROWS_WITH(v.decode(std::vector<int64_t>{-1}), Contains("id -1 is outside"));
  REQUIRE_THROWS_WITH(v.decode(zeros({2})), Contains("ids must be integers") && Contains("f32"));
  REQUIRE_THROWS_WITH(data::CharVocab::from_tensor(from_vector<int64_t>({97, 300})),
                      Contains("300 is not a byte value"));
  REQUIRE_THROWS_WITH(data::CharVocab::from_tensor(zeros({2, 2}, i64)), Contains("expected a 1-D integer tensor"));
  REQUIRE_THROWS_WITH(data::CharVocab::from_tensor(from_vector<int64_t>({97, 97})), Contains("appears twice"));
}

// ---------------------------------------------------------------- TextDataset

TEST_CASE("TextDataset: windows of a file, y one character on from x, in both splits", "[data][text]") {
  TempDir dir("tandem_test_text");
  const std::string text = random_letters(200, 1);
  write_file(dir.file("corpus.txt"), text);

  data::TextDataset train(dir.file("corpus.txt"), {.block_size = 8});
  REQUIRE(train.split() == data::TextSplit::train);
  REQUIRE(train.split_bytes() == 180);  // the first 90%
  REQUIRE(train.size() == 180 - 8);     // every start with 9 bytes after it
  REQUIRE(train.vocab() == data::CharVocab::of(text.substr(0, 180)));
  REQUIRE(train.unknown_bytes() == 0);
  REQUIRE(train.name() == dir.file("corpus.txt"));

  const std::vector<int64_t> picks = {0, 5, 171, 5};
  TensorList batch = train.get_batch(picks);
  REQUIRE(batch.size() == 2);
  for (const Tensor& t : batch) {
    REQUIRE(t.dtype() == i64);
    REQUIRE(t.shape() == Shape{4, 8});
  }
  for (size_t k = 0; k < picks.size(); ++k) {
    const auto start = static_cast<size_t>(picks[k]);
    REQUIRE(train.vocab().decode(batch[0][static_cast<int64_t>(k)]) == text.substr(start, 8));
    REQUIRE(train.vocab().decode(batch[1][static_cast<int64_t>(k)]) == text.substr(start + 1, 8));
  }
  // x's ids are the vocabulary's.
  REQUIRE(batch[0][1].to_vector<int64_t>() == train.vocab().encode(text.substr(5, 8)).to_vector<int64_t>());
  // A batch is fresh: writing into it changes nothing the next one sees.
  batch[0].fill_(0);
  REQUIRE(train.get_batch(picks)[0].equal(train.get_batch(picks)[0]));
  REQUIRE_FALSE(train.get_batch(picks)[0].equal(batch[0]));
  REQUIRE(train.get_batch({}).at(0).shape() == Shape{0, 8});
  REQUIRE_THROWS_WITH(train.get_batch(std::vector<int64_t>{172}),
                      Contains("[TextDataset] index 172 is out of range for 172 windows of") &&
                          Contains("corpus.txt"));
  REQUIRE_THROWS_WITH(train.get_batch(std::vector<int64_t>{-1}), Contains("index -1 is out of range"));

  // The validation split: the last 10%, the training split's vocabulary without being given it.
  data::TextDataset val(dir.file("corpus.txt"), {.block_size = 8, .split = data::TextSplit::validation});
  REQUIRE(val.split_bytes() == 20);
  REQUIRE(val.size() == 12);
  REQUIRE(val.vocab() == train.vocab());
  TensorList last = val.get_batch(std::vector<int64_t>{11});
  REQUIRE(val.vocab().decode(last[0]) == text.substr(191, 8));
  REQUIRE(val.vocab().decode(last[1]) == text.substr(192, 8));

  // Stride: windows start every `stride` bytes; stride == block_size tiles the split.
  data::TextDataset tiled(dir.file("corpus.txt"), {.block_size = 8, .stride = 8});
  REQUIRE(tiled.size() == (180 - 9) / 8 + 1);
  REQUIRE(tiled.vocab().decode(tiled.get_batch(std::vector<int64_t>{21})[1]) == text.substr(169, 8));

  // from_text: the same data set from bytes in memory.
  auto same = data::TextDataset::from_text(text, {.block_size = 8}, "mine");
  REQUIRE(same.name() == "mine");
  REQUIRE(same.size() == train.size());
  REQUIRE(same.get_batch(picks)[1].equal(train.get_batch(picks)[1]));
}

TEST_CASE("TextDataset: the vocabulary is the training split's bytes; others are the unknown id", "[data][text]") {
  // 90 bytes of a..e, then 10 of which three are Z: Z is not in the vocabulary.
  std::string text;
  for (int i = 0; i < 90; ++i) text.push_back(static_cast<char>('a' + i % 5));
  text += "abZZcdeZab";
  auto train = data::TextDataset::from_text(text, {.block_size = 4});
  auto val = data::TextDataset::from_text(text, {.block_size = 4, .split = data::TextSplit::validation});
  REQUIRE(train.vocab().bytes() == "abcde");
  REQUIRE(train.vocab().size() == 6);
  REQUIRE(val.vocab() == train.vocab());
  REQUIRE(train.unknown_bytes() == 0);
  REQUIRE(val.unknown_bytes() == 3);
  TensorList batch = val.get_batch(std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  REQUIRE(batch[0][0].to_vector<int64_t>() == std::vector<int64_t>{0, 1, 5, 5});  // "abZZ"
  REQUIRE(batch[1][5].to_vector<int64_t>() == std::vector<int64_t>{4, 5, 0, 1});  // "eZab"
  // Every target is a class of the model's, so the validation loss is defined: uniform logits give
  // exactly log(vocab size).
  Tensor logits = zeros({batch[1].numel(), train.vocab().size()});
  const double loss = nn::cross_entropy(logits, batch[1].flatten()).item<double>();
  REQUIRE(loss == Approx(std::log(6.0)).epsilon(1e-6));

  // A saved vocabulary (a resumed run's, read back from its tensor) gives the same ids ...
  const data::CharVocab saved = data::CharVocab::from_tensor(train.vocab().to_tensor());
  auto resumed = data::TextDataset::from_text(text, {.block_size = 4, .vocab = saved});
  const std::vector<int64_t> picks = {0, 7, 85};
  REQUIRE(resumed.get_batch(picks)[0].equal(train.get_batch(picks)[0]));
  // ... and a given vocabulary is used as given: its order, its unknown bytes.
  auto other = data::TextDataset::from_text(text, {.block_size = 4, .vocab = data::CharVocab(std::string("edcbZ"))});
  REQUIRE(other.vocab().size() == 6);
  REQUIRE(other.unknown_bytes() == 90 / 5);  // every 'a' of the training split is unknown to it
  REQUIRE(other.get_batch(std::vector<int64_t>{0})[0].to_vector<int64_t>() == std::vector<int64_t>{5, 3, 2, 1});
  auto other_val = data::TextDataset::from_text(
      text, {.block_size = 4, .split = data::TextSplit::validation, .vocab = data::CharVocab(std::string("edcbZ"))});
  REQUIRE(other_val.unknown_bytes() == 2);
}

TEST_CASE("TextDataset with the DataLoader: random windows, distinct across ranks, set by seed and epoch",
          "[data][text][loader]") {
  const std::string text = random_letters(1000, 2);
  const int64_t block = 6;
  auto train = std::make_shared<const data::TextDataset>(data::TextDataset::from_text(text, {.block_size = block}));
  const int64_t n = train->size();
  REQUIRE(n == 900 - block);
  // Every window of the split (x plus y's last byte) occurs once, so a batch row tells its start.
  std::map<std::string, int64_t> start_of;
  for (int64_t i = 0; i < n; ++i) start_of[text.substr(static_cast<size_t>(i), block + 1)] = i;
  REQUIRE(static_cast<int64_t>(start_of.size()) == n);

  const int world = 2;
  auto epoch_starts = [&](uint64_t seed, int64_t epoch, int rank) {
    data::DataLoader loader(train, {.batch_size = 16, .seed = seed, .num_replicas = world, .rank = rank});
    loader.set_epoch(epoch);
    std::vector<int64_t> starts;
    for (const TensorList& batch : loader) {
      REQUIRE(batch[0].shape()[1] == block);
      for (int64_t s : window_starts(batch, start_of, train->vocab())) starts.push_back(s);
    }
    return starts;
  };
  std::vector<int64_t> r0 = epoch_starts(7, 0, 0), r1 = epoch_starts(7, 0, 1);
  REQUIRE(static_cast<int64_t>(r0.size()) == n / world);
  REQUIRE(r1.size() == r0.size());
  // The loader's sampler decides: rank r reads its shard of the seed + epoch permutation.
  data::DistributedSampler sampler(n, world, 0, {.seed = 7});
  REQUIRE(r0 == sampler.indices());
  // The ranks' windows are disjoint and together every window once; shuffled, not in text order.
  std::set<int64_t> all(r0.begin(), r0.end());
  all.insert(r1.begin(), r1.end());
  REQUIRE(static_cast<int64_t>(all.size()) == n);
  REQUIRE_FALSE(std::is_sorted(r0.begin(), r0.end()));
  // Deterministic: the same seed and epoch read the same windows; another epoch or seed do not.
  REQUIRE(epoch_starts(7, 0, 0) == r0);
  REQUIRE(epoch_starts(7, 1, 0) != r0);
  REQUIRE(epoch_starts(8, 0, 0) != r0);
}

TEST_CASE("read_text_corpus: a folder is its text files in name order, without indexes, links or hidden files",
          "[data][text]") {
  TempDir dir("tandem_test_text");
  write_file(dir.file("b"), "second\n");
  write_file(dir.file("a"), "first\n");
  write_file(dir.file("a.dat"), std::string("\0\0\0\x02index", 9));
  write_file(dir.file(".hidden"), "hidden\n");
  fs::create_symlink(dir.file("a"), dir.file("a.u8"));
  fs::create_directories(dir.path / "off");
  write_file((dir.path / "off" / "c").string(), "offensive\n");
  REQUIRE(data::read_text_corpus(dir.path.string()) == "first\nsecond\n");
  REQUIRE(data::read_text_corpus(dir.file("b")) == "second\n");
  REQUIRE(data::TextDataset::available(dir.path.string()));
  REQUIRE(data::TextDataset::available(dir.file("a")));
  data::TextDataset folder(dir.path.string(), {.block_size = 2});
  REQUIRE(folder.split_bytes() == 11);  // 90% of "first\nsecond\n"
  REQUIRE(folder.vocab() == data::CharVocab::of("first\nsecon"));
}

TEST_CASE("TextDataset: missing, empty or too short text is one error naming the path", "[data][text]") {
  TempDir dir("tandem_test_text");
  const std::string missing = dir.file("nope.txt");
  REQUIRE_THROWS_WITH(data::TextDataset(missing), Contains("[TextDataset] " + missing + ": no such file or directory"));
  REQUIRE_FALSE(data::TextDataset::available(missing));

  write_file(dir.file("empty.txt"), "");
  REQUIRE_THROWS_WITH(data::TextDataset(dir.file("empty.txt")),
                      Contains("[TextDataset] " + dir.file("empty.txt") + ": the file is empty"));
  REQUIRE_FALSE(data::TextDataset::available(dir.file("empty.txt")));

  // A FIFO would block the reader forever: only regular files (or folders) are read.
  const std::string fifo = dir.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  REQUIRE_THROWS_WITH(data::read_text_corpus(fifo), Contains("[TextDataset] " + fifo + ": not a regular file or a folder"));

  // A folder with nothing to read, then with only empty text files.
  const fs::path folder = dir.path / "corpus";
  fs::create_directories(folder);
  write_file((folder / "x.dat").string(), "index");
  REQUIRE_THROWS_WITH(data::read_text_corpus(folder.string()),
                      Contains("[TextDataset] " + folder.string() + ": the folder holds no text files"));
  REQUIRE_FALSE(data::TextDataset::available(folder.string()));
  write_file((folder / "a").string(), "");
  write_file((folder / "b").string(), "");
  REQUIRE_THROWS_WITH(data::TextDataset(folder.string()),
                      Contains("[TextDataset] " + folder.string() + ": the folder's 2 text files are all empty"));
  REQUIRE_FALSE(data::TextDataset::available(folder.string()));

  // 50 bytes: 45 for training, 5 for validation.
  const std::string shortfile = dir.file("short.txt");
  write_file(shortfile, random_letters(50, 3));
  REQUIRE(data::TextDataset(shortfile, {.block_size = 44}).size() == 1);
  REQUIRE_THROWS_WITH(data::TextDataset(shortfile, {.block_size = 45}),
                      Contains("[TextDataset] " + shortfile + ": the train split holds 45 bytes (the first 90% of 50), "
                               "fewer than one window of block_size + 1 (45 + 1)"));
  // A block_size whose window length overflows int64 is the same error, not an overflow.
  REQUIRE_THROWS_WITH(data::TextDataset(shortfile, {.block_size = std::numeric_limits<int64_t>::max()}),
                      Contains("fewer than one window of block_size + 1 (9223372036854775807 + 1)"));
  REQUIRE(data::TextDataset(shortfile, {.block_size = 4, .split = data::TextSplit::validation}).size() == 1);
  REQUIRE_THROWS_WITH(data::TextDataset(shortfile, {.block_size = 8, .split = data::TextSplit::validation}),
                      Contains("the validation split holds 5 bytes (the last 10% of 50)") && Contains(shortfile));
  REQUIRE_THROWS_WITH(data::TextDataset(shortfile, {.block_size = 0}), Contains("block_size must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(data::TextDataset(shortfile, {.stride = 0}), Contains("stride must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(data::TextDataset::from_text("", {}, "prompt"),
                      Contains("[TextDataset] prompt: the text is empty"));
}

TEST_CASE("TextDataset on Debian's fortunes, the default corpus", "[data][text][fortunes]") {
  const std::string root = data::default_text_corpus_path();
  if (!data::TextDataset::available(root)) {
    WARN("SKIP: the fortunes corpus is not installed in " << root << " (apt-get install fortunes)");
    return;
  }
  const std::string corpus = data::read_text_corpus(root);
  REQUIRE(corpus.size() > 1'000'000);
  REQUIRE(corpus.find('\0') == std::string::npos);  // no binary *.dat index got in
  // The files in name order: the corpus starts with the first one.
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root))
    if (!e.is_symlink() && e.is_regular_file() && e.path().extension() != ".dat" &&
        !e.path().filename().string().starts_with("."))
      names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  REQUIRE_FALSE(names.empty());
  std::ifstream first_file(fs::path(root) / names.front(), std::ios::binary);
  const std::string first((std::istreambuf_iterator<char>(first_file)), {});
  REQUIRE(corpus.compare(0, first.size(), first) == 0);

  const int64_t block = 256;
  data::TextDataset train(root, {.block_size = block});
  data::TextDataset val(root, {.block_size = block, .split = data::TextSplit::validation, .vocab = train.vocab()});
  REQUIRE(train.split_bytes() + val.split_bytes() == static_cast<int64_t>(corpus.size()));
  REQUIRE(train.vocab().size() > 60);  // letters, digits, punctuation, whitespace, some UTF-8 bytes
  REQUIRE(train.unknown_bytes() == 0);
  INFO("vocabulary " << train.vocab().size() << " ids; " << val.unknown_bytes() << " validation bytes unknown");

  data::DataLoader loader(train, {.batch_size = 32, .seed = 1, .num_replicas = 2, .rank = 1});
  auto first_batch = loader.begin();
  const TensorList& batch = *first_batch;
  REQUIRE(batch[0].shape() == Shape{32, block});
  REQUIRE(batch[1].max().item<int64_t>() < train.vocab().size());
  const std::string_view train_text = std::string_view(corpus).substr(0, static_cast<size_t>(train.split_bytes()));
  for (int64_t k = 0; k < 32; ++k) {
    const std::string x = train.vocab().decode(batch[0][k]), y = train.vocab().decode(batch[1][k]);
    REQUIRE(train_text.find(x + y.back()) != std::string_view::npos);
  }
  // Validation tiled by block_size: one pass has every byte of the split as a target once, but the
  // first and fewer than block_size at the end; every id (unknown ones too) is a class of the model's.
  data::TextDataset tiled(root, {.block_size = block, .split = data::TextSplit::validation, .stride = block});
  data::DataLoader all(tiled, {.batch_size = 64, .shuffle = false});
  int64_t targets = 0;
  for (const TensorList& b : all) {
    targets += b[1].numel();
    REQUIRE(b[1].max().item<int64_t>() < train.vocab().size());
  }
  REQUIRE(targets == tiled.size() * block);
  REQUIRE(targets > val.split_bytes() - block - 1);
}
