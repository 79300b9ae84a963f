// The data layer: IDX reading (plain, gzipped, corrupt), TensorDataset, the DataLoader (shards,
// shuffles, order, prefetch, drop_last, shutdown, errors) and the real Fashion-MNIST files.
#include <catch2/catch.hpp>

#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "core/detail/sanitizers.h"
#include "tandem.h"
#include "temp_dir.h"

using namespace tandem;
namespace fs = std::filesystem;
using test_util::TempDir;
using Catch::Contains;

namespace {

using Bytes = std::string;

// An IDX file's bytes: magic, big-endian dims, then the payload as given.
Bytes idx_bytes(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& payload) {
  Bytes b = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8) b.push_back(static_cast<char>((d >> shift) & 0xff));
  return b + payload;
}

template <class T> Bytes big_endian(const std::vector<T>& values) {
  Bytes b;
  for (T v : values) {
    char raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    for (size_t i = sizeof(T); i-- > 0;) b.push_back(raw[i]);  // the host is little-endian
  }
  return b;
}

void write_raw(const std::string& path, const Bytes& bytes) {
  std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// level 0 writes stored (uncompressed) deflate blocks, so a byte of the payload can be flipped
// where we know it lies.
void write_gz(const std::string& path, const Bytes& bytes, int level = 6) {
  gzFile f = gzopen(path.c_str(), ("wb" + std::to_string(level)).c_str());
  REQUIRE(f != nullptr);
  REQUIRE(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(f) == Z_OK);
}

Bytes read_raw(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

std::vector<int64_t> as_i64(const Tensor& t) { return t.to_vector<int64_t>(); }

}  // namespace

// ---------------------------------------------------------------- read_idx

TEST_CASE("read_idx reads plain and gzipped files of every element type", "[data][idx]") {
  TempDir dir("tandem_test_data");
  const Bytes u8 = idx_bytes(0x08, {2, 3}, Bytes{0, 1, 2, 127, char(200), char(255)});
  write_raw(dir.file("u8.idx"), u8);
  write_gz(dir.file("u8.idx.gz"), u8);
  for (const std::string name : {"u8.idx", "u8.idx.gz"}) {
    INFO(name);
    Tensor t = data::read_idx(dir.file(name), f32);
    REQUIRE(t.shape() == Shape{2, 3});
    REQUIRE(t.dtype() == f32);
    REQUIRE(t.is_contiguous());
    REQUIRE(t.to_vector<float>() == std::vector<float>{0, 1, 2, 127, 200, 255});
    REQUIRE(as_i64(data::read_idx(dir.file(name), i64)) == std::vector<int64_t>{0, 1, 2, 127, 200, 255});
    REQUIRE(data::read_idx(dir.file(name), boolean).to_vector<bool>() ==
            std::vector<bool>{false, true, true, true, true, true});
  }
  // The name does not decide: a gzipped file without .gz, a plain one with it.
  write_gz(dir.file("gz_without_suffix"), u8);
  write_raw(dir.file("plain.gz"), u8);
  REQUIRE(data::read_idx(dir.file("gz_without_suffix"), i64).equal(data::read_idx(dir.file("plain.gz"), i64)));

  write_gz(dir.file("i8.gz"), idx_bytes(0x09, {3}, Bytes{char(-128), char(-1), 5}));
  REQUIRE(as_i64(data::read_idx(dir.file("i8.gz"), i64)) == std::vector<int64_t>{-128, -1, 5});
  write_gz(dir.file("i16.gz"), idx_bytes(0x0B, {2, 1}, big_endian<int16_t>({-30000, 513})));
  REQUIRE(data::read_idx(dir.file("i16.gz"), i32).to_vector<int32_t>() == std::vector<int32_t>{-30000, 513});
  write_gz(dir.file("i32.gz"), idx_bytes(0x0C, {2}, big_endian<int32_t>({-2000000000, 16909060})));
  REQUIRE(as_i64(data::read_idx(dir.file("i32.gz"), i64)) == std::vector<int64_t>{-2000000000, 16909060});
  write_raw(dir.file("f32.idx"), idx_bytes(0x0D, {1, 2}, big_endian<float>({1.5f, -0.25f})));
  REQUIRE(data::read_idx(dir.file("f32.idx"), f64).to_vector<double>() == std::vector<double>{1.5, -0.25});
  write_raw(dir.file("f64.idx"), idx_bytes(0x0E, {2}, big_endian<double>({3.141592653589793, -1e300})));
  REQUIRE(data::read_idx(dir.file("f64.idx"), f64).to_vector<double>() == std::vector<double>{3.141592653589793, -1e300});
  REQUIRE(data::read_idx(dir.file("f64.idx"), bf16).dtype() == bf16);

  // A payload larger than zlib's buffers, with a zero dim elsewhere.
  Bytes big(1000 * 784, 0);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 24);
  write_gz(dir.file("big.gz"), idx_bytes(0x08, {1000, 28, 28}, big));
  Tensor t = data::read_idx(dir.file("big.gz"), i32);
  REQUIRE(t.shape() == Shape{1000, 28, 28});
  REQUIRE(t.to_vector<int32_t>()[123457] == static_cast<uint8_t>(big[123457]));
  write_raw(dir.file("empty_dim.idx"), idx_bytes(0x08, {0, 28}, ""));
  REQUIRE(data::read_idx(dir.file("empty_dim.idx"), f32).shape() == Shape{0, 28});
}

