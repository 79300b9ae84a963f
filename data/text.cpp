#include "data/text.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

namespace tandem::data {

namespace {

namespace fs = std::filesystem;

std::string describe(unsigned char byte) {
  return byte >= 0x20 && byte < 0x7f ? fmt::format("0x{:02x} ('{}')", byte, static_cast<char>(byte))
                                     : fmt::format("0x{:02x}", byte);
}

// The files of a corpus folder, in name order (read_text_corpus says which count).
std::vector<fs::path> text_files(const fs::path& dir, std::error_code& ec) {
  std::vector<fs::path> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    std::error_code kind_ec;
    if (entry.is_symlink(kind_ec) || !entry.is_regular_file(kind_ec)) continue;
    if (name.starts_with(".") || name.ends_with(".dat")) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end(),
            [](const fs::path& a, const fs::path& b) { return a.filename().string() < b.filename().string(); });
  return files;
}

// Appends the file's bytes to `out`.
void append_file(const std::string& path, std::string& out) {
  errno = 0;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!file) fail("[TextDataset] {}: cannot open: {}", path, errno ? std::strerror(errno) : "unknown error");
  char buffer[1 << 16];
  for (;;) {
    const size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
    out.append(buffer, n);
    if (n < sizeof buffer) {
      if (std::ferror(file.get())) fail("[TextDataset] {}: read error: {}", path, std::strerror(errno));
      return;
    }
  }
}

const char* split_name(TextSplit split) { return split == TextSplit::train ? "train" : "validation"; }

}  // namespace

// ---- CharVocab ----

CharVocab::CharVocab(std::string bytes) : bytes_(std::move(bytes)) {
  TANDEM_CHECK(!bytes_.empty(), "[CharVocab] a vocabulary needs at least one byte");
  TANDEM_CHECK(bytes_.size() <= 256, "[CharVocab] {} bytes given; a byte vocabulary has at most 256", bytes_.size());
  // Every byte starts as unknown; when all 256 are present the fill is overwritten everywhere.
  ids_.fill(static_cast<uint8_t>(std::min<size_t>(bytes_.size(), 255)));
  std::array<bool, 256> seen{};
  for (size_t k = 0; k < bytes_.size(); ++k) {
    const auto b = static_cast<unsigned char>(bytes_[k]);
    TANDEM_CHECK(!seen[b], "[CharVocab] byte {} appears twice (again at position {}); ids need distinct bytes",
                 describe(b), k);
    seen[b] = true;
    ids_[b] = static_cast<uint8_t>(k);
  }
}

CharVocab CharVocab::of(std::string_view text) {
  TANDEM_CHECK(!text.empty(), "[CharVocab] the text is empty: no bytes to build a vocabulary of");
  std::array<bool, 256> seen{};
  for (char c : text) seen[static_cast<unsigned char>(c)] = true;
  std::string bytes;
  for (int b = 0; b < 256; ++b)
    if (seen[static_cast<size_t>(b)]) bytes.push_back(static_cast<char>(b));
  return CharVocab(std::move(bytes));
}

Tensor CharVocab::to_tensor() const {
  Tensor out = make_empty({static_cast<int64_t>(bytes_.size())}, i64, kCPU, "CharVocab");
  int64_t* p = out.data_ptr<int64_t>();
  for (size_t k = 0; k < bytes_.size(); ++k) p[k] = static_cast<unsigned char>(bytes_[k]);
  return out;
}

CharVocab CharVocab::from_tensor(const Tensor& bytes) {
  TANDEM_CHECK(bytes.defined(), "[CharVocab] from_tensor: the tensor is undefined");
  TANDEM_CHECK(bytes.dim() == 1 && is_integral(bytes.dtype()),
               "[CharVocab] from_tensor: expected a 1-D integer tensor of byte values, got {} {}", bytes.dtype(),
               bytes.shape());
  std::string out;
  for (int64_t v : bytes.to_vector<int64_t>()) {
    TANDEM_CHECK(v >= 0 && v <= 255, "[CharVocab] from_tensor: {} is not a byte value (0..255)", v);
    out.push_back(static_cast<char>(v));
  }
  return CharVocab(std::move(out));
}

Tensor CharVocab::encode(std::string_view text) const {
  Tensor out = make_empty({static_cast<int64_t>(text.size())}, i64, kCPU, "CharVocab");
  if (text.empty()) return out;
  int64_t* p = out.data_ptr<int64_t>();
  for (size_t k = 0; k < text.size(); ++k) p[k] = id(text[k]);
  return out;
}

std::string CharVocab::decode(std::span<const int64_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t v : ids) {
    TANDEM_CHECK(v >= 0 && v < size(), "[CharVocab] decode: id {} is outside [0, {})", v, size());
    if (v == unknown_id())
      out += "\xEF\xBF\xBD";  // U+FFFD
    else
      out.push_back(bytes_[static_cast<size_t>(v)]);
  }
  return out;
}

std::string CharVocab::decode(const Tensor& ids) const {
  TANDEM_CHECK(ids.defined(), "[CharVocab] decode: the tensor is undefined");
  TANDEM_CHECK(is_integral(ids.dtype()), "[CharVocab] decode: ids must be integers, got {} {}", ids.dtype(),
               ids.shape());
  const std::vector<int64_t> values = ids.to_vector<int64_t>();
  return decode(std::span<const int64_t>(values));
}

// ---- the corpus ----

