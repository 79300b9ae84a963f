#include "nn/safetensors.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <vector>

#include "autograd/grad_mode.h"
#include "autograd/ops.h"

namespace tandem::nn {

// Tensor bytes are written and read as they lie in memory; the format is little-endian.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

namespace {

// The metadata entry naming tensors written once under another name: {"alias": "name", ...}.
constexpr const char* kAliasesKey = "tandem.aliases";

// The reference implementation refuses headers above 100 MB; so do we (it also bounds the
// allocation a corrupt length field can cause).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// Nesting deeper than this cannot be a valid header (which is three levels deep) and is rejected
// before parsing, so no input can exhaust the stack of a recursive JSON parser.
constexpr int kMaxJsonDepth = 16;

const char* st_name(Dtype d) {
  switch (d) {
    case f32: return "F32";
    case f64: return "F64";
    case f16: return "F16";
    case bf16: return "BF16";
    case i32: return "I32";
    case i64: return "I64";
    case boolean: return "BOOL";
  }
  return "?";
}

bool st_dtype(const std::string& s, Dtype& out) {
  static const std::pair<const char*, Dtype> table[] = {{"F32", f32}, {"F64", f64}, {"F16", f16}, {"BF16", bf16},
                                                        {"I32", i32}, {"I64", i64}, {"BOOL", boolean}};
  for (auto [n, d] : table) {
    if (s == n) {
      out = d;
      return true;
    }
  }
  return false;
}

std::string errno_text() { return std::strerror(errno); }

// ---- loading ----

struct Entry {
  std::string name;
  Dtype dtype;
  Shape shape;
  uint64_t begin, end;
};

void check_json_depth(const char* text, size_t n, const std::string& what) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      TANDEM_CHECK(++depth <= kMaxJsonDepth, "[safetensors] {}: the header nests deeper than {} levels", what,
                   kMaxJsonDepth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
}

uint64_t as_u64(const nlohmann::json& v, const std::string& what, const std::string& name, const char* field) {
  TANDEM_CHECK(v.is_number_unsigned(), "[safetensors] {}: tensor '{}' has a {} entry that is not a non-negative integer: {}",
               what, name, field, v.dump());
  return v.get<uint64_t>();
}

// Parses and validates the header; `buffer_size` is the number of data bytes after it.
std::vector<Entry> parse_header(const char* text, size_t n, uint64_t buffer_size, Metadata* metadata,
                                const std::string& what) {
  // Skip leading padding is not allowed: the reference requires the header to start with '{'.
  TANDEM_CHECK(n > 0 && text[0] == '{', "[safetensors] {}: the header does not start with '{{'", what);
  check_json_depth(text, n, what);
  nlohmann::json header = nlohmann::json::parse(text, text + n, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!header.is_discarded(), "[safetensors] {}: the header is not valid JSON", what);
  TANDEM_CHECK(header.is_object(), "[safetensors] {}: the header is not a JSON object", what);

  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const nlohmann::json& v = it.value();
    if (name == "__metadata__") {
      TANDEM_CHECK(v.is_object(), "[safetensors] {}: __metadata__ must be an object of strings", what);
      for (auto m = v.begin(); m != v.end(); ++m) {
        TANDEM_CHECK(m.value().is_string(), "[safetensors] {}: __metadata__ value for '{}' is not a string", what,
                     m.key());
        if (metadata) (*metadata)[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    TANDEM_CHECK(v.is_object(), "[safetensors] {}: entry '{}' is not an object", what, name);
    for (auto f = v.begin(); f != v.end(); ++f) {
      TANDEM_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets",
                   "[safetensors] {}: tensor '{}' has an unknown field '{}'", what, name, f.key());
    }
    TANDEM_CHECK(v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
                 "[safetensors] {}: tensor '{}' needs dtype, shape and data_offsets", what, name);
    Entry e;
    e.name = name;
    const auto& dt = v["dtype"];
    TANDEM_CHECK(dt.is_string(), "[safetensors] {}: tensor '{}' has a non-string dtype", what, name);
    TANDEM_CHECK(st_dtype(dt.get<std::string>(), e.dtype),
                 "[safetensors] {}: tensor '{}' has unknown or unsupported dtype '{}' (supported: F32 F64 F16 BF16 "
                 "I32 I64 BOOL)",
                 what, name, dt.get<std::string>());
    const auto& shape = v["shape"];
    TANDEM_CHECK(shape.is_array(), "[safetensors] {}: tensor '{}' has a shape that is not an array", what, name);
    uint64_t numel = 1;
    bool overflow = false, has_zero = false;
    for (const auto& d : shape) {
      uint64_t size = as_u64(d, what, name, "shape");
      TANDEM_CHECK(size <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                   "[safetensors] {}: tensor '{}' has a dim of size {} (too large)", what, name, size);
      e.shape.push_back(static_cast<int64_t>(size));
      has_zero = has_zero || size == 0;
      if (size != 0 && numel > std::numeric_limits<uint64_t>::max() / size) overflow = true;
      numel *= size;
    }
    if (has_zero) {  // a zero dim makes the tensor empty whatever the others are
      overflow = false;
      numel = 0;
    }
    const auto& off = v["data_offsets"];
    TANDEM_CHECK(off.is_array() && off.size() == 2, "[safetensors] {}: tensor '{}' needs data_offsets [begin, end]",
                 what, name);
    e.begin = as_u64(off[0], what, name, "data_offsets");
    e.end = as_u64(off[1], what, name, "data_offsets");
    TANDEM_CHECK(e.begin <= e.end && e.end <= buffer_size,
                 "[safetensors] {}: tensor '{}' has data_offsets [{}, {}] outside the {}-byte data buffer", what,
                 name, e.begin, e.end, buffer_size);
    const uint64_t isz = itemsize(e.dtype);
    TANDEM_CHECK(!overflow && numel <= std::numeric_limits<uint64_t>::max() / isz && numel * isz == e.end - e.begin,
                 "[safetensors] {}: tensor '{}' of dtype {} and shape {} needs {} bytes, but data_offsets [{}, {}] "
                 "span {}",
                 what, name, st_name(e.dtype), e.shape, overflow ? std::string("too many") : std::to_string(numel * isz),
                 e.begin, e.end, e.end - e.begin);
    entries.push_back(std::move(e));
  }

  // The tensors must tile the buffer: no gaps, no overlaps, nothing after the last one.
  std::vector<const Entry*> by_offset;
  for (const auto& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t cursor = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : by_offset) {
    TANDEM_CHECK(e->begin >= cursor, "[safetensors] {}: tensors '{}' and '{}' overlap (data_offsets [{}, {}] and [{}, {}])",
                 what, prev ? prev->name : "", e->name, prev ? prev->begin : 0, prev ? prev->end : 0, e->begin, e->end);
    TANDEM_CHECK(e->begin == cursor, "[safetensors] {}: bytes [{}, {}) of the data buffer belong to no tensor (before '{}')",
                 what, cursor, e->begin, e->name);
    cursor = e->end;
    prev = e;
  }
  TANDEM_CHECK(cursor == buffer_size,
               "[safetensors] {}: the data buffer has {} bytes but the tensors cover only {}", what, buffer_size, cursor);
  std::vector<Entry> sorted;
  sorted.reserve(entries.size());
  for (const Entry* e : by_offset) sorted.push_back(*e);
  return sorted;
}

// The shared loader: `read(offset, dst, n)` copies n bytes at `offset` of the source.
TensorDict load_from(uint64_t total_size, const std::function<void(uint64_t, void*, size_t)>& read,
                     Metadata* metadata, const std::string& what) {
  TANDEM_CHECK(total_size >= 8, "[safetensors] {}: {} bytes is too small to hold the 8-byte header length", what,
               total_size);
  uint8_t len_bytes[8];
  read(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  TANDEM_CHECK(n <= kMaxHeaderBytes, "[safetensors] {}: header length {} exceeds the {}-byte limit", what, n,
               kMaxHeaderBytes);
  TANDEM_CHECK(n <= total_size - 8, "[safetensors] {}: header length {} runs past the end of the {}-byte file (truncated?)",
               what, n, total_size);
  std::string text(n, '\0');
  read(8, text.data(), n);
  const uint64_t data_start = 8 + n;
  Metadata meta;
  std::vector<Entry> entries = parse_header(text.data(), text.size(), total_size - data_start, &meta, what);

  TensorDict out;
  for (const Entry& e : entries) {
    Tensor t = make_empty(e.shape, e.dtype, kCPU, "safetensors");
    if (e.end > e.begin) read(data_start + e.begin, t.data_ptr(), e.end - e.begin);
    if (e.dtype == boolean) {
      // A bool byte other than 0 or 1 is not a valid C++ bool: refuse it rather than hand it on.
      const auto* b = static_cast<const uint8_t*>(t.data_ptr());
      for (uint64_t i = 0; i < e.end - e.begin; ++i) {
        TANDEM_CHECK(b[i] <= 1, "[safetensors] {}: BOOL tensor '{}' holds byte {} at element {} (expected 0 or 1)",
                     what, e.name, static_cast<int>(b[i]), i);
      }
    }
    out.insert(e.name, std::move(t));
  }
  // Names whose tensor is another's (tied weights, written once): the same tensor under both.
  if (auto it = meta.find(kAliasesKey); it != meta.end()) {
    check_json_depth(it->second.data(), it->second.size(), what);  // a string inside the header: unchecked so far
    const nlohmann::json aliases = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK(aliases.is_object(), "[safetensors] {}: metadata '{}' is not a JSON object of names", what,
                 kAliasesKey);
    for (const auto& a : aliases.items()) {
      TANDEM_CHECK(a.value().is_string() && out.contains(a.value().get<std::string>()),
                   "[safetensors] {}: alias '{}' names no tensor of the file (its value is a {})", what, a.key(),
                   a.value().is_string() ? "name not in the file" : a.value().type_name());
      TANDEM_CHECK(!a.key().empty() && a.key() != "__metadata__" && !out.contains(a.key()),
                   "[safetensors] {}: alias '{}' is empty, reserved or also a tensor of the file", what, a.key());
      out.insert(a.key(), out.at(a.value().get<std::string>()));
    }
    meta.erase(it);
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

// ---- saving ----

struct Prepared {
  std::string name;
  Tensor data;  // contiguous, on the CPU
};

std::vector<Prepared> prepare(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<Prepared> out;
  NoGradGuard guard;
  for (const auto& [name, t] : tensors) {
    TANDEM_CHECK(!name.empty(), "[safetensors] tensor names must not be empty");
    TANDEM_CHECK(name != "__metadata__", "[safetensors] '__metadata__' is reserved and cannot name a tensor");
    TANDEM_CHECK(t.defined(), "[safetensors] tensor '{}' is undefined", name);
    Tensor c = t.detach();
    if (!c.is_cpu()) c = c.to(kCPU);
    c = c.contiguous();
    out.push_back({name, c});
  }
  // Larger elements first, then by name: every tensor then starts at a multiple of its element
  // size (the buffer itself starts 8-aligned), which is how the reference orders them.
  std::sort(out.begin(), out.end(), [](const Prepared& a, const Prepared& b) {
    size_t ia = itemsize(a.data.dtype()), ib = itemsize(b.data.dtype());
    return ia != ib ? ia > ib : a.name < b.name;
  });
  for (size_t i = 1; i < out.size(); ++i) {
    TANDEM_CHECK(out[i].name != out[i - 1].name, "[safetensors] duplicate tensor name '{}'", out[i].name);
  }
  return out;
}

// "<path>.tmp.<pid>" files that a killed writer left behind: removed before the next save of the
// same path, unless their process is still alive (it may be saving right now). A stale file whose
// pid has been reused by a live process stays until that process is gone.
void remove_stale_temporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  fs::path dir = target.parent_path();
  if (dir.empty()) dir = ".";
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string digits = name.substr(prefix.size());
    if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) || digits.size() > 9)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid()) continue;  // ours: reopened and truncated below
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to judge)
    std::error_code ignored;
    fs::remove(it->path(), ignored);
  }
}