TEST_CASE("read_idx names the file and the defect of a bad one", "[data][idx]") {
  TempDir dir("tandem_test_data");
  auto fails_with = [&](const std::string& name, const std::string& text, Dtype dtype = f32) {
    const std::string path = dir.file(name);
    INFO(path);
    REQUIRE_THROWS_WITH(data::read_idx(path, dtype), Contains("[read_idx] " + path + ": ") && Contains(text));
  };
  fails_with("missing.gz", "cannot open: No such file or directory");
  fails_with("", "read error: Is a directory");

  write_raw(dir.file("magic"), Bytes{1, 2, 8, 1, 0, 0, 0, 1, 7});
  fails_with("magic", "not an IDX file: magic bytes 01 02 08 01");
  write_gz(dir.file("magic.gz"), "PK\x03\x04 a zip file");
  fails_with("magic.gz", "not an IDX file: magic bytes 50 4b 03 04");
  write_raw(dir.file("type"), idx_bytes(0x0A, {1}, "x"));
  fails_with("type", "unknown IDX element type 0x0a");
  write_raw(dir.file("float_to_int"), idx_bytes(0x0D, {1}, big_endian<float>({1})));
  fails_with("float_to_int", "f32 elements cannot be read as i64", i64);

  write_raw(dir.file("empty"), "");
  fails_with("empty", "file ends inside the header (0 of the 4 magic bytes)");
  write_raw(dir.file("header"), idx_bytes(0x08, {2, 3, 3}, "").substr(0, 10));
  fails_with("header", "file ends inside the header (6 of the 12 bytes of 3 dims)");
  write_raw(dir.file("short"), idx_bytes(0x08, {2, 3, 3}, Bytes(10, 'x')));
  fails_with("short", "payload too short: dims [2, 3, 3] of u8 need 18 bytes, the file has 10");
  write_gz(dir.file("short.gz"), idx_bytes(0x0C, {4}, big_endian<int32_t>({1, 2, 3})));
  fails_with("short.gz", "payload too short: dims [4] of i32 need 16 bytes, the file has 12");
  write_gz(dir.file("long.gz"), idx_bytes(0x08, {2}, "abc"));
  fails_with("long.gz", "payload too long: dims [2] of u8 need 2 bytes, the file has more");
  // A header claiming 2^64/8 bytes, and one claiming 256 GiB: neither is allocated up front.
  write_raw(dir.file("huge"), idx_bytes(0x0E, {0xffffffff, 0xffffffff, 0xffffffff}, "x"));
  fails_with("huge", "dims [4294967295, 4294967295, 4294967295] are too large to be real");
  write_gz(dir.file("claims.gz"), idx_bytes(0x08, {65536, 65536, 64}, Bytes(100, 'x')));
  fails_with("claims.gz", "payload too short: dims [65536, 65536, 64] of u8 need 274877906944 bytes, the file has 100");

  // gzip damage: a cut stream, a flipped payload byte (stored blocks: the byte is copied as it
  // is, so only the CRC can tell), a wrong length in the trailer.
  const Bytes good = idx_bytes(0x08, {10, 10}, Bytes(100, 'a'));
  write_gz(dir.file("good.gz"), good, 0);
  REQUIRE(data::read_idx(dir.file("good.gz"), f32).numel() == 100);
  const Bytes gz = read_raw(dir.file("good.gz"));
  write_raw(dir.file("cut_trailer.gz"), gz.substr(0, gz.size() - 5));
  fails_with("cut_trailer.gz", "truncated gzip stream");
  write_raw(dir.file("cut_payload.gz"), gz.substr(0, 40));
  fails_with("cut_payload.gz", "truncated gzip stream (the file ends inside it)");
  Bytes flipped = gz;
  flipped[10 + 5 + 60] ^= 0x10;  // gzip header, stored-block header, then 60 bytes into the IDX data
  write_raw(dir.file("flipped.gz"), flipped);
  fails_with("flipped.gz", "corrupt gzip data: CRC-32 mismatch (incorrect data check)");
  Bytes length = gz;
  length[gz.size() - 1] ^= 0x01;
  write_raw(dir.file("length.gz"), length);
  fails_with("length.gz", "uncompressed length mismatch (incorrect length check)");
  // A flipped byte of a compressed stream: some gzip error (which one depends on the byte).
  Bytes compressed_payload(5000, 0);
  for (size_t i = 0; i < compressed_payload.size(); ++i) compressed_payload[i] = static_cast<char>(i * i % 251);
  write_gz(dir.file("deflated.gz"), idx_bytes(0x08, {5000}, compressed_payload));
  Bytes deflated = read_raw(dir.file("deflated.gz"));
  deflated[deflated.size() / 2] ^= 0xff;
  write_raw(dir.file("deflated_flipped.gz"), deflated);
  fails_with("deflated_flipped.gz", "gzip");
}