std::string default_text_corpus_path() { return "/usr/share/games/fortunes"; }

std::string read_text_corpus(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail("[TextDataset] {}: cannot access: {}", path, ec.message());  // e.g. a folder on the way is not searchable
  if (!fs::exists(status))
    fail("[TextDataset] {}: no such file or directory{}", path,
         path == default_text_corpus_path() ? " (the default corpus: apt-get install fortunes; or give a text file)"
                                            : "");
  std::string text;
  if (fs::is_directory(status)) {
    const std::vector<fs::path> files = text_files(path, ec);
    if (ec) fail("[TextDataset] {}: cannot list the folder: {}", path, ec.message());
    TANDEM_CHECK(!files.empty(),
                 "[TextDataset] {}: the folder holds no text files (regular files, not *.dat, symlinks or hidden)",
                 path);
    for (const fs::path& file : files) append_file(file.string(), text);
    TANDEM_CHECK(!text.empty(), "[TextDataset] {}: the folder's {} text files are all empty", path, files.size());
  } else {
    // A FIFO would block and a device such as /dev/zero never end: only regular files are read.
    TANDEM_CHECK(fs::is_regular_file(status), "[TextDataset] {}: not a regular file or a folder", path);
    append_file(path, text);
    TANDEM_CHECK(!text.empty(), "[TextDataset] {}: the file is empty", path);
  }
  return text;
}

bool TextDataset::available(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (fs::is_regular_file(status)) return fs::file_size(path, ec) > 0 && !ec;
  if (!fs::is_directory(status)) return false;
  for (const fs::path& file : text_files(path, ec))
    if (std::error_code size_ec; fs::file_size(file, size_ec) > 0 && !size_ec) return true;
  return false;
}

// ---- TextDataset ----

TextDataset::TextDataset(const std::string& path, TextOptions options)
    : TextDataset(read_text_corpus(path), std::move(options), path) {}

TextDataset TextDataset::from_text(std::string_view text, TextOptions options, const std::string& name) {
  return TextDataset(text, std::move(options), name);
}

namespace {

// The first 90% of the bytes (rounded down) or the rest.
std::string_view split_of(std::string_view text, TextSplit split) {
  const size_t train_end = text.size() * 9 / 10;
  return split == TextSplit::train ? text.substr(0, train_end) : text.substr(train_end);
}

// The options, once they and the text are known to make at least one window.
TextOptions checked(TextOptions options, std::string_view text, const std::string& name) {
  TANDEM_CHECK(options.block_size >= 1, "[TextDataset] {}: block_size must be >= 1, got {}", name,
               options.block_size);
  TANDEM_CHECK(options.stride >= 1, "[TextDataset] {}: stride must be >= 1, got {}", name, options.stride);
  TANDEM_CHECK(!text.empty(), "[TextDataset] {}: the text is empty", name);
  const std::string_view split = split_of(text, options.split);
  // Not `size >= block_size + 1`: a block_size near INT64_MAX must be an error, not an overflow.
  TANDEM_CHECK(static_cast<int64_t>(split.size()) > options.block_size,
               "[TextDataset] {}: the {} split holds {} bytes (the {} of {}), fewer than one window of block_size + 1 "
               "({} + 1); use a longer text or a smaller block_size",
               name, split_name(options.split), split.size(),
               options.split == TextSplit::train ? "first 90%" : "last 10%", text.size(), options.block_size);
  return options;
}

}  // namespace

// A validation split with a window (2 bytes or more) takes a text of 11 bytes or more, whose
// training split (9 or more) has bytes to take the vocabulary from.
TextDataset::TextDataset(std::string_view text, TextOptions options, std::string name)
    : options_(checked(std::move(options), text, name)),
      name_(std::move(name)),
      vocab_(options_.vocab ? *options_.vocab : CharVocab::of(split_of(text, TextSplit::train))) {
  options_.vocab.reset();  // vocab_ holds it
  const std::string_view split = split_of(text, options_.split);
  ids_.resize(split.size());
  const int64_t unknown = vocab_.unknown_id();
  for (size_t k = 0; k < split.size(); ++k) {
    const int64_t id = vocab_.id(split[k]);
    ids_[k] = static_cast<uint8_t>(id);
    unknown_bytes_ += id == unknown ? 1 : 0;
  }
  size_ = (split_bytes() - options_.block_size - 1) / options_.stride + 1;
}

TensorList TextDataset::get_batch(std::span<const int64_t> indices) const {
  for (int64_t i : indices)
    TANDEM_CHECK(i >= 0 && i < size_, "[TextDataset] index {} is out of range for {} windows of {}", i, size_, name_);
  const int64_t n = static_cast<int64_t>(indices.size()), block = options_.block_size;
  Tensor x = make_empty({n, block}, i64, kCPU, "TextDataset");
  Tensor y = make_empty({n, block}, i64, kCPU, "TextDataset");
  if (n == 0) return {x, y};
  int64_t* px = x.data_ptr<int64_t>();
  int64_t* py = y.data_ptr<int64_t>();
  for (int64_t k = 0; k < n; ++k) {
    const uint8_t* window = ids_.data() + indices[static_cast<size_t>(k)] * options_.stride;
    for (int64_t j = 0; j < block; ++j) {
      px[k * block + j] = window[j];
      py[k * block + j] = window[j + 1];
    }
  }
  return {x, y};
}

}  // namespace tandem::data