void write_file(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                const Metadata& metadata) {
  TANDEM_CHECK(!metadata.count(kAliasesKey), "[safetensors] metadata key '{}' is reserved (tied tensors' names)",
               kAliasesKey);
  // A tensor that appears again under another name (a tied weight: state_dict lists it under every
  // name, as PyTorch's does) is written once; the other names go to the metadata as aliases, which
  // the loader turns back into the same tensor. Readers that ignore them (Hugging Face's) see the
  // first name only, as its save_model writes shared tensors.
  std::vector<std::pair<std::string, Tensor>> unique;
  nlohmann::ordered_json aliases = nlohmann::ordered_json::object();
  for (const auto& item : tensors) {
    const std::string& name = item.first;
    const Tensor& t = item.second;  // not a structured binding: clang 14 cannot capture one
    // Every name is checked here, aliases included (prepare sees only the tensors written).
    TANDEM_CHECK(!name.empty(), "[safetensors] tensor names must not be empty");
    TANDEM_CHECK(name != "__metadata__", "[safetensors] '__metadata__' is reserved and cannot name a tensor");
    // The same data: state_dict hands out detached views, so compare what they view, not handles.
    auto same_data = [&](const Tensor& u) {
      return t.defined() && u.defined() && t.numel() > 0 && u.data_ptr() == t.data_ptr() &&
             u.device() == t.device() && u.dtype() == t.dtype() && u.shape() == t.shape() && u.strides() == t.strides();
    };
    auto first = std::find_if(unique.begin(), unique.end(), [&](const auto& u) { return same_data(u.second); });
    if (first != unique.end() && name != first->first) {
      aliases[name] = first->first;
    } else {
      unique.emplace_back(name, t);
    }
  }
  std::vector<Prepared> items = prepare(unique);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty() || !aliases.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    if (!aliases.empty()) meta[kAliasesKey] = aliases.dump();
    header["__metadata__"] = meta;
  }
  uint64_t offset = 0;
  for (const auto& it : items) {
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = st_name(it.data.dtype());
    entry["shape"] = it.data.shape().vec();
    entry["data_offsets"] = {offset, offset + it.data.nbytes()};
    offset += it.data.nbytes();
    header[it.name] = entry;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));

  remove_stale_temporaries(path);
  const std::string tmp = fmt::format("{}.tmp.{}", path, static_cast<long>(::getpid()));
  FILE* f = std::fopen(tmp.c_str(), "wb");
  TANDEM_CHECK(f != nullptr, "[safetensors] cannot create '{}': {}", tmp, errno_text());
  auto fail_cleanup = [&](const char* step) {
    std::string why = errno_text();
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    fail("[safetensors] writing '{}' failed ({}): {}", path, step, why);
  };
  if (std::fwrite(len_bytes, 1, 8, f) != 8) fail_cleanup("header length");
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) fail_cleanup("header");
  for (const auto& it : items) {
    size_t n = it.data.nbytes();
    if (n > 0 && std::fwrite(it.data.data_ptr(), 1, n, f) != n) fail_cleanup("tensor data");
  }
  if (std::fflush(f) != 0) fail_cleanup("flush");
  if (::fsync(::fileno(f)) != 0) fail_cleanup("fsync");
  int rc = std::fclose(f);
  f = nullptr;
  if (rc != 0) fail_cleanup("close");
  if (std::rename(tmp.c_str(), path.c_str()) != 0) fail_cleanup("rename");
  // Make the rename itself durable: fsync the directory that holds the file.
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = std::filesystem::path(".");
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace

void save_safetensors(const std::string& path, const TensorDict& tensors, const Metadata& metadata) {
  write_file(path, tensors.items(), metadata);
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const Metadata& metadata) {
  write_file(path, {tensors.begin(), tensors.end()}, metadata);
}

TensorDict parse_safetensors(const void* data, size_t size, Metadata* metadata, const std::string& what) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  return load_from(
      size, [&](uint64_t off, void* dst, size_t n) { std::memcpy(dst, bytes + off, n); }, metadata, what);
}

TensorDict load_safetensors(const std::string& path, Metadata* metadata) {
  FILE* f = std::fopen(path.c_str(), "rb");
  TANDEM_CHECK(f != nullptr, "[safetensors] cannot open '{}': {}", path, errno_text());
  std::unique_ptr<FILE, int (*)(FILE*)> guard(f, &std::fclose);
  TANDEM_CHECK(std::fseek(f, 0, SEEK_END) == 0, "[safetensors] cannot seek in '{}': {}", path, errno_text());
  long end = std::ftell(f);
  TANDEM_CHECK(end >= 0, "[safetensors] cannot size '{}': {}", path, errno_text());
  const std::string what = "'" + path + "'";
  auto read = [&](uint64_t off, void* dst, size_t n) {
    TANDEM_CHECK(std::fseek(f, static_cast<long>(off), SEEK_SET) == 0 && std::fread(dst, 1, n, f) == n,
                 "[safetensors] {}: reading {} bytes at offset {} failed (file changed or truncated?)", what, n, off);
  };
  Metadata meta;
  TensorDict out = load_from(static_cast<uint64_t>(end), read, &meta, what);
  if (metadata) *metadata = std::move(meta);
  return out;
}

void save_model(const Module& module, const std::string& path, const Metadata& metadata) {
  Metadata meta = metadata;
  meta.emplace("format", "pt");  // what Hugging Face loaders expect of a PyTorch-layout state dict
  save_safetensors(path, module.state_dict(), meta);
}

LoadStateDictResult load_model(Module& module, const std::string& path, bool strict) {
  return module.load_state_dict(load_safetensors(path), strict);
}

void save_optimizer(const optim::Optimizer& optimizer, const std::string& path, const Metadata& metadata) {
  Metadata meta = metadata;
  meta["tandem.optimizer"] = optimizer.name();
  save_safetensors(path, optimizer.state_dict(), meta);
}

void load_optimizer(optim::Optimizer& optimizer, const std::string& path) {
  Metadata meta;
  TensorDict sd = load_safetensors(path, &meta);
  auto it = meta.find("tandem.optimizer");
  TANDEM_CHECK(it == meta.end() || it->second == optimizer.name(),
               "[safetensors] '{}' holds {} optimizer state, cannot load it into {}", path, it->second,
               optimizer.name());
  optimizer.load_state_dict(sd);
}

}  // namespace tandem::nn