// ---------------------------------------------------------------- TensorDataset

// Found by fuzz_idx (slow inputs): the reader zero-filled a 256 MiB buffer for any header that
// claimed that much, before finding the file short. A child process whose address space allows
// 64 MiB more than it has must get the "payload too short" error, not std::bad_alloc.
TEST_CASE("read_idx: a header claiming more than the file holds allocates what the file holds", "[data][idx][fuzz]") {
#if TANDEM_ASAN || TANDEM_TSAN
  WARN("SKIP: address-space limits do not apply under a sanitizer's shadow memory");
#else
  TempDir dir("tandem_test_data");
  const std::string path = dir.file("claims");
  write_raw(path, idx_bytes(0x08, {1u << 16, 1u << 16, 64}, Bytes(3u << 20, 'x')));
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    long pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const rlim_t limit = static_cast<rlim_t>(pages) * static_cast<rlim_t>(sysconf(_SC_PAGESIZE)) + (rlim_t{64} << 20);
    const rlimit lim{limit, limit};
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(5);
    try {
      data::read_idx(path, f32);
      _exit(2);
    } catch (const Error& e) {
      _exit(std::string(e.what()).find("payload too short") != std::string::npos ? 0 : 3);
    } catch (...) {
      _exit(4);  // std::bad_alloc: the buffer followed the header's claim
    }
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  INFO("child exit status: 0 the error, 2 no error, 3 another error, 4 another exception, 5 setrlimit failed");
  CHECK(WEXITSTATUS(status) == 0);
#endif
}

TEST_CASE("TensorDataset gathers rows into fresh tensors and checks its tensors", "[data][dataset]") {
  Tensor x = arange(12).to(f32).view({4, 3});
  Tensor y = from_vector<int64_t>({10, 11, 12, 13});
  data::TensorDataset ds({x, y});
  REQUIRE(ds.size() == 4);
  const std::vector<int64_t> idx = {3, 0, 3};
  TensorList b = ds.get_batch(idx);
  REQUIRE(b.size() == 2);
  REQUIRE(b[0].shape() == Shape{3, 3});
  REQUIRE(b[0].equal(index_select(x, 0, from_vector(idx))));
  REQUIRE(as_i64(b[1]) == std::vector<int64_t>{13, 10, 13});
  b[0].fill_(-1);
  REQUIRE(x.to_vector<float>()[9] == 9);  // the batch did not alias the data set
  REQUIRE(ds.get_batch({}).at(0).shape() == Shape{0, 3});

  // A non-contiguous tensor is made contiguous once; a tensor that requires grad is detached.
  Tensor w = arange(8).to(f64).view({2, 4}).t().requires_grad_();
  data::TensorDataset dt({w});
  REQUIRE(dt.tensors()[0].is_contiguous());
  REQUIRE_FALSE(dt.tensors()[0].requires_grad());
  REQUIRE(dt.get_batch(std::vector<int64_t>{1}).at(0).to_vector<double>() == std::vector<double>{1, 5});

  REQUIRE_THROWS_WITH(data::TensorDataset({}), Contains("[TensorDataset] needs at least one tensor"));
  REQUIRE_THROWS_WITH(data::TensorDataset({x, from_vector<int64_t>({1, 2})}),
                      Contains("[TensorDataset] tensors have different numbers of rows: tensor 0 is [4, 3], tensor 1 is [2]"));
  REQUIRE_THROWS_WITH(data::TensorDataset({scalar_tensor(1.0)}), Contains("tensor 0 is 0-dim"));
  REQUIRE_THROWS_WITH(ds.get_batch(std::vector<int64_t>{4}),
                      Contains("[TensorDataset] index 4 is out of range for a data set of 4 examples"));
}

// ---------------------------------------------------------------- DataLoader

namespace {

// Example i is the row {i}: a batch's values are its example indices.
std::shared_ptr<data::TensorDataset> counting_dataset(int64_t n) {
  return std::make_shared<data::TensorDataset>(TensorList{arange(n).view({n, 1}), arange(n).to(f32)});
}

// Every batch of one epoch, as lists of example indices.
std::vector<std::vector<int64_t>> epoch_batches(data::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (const TensorList& b : loader) {
    REQUIRE(b[0].dim() == 2);
    REQUIRE(b[1].to(i64).equal(b[0].view({-1})));
    out.push_back(as_i64(b[0]));
  }
  return out;
}

std::vector<int64_t> flat(const std::vector<std::vector<int64_t>>& batches) {
  std::vector<int64_t> all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

}  // namespace

TEST_CASE("DataLoader: batches arrive in the sampler's order, with any prefetch depth", "[data][loader]") {
  auto ds = counting_dataset(103);
  for (int prefetch : {0, 1, 2, 5}) {
    INFO("prefetch " << prefetch);
    data::DataLoader loader(ds, {.batch_size = 8, .seed = 7, .prefetch = prefetch});
    REQUIRE(loader.num_batches() == 13);
    data::DistributedSampler sampler(103, 1, 0, {.seed = 7});
    for (int64_t epoch : {0, 1, 4}) {
      loader.set_epoch(epoch);
      sampler.set_epoch(epoch);
      auto batches = epoch_batches(loader);
      REQUIRE(batches.size() == 13);
      REQUIRE(flat(batches) == sampler.indices());
      REQUIRE(batches.back().size() == 103 - 12 * 8);
    }
  }
}

TEST_CASE("DataLoader: the last partial batch, with and without drop_last", "[data][loader]") {
  auto ds = counting_dataset(10);
  data::DataLoader keep(ds, {.batch_size = 4, .shuffle = false});
  REQUIRE(epoch_batches(keep) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9}});
  data::DataLoader drop(ds, {.batch_size = 4, .shuffle = false, .drop_last = true});
  REQUIRE(drop.num_batches() == 2);
  REQUIRE(epoch_batches(drop) == std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
  data::DataLoader exact(ds, {.batch_size = 5, .shuffle = false, .drop_last = true});
  REQUIRE(epoch_batches(exact).size() == 2);
  data::DataLoader too_big(ds, {.batch_size = 11, .drop_last = true});
  REQUIRE(too_big.num_batches() == 0);
  REQUIRE(epoch_batches(too_big).empty());
  data::DataLoader empty(counting_dataset(0), {.batch_size = 3});
  REQUIRE(epoch_batches(empty).empty());
}

TEST_CASE("DataLoader: 2 and 3 ranks cover the data set once per epoch, shuffled alike on every rank",
          "[data][loader]") {
  const int64_t n = 10;
  auto ds = counting_dataset(n);
  for (int world : {2, 3}) {
    for (bool shard_drop_last : {false, true}) {
      INFO("world " << world << ", shard_drop_last " << shard_drop_last);
      std::vector<std::unique_ptr<data::DataLoader>> ranks;
      for (int r = 0; r < world; ++r)
        ranks.push_back(std::make_unique<data::DataLoader>(
            ds, data::LoaderOptions{.batch_size = 2, .seed = 3, .num_replicas = world, .rank = r,
                                    .shard_drop_last = shard_drop_last}));
      std::vector<int64_t> previous;
      for (int64_t epoch = 0; epoch < 3; ++epoch) {
        std::vector<std::vector<int64_t>> shard(world);
        for (int r = 0; r < world; ++r) {
          ranks[r]->set_epoch(epoch);
          shard[r] = flat(epoch_batches(*ranks[r]));
          REQUIRE(static_cast<int64_t>(shard[r].size()) == ranks[r]->num_samples());
        }
        // Rank r holds positions r, r + world, ... of one epoch order: interleaving the shards
        // rebuilds it, and its first n entries (before padding) are a permutation of the data set
        // only if every rank shuffled alike.
        std::vector<int64_t> order;
        for (size_t k = 0; k < shard[0].size(); ++k)
          for (int r = 0; r < world; ++r) order.push_back(shard[r][k]);
        const int64_t kept = shard_drop_last ? n - n % world : n;
        REQUIRE(static_cast<int64_t>(order.size()) == (shard_drop_last ? kept : (n + world - 1) / world * world));
        std::vector<int64_t> head(order.begin(), order.begin() + std::min<int64_t>(kept, order.size()));
        std::set<int64_t> distinct(head.begin(), head.end());
        REQUIRE(static_cast<int64_t>(distinct.size()) == kept);
        if (!shard_drop_last) {
          REQUIRE(distinct.size() == static_cast<size_t>(n));  // every example, once
          // DistributedSampler pads with the order's first entries.
          for (size_t k = n; k < order.size(); ++k) REQUIRE(order[k] == order[k - n]);
        }
        REQUIRE(order != previous);  // a new shuffle each epoch
        previous = order;
      }
    }
  }
}

namespace {

// A data set that records how it is used, and fails on the batch holding example `fail_at`.
struct ProbeDataset : data::Dataset {
  std::shared_ptr<data::TensorDataset> inner = counting_dataset(40);
  int64_t fail_at = -1;
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  mutable int64_t made = 0;
  mutable std::set<std::thread::id> threads;
  mutable bool grad_mode_seen = false;

  int64_t size() const override { return inner->size(); }
  TensorList get_batch(std::span<const int64_t> indices) const override {
    {
      std::lock_guard<std::mutex> lock(mutex);
      threads.insert(std::this_thread::get_id());
      grad_mode_seen = grad_mode_seen || autograd::grad_mode_enabled();
    }
    if (std::find(indices.begin(), indices.end(), fail_at) != indices.end())
      fail("[ProbeDataset] example {} is unreadable", fail_at);
    TensorList b = inner->get_batch(indices);
    {
      std::lock_guard<std::mutex> lock(mutex);
      ++made;
    }
    changed.notify_all();
    return b;
  }
  bool wait_for_made(int64_t count) const {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, std::chrono::seconds(30), [&] { return made >= count; });
  }
};

}  // namespace

TEST_CASE("DataLoader: prefetch makes batches on one background thread, at most `prefetch` ahead",
          "[data][loader]") {
  for (int prefetch : {0, 1, 3}) {
    INFO("prefetch " << prefetch);
    auto ds = std::make_shared<ProbeDataset>();
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .prefetch = prefetch});
    int64_t taken = 0;
    for (const TensorList& b : loader) {
      ++taken;
      REQUIRE(as_i64(b[0]).front() == 4 * (taken - 1));
      std::lock_guard<std::mutex> lock(ds->mutex);
      REQUIRE(ds->made <= taken + prefetch);  // bounded queue
    }
    REQUIRE(taken == 10);
    // Without prefetch, only here; with it, the prefetch thread, and here for a batch the thread
    // had not started when it was asked for.
    REQUIRE(ds->threads.size() <= (prefetch == 0 ? 1u : 2u));
    if (prefetch == 0) REQUIRE(*ds->threads.begin() == std::this_thread::get_id());
    REQUIRE_FALSE(ds->grad_mode_seen);
  }
  {
    // With room for the whole epoch the thread makes every batch while the consumer holds the
    // first, on a thread of its own.
    auto ds = std::make_shared<ProbeDataset>();
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .prefetch = 10});
    auto it = loader.begin();
    REQUIRE(ds->wait_for_made(10));
    REQUIRE(as_i64((*it)[0]) == std::vector<int64_t>{0, 1, 2, 3});
    std::lock_guard<std::mutex> lock(ds->mutex);
    REQUIRE(std::any_of(ds->threads.begin(), ds->threads.end(),
                        [](std::thread::id id) { return id != std::this_thread::get_id(); }));
  }
}

TEST_CASE("DataLoader: begin_at resumes an epoch at a batch without making the ones before", "[data][loader]") {
  for (int prefetch : {0, 2}) {
    INFO("prefetch " << prefetch);
    auto ds = std::make_shared<ProbeDataset>();  // 40 examples, counts what it makes
    data::DataLoader loader(ds, {.batch_size = 4, .seed = 5, .prefetch = prefetch});
    loader.set_epoch(3);
    const std::vector<std::vector<int64_t>> whole = epoch_batches(loader);
    REQUIRE(whole.size() == 10);
    {
      std::lock_guard<std::mutex> lock(ds->mutex);
      ds->made = 0;
    }
    std::vector<std::vector<int64_t>> rest;
    for (auto it = loader.begin_at(7); it != loader.end(); ++it) rest.push_back(as_i64((*it)[0]));
    REQUIRE(rest == std::vector<std::vector<int64_t>>(whole.begin() + 7, whole.end()));
    {
      std::lock_guard<std::mutex> lock(ds->mutex);
      REQUIRE(ds->made == 3);
    }
    REQUIRE(loader.begin_at(10) == loader.end());  // resumed at the epoch's end: nothing left
    REQUIRE_THROWS_WITH(loader.begin_at(11), "[DataLoader] begin_at: batch 11 is outside [0, 10]");
    REQUIRE_THROWS_WITH(loader.begin_at(-1), "[DataLoader] begin_at: batch -1 is outside [0, 10]");
  }
}

TEST_CASE("DataLoader: destroyed or restarted mid-epoch, it stops its thread", "[data][loader]") {
  auto ds = std::make_shared<ProbeDataset>();
  {
    data::DataLoader loader(ds, {.batch_size = 2, .prefetch = 2});
    auto it = loader.begin();
    REQUIRE(it != loader.end());
    REQUIRE(ds->wait_for_made(3));  // the consumer's batch and a full queue: the thread now waits for room
  }  // must not hang
  {
    std::lock_guard<std::mutex> lock(ds->mutex);
    REQUIRE(ds->made == 3);
  }
  {
    data::DataLoader loader(ds, {.batch_size = 2, .prefetch = 1});
    for (const TensorList& b : loader) {
      (void)b;
      break;
    }
    // A new epoch after a broken-off one starts from its first batch.
    loader.set_epoch(1);
    data::DistributedSampler sampler(40, 1, 0);
    sampler.set_epoch(1);
    const std::vector<int64_t> order = sampler.indices();
    REQUIRE(flat(epoch_batches(loader)) == order);
    auto it = loader.begin();
    REQUIRE(as_i64((*it)[0]) == std::vector<int64_t>(order.begin(), order.begin() + 2));
  }
  for (int k = 0; k < 50; ++k) {  // destruction racing the thread's start and its first batch
    data::DataLoader loader(ds, {.batch_size = 1, .prefetch = 2});
    if (k % 2) loader.begin();
  }
}

TEST_CASE("DataLoader: an exception making a batch is rethrown at that batch", "[data][loader]") {
  for (int prefetch : {0, 1, 2}) {
    INFO("prefetch " << prefetch);
    auto ds = std::make_shared<ProbeDataset>();
    ds->fail_at = 9;  // in batch 2 (examples 8..11)
    data::DataLoader loader(ds, {.batch_size = 4, .shuffle = false, .prefetch = prefetch});
    for (int round = 0; round < 2; ++round) {  // the loader stays usable after a failed epoch
      std::vector<int64_t> seen;
      auto it = loader.begin();
      seen.push_back(as_i64((*it)[0]).front());
      ++it;
      seen.push_back(as_i64((*it)[0]).front());
      REQUIRE_THROWS_WITH(++it, "[ProbeDataset] example 9 is unreadable");
      REQUIRE(seen == std::vector<int64_t>{0, 4});
    }
    ds->fail_at = 0;  // in the first batch: begin() throws
    REQUIRE_THROWS_WITH(loader.begin(), "[ProbeDataset] example 0 is unreadable");
  }
}

TEST_CASE("DataLoader: argument errors", "[data][loader]") {
  auto ds = counting_dataset(4);
  REQUIRE_THROWS_WITH(data::DataLoader(ds, {.batch_size = 0}), Contains("[DataLoader] batch_size must be >= 1, got 0"));
  REQUIRE_THROWS_WITH(data::DataLoader(ds, {.prefetch = -1}), Contains("[DataLoader] prefetch must be >= 0, got -1"));
  REQUIRE_THROWS_WITH(data::DataLoader(std::shared_ptr<const data::Dataset>{}), Contains("[DataLoader] the data set is null"));
  REQUIRE_THROWS_WITH(data::DataLoader(ds, {.num_replicas = 2, .rank = 2}),
                      Contains("[DistributedSampler] rank 2 is outside [0, 2)"));
  // A data set by value is copied in (a TensorDataset's copy shares its tensors).
  data::DataLoader by_value(data::TensorDataset({arange(6)}), {.batch_size = 4, .shuffle = false});
  REQUIRE(by_value.num_batches() == 2);
  REQUIRE(by_value.dataset().size() == 6);
}

// ---------------------------------------------------------------- Fashion-MNIST

TEST_CASE("FashionMNIST from Debian's dataset-fashion-mnist", "[data][fashion_mnist]") {
  if (!data::FashionMNIST::available(data::Split::train) || !data::FashionMNIST::available(data::Split::test)) {
    WARN("SKIP: Fashion-MNIST is not installed in " << data::FashionMnistOptions{}.root
                                                    << " (apt-get install dataset-fashion-mnist)");
    return;
  }
  data::FashionMNIST train(data::Split::train);
  REQUIRE(train.size() == 60000);
  REQUIRE(train.images().shape() == Shape{60000, 28, 28});
  REQUIRE(train.images().dtype() == f32);
  REQUIRE(train.labels().shape() == Shape{60000});
  REQUIRE(train.labels().dtype() == i64);
  REQUIRE(as_i64(train.labels().narrow(0, 0, 10)) == std::vector<int64_t>{9, 0, 0, 3, 0, 2, 7, 2, 5, 5});
  std::vector<int64_t> per_class(10, 0);
  for (int64_t y : as_i64(train.labels())) per_class.at(static_cast<size_t>(y))++;  // at(): labels in 0..9
  REQUIRE(per_class == std::vector<int64_t>(10, 6000));
  // Normalised with the training set's own statistics: mean 0, std 1 (to the constants' 4 digits).
  double sum = 0, sq = 0;
  const float* x = train.images().data_ptr<float>();
  for (int64_t i = 0; i < train.images().numel(); ++i) sum += x[i], sq += double(x[i]) * x[i];
  const double count = static_cast<double>(train.images().numel());
  REQUIRE(std::abs(sum / count) < 1e-3);
  REQUIRE(std::abs(std::sqrt(sq / count - (sum / count) * (sum / count)) - 1) < 1e-3);
  // Image 0's raw pixels sum to 76247 (numpy on the same file).
  const double image0 = train.images()[0].to(f64).sum().item<double>();
  REQUIRE(std::abs((image0 * data::FashionMNIST::kStd + 784 * data::FashionMNIST::kMean) * 255 - 76247) < 0.5);

  data::FashionMNIST test(data::Split::test, {.normalize = false});
  REQUIRE(test.images().shape() == Shape{10000, 28, 28});
  REQUIRE(test.labels().shape() == Shape{10000});
  REQUIRE(as_i64(test.labels().narrow(0, 0, 10)) == std::vector<int64_t>{9, 2, 1, 1, 6, 1, 4, 6, 5, 7});
  REQUIRE(test.images().min().item<float>() == 0.0f);
  REQUIRE(test.images().max().item<float>() == 1.0f);
  REQUIRE(std::abs(test.images()[0].sum().item<double>() * 255 - 33456) < 0.5);

  data::DataLoader loader(test, {.batch_size = 64, .drop_last = true});
  int64_t batches = 0;
  for (const TensorList& b : loader) {
    REQUIRE(b[0].shape() == Shape{64, 28, 28});
    REQUIRE(b[1].shape() == Shape{64});
    ++batches;
  }
  REQUIRE(batches == 10000 / 64);

  REQUIRE_THROWS_WITH(data::FashionMNIST(data::Split::train, {.root = "/nonexistent"}),
                      Contains("[FashionMNIST] neither /nonexistent/train-images-idx3-ubyte.gz nor "
                               "/nonexistent/train-images-idx3-ubyte exists"));
}

TEST_CASE("FashionMNIST: files that do not fit", "[data][fashion_mnist]") {
  TempDir dir("tandem_test_data");
  auto write_split = [&](const std::vector<uint32_t>& image_dims, uint32_t labels, uint8_t label_value) {
    uint64_t pixels = 1;
    for (uint32_t d : image_dims) pixels *= d;
    write_gz(dir.file("train-images-idx3-ubyte.gz"), idx_bytes(0x08, image_dims, Bytes(pixels, char(51))));
    write_raw(dir.file("train-labels-idx1-ubyte"), idx_bytes(0x08, {labels}, Bytes(labels, char(label_value))));
  };
  write_split({3, 28, 28}, 3, 7);
  data::FashionMNIST ok(data::Split::train, {.root = dir.path.string(), .normalize = false});
  REQUIRE(ok.size() == 3);
  REQUIRE(ok.images().to_vector<float>()[100] == Approx(0.2f));
  REQUIRE(as_i64(ok.labels()) == std::vector<int64_t>{7, 7, 7});
  REQUIRE_FALSE(data::FashionMNIST::available(data::Split::test, dir.path.string()));

  write_split({3, 28, 27}, 3, 7);
  REQUIRE_THROWS_WITH(data::FashionMNIST(data::Split::train, {.root = dir.path.string()}),
                      Contains("expected images of shape [N, 28, 28], got [3, 28, 27]"));
  write_split({3, 28, 28}, 2, 7);
  REQUIRE_THROWS_WITH(data::FashionMNIST(data::Split::train, {.root = dir.path.string()}),
                      Contains("expected 3 labels (one per image of"));
  write_split({3, 28, 28}, 3, 10);
  REQUIRE_THROWS_WITH(data::FashionMNIST(data::Split::train, {.root = dir.path.string()}),
                      Contains("label 10 of example 0 is not in 0..9"));
}

TEST_CASE("DistributedSampler: PyTorch's padding, drop_last, per-epoch shuffle", "[data][sampler]") {
  // 10 samples over 3 ranks: 4 each, padded with the first two indices.
  std::vector<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    data::DistributedSampler s(10, 3, r, {.shuffle = false});
    REQUIRE(s.num_samples() == 4);
    auto idx = s.indices();
    REQUIRE(idx.size() == 4);
    for (size_t i = 0; i < idx.size(); ++i) REQUIRE(idx[i] == (r + 3 * static_cast<int64_t>(i)) % 10);
    seen.insert(seen.end(), idx.begin(), idx.end());
  }
  std::sort(seen.begin(), seen.end());
  REQUIRE(seen == std::vector<int64_t>{0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  // drop_last: 10 over 3 -> 3 each, index 9 dropped.
  for (int r = 0; r < 3; ++r) {
    data::DistributedSampler s(10, 3, r, {.shuffle = false, .drop_last = true});
    REQUIRE(s.num_samples() == 3);
    for (int64_t i : s.indices()) REQUIRE(i < 9);
  }
  // Shuffled: the ranks partition one permutation, which changes with the epoch and not with the rank.
  std::vector<int64_t> e0, e1;
  for (int r = 0; r < 4; ++r) {
    data::DistributedSampler s(20, 4, r, {.seed = 5});
    auto a = s.indices();
    s.set_epoch(1);
    auto b = s.indices();
    e0.insert(e0.end(), a.begin(), a.end());
    e1.insert(e1.end(), b.begin(), b.end());
  }
  REQUIRE(e0 != e1);
  auto sorted0 = e0, sorted1 = e1;
  std::sort(sorted0.begin(), sorted0.end());
  std::sort(sorted1.begin(), sorted1.end());
  for (int64_t i = 0; i < 20; ++i) REQUIRE((sorted0[i] == i && sorted1[i] == i));
  // More replicas than samples: padding repeats the dataset.
  data::DistributedSampler tiny(2, 5, 4, {.shuffle = false});
  REQUIRE(tiny.indices() == std::vector<int64_t>{0});
  REQUIRE_THROWS_WITH(data::DistributedSampler(5, 2, 2), Catch::Contains("[DistributedSampler] rank 2 is outside [0, 2)"));
}
