// Character-level text: a corpus read from a file (or from a folder of text files, such as the
// fortunes Debian's `fortunes` package installs), cut 90/10 into a training and a validation
// split, served as next-character windows, and the byte vocabulary that maps it to ids.
//
//   data::TextDataset train(data::default_text_corpus_path(), {.block_size = 128});
//   data::TextDataset val(data::default_text_corpus_path(),
//                         {.block_size = 128, .split = data::TextSplit::validation, .vocab = train.vocab()});
//   data::DataLoader loader(train, {.batch_size = 64, .seed = seed, .num_replicas = world, .rank = rank});
//
// Example i of a TextDataset is the window starting at byte i * stride of its split: x is the
// block_size bytes from there as vocabulary ids, y the block_size bytes one further on (the next
// character of each). Through the DataLoader the random windows come from its DistributedSampler:
// every epoch the window starts are permuted with the loader's seed + epoch, the same permutation
// on every rank, and rank r takes positions r, r + world, r + 2 world, ... of it, so in an epoch the
// ranks train on distinct windows, drawn without replacement, and a run with the same seed, world
// size and epoch reads the same windows (begin_at resumes mid-epoch).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/dataset.h"

namespace tandem::data {

// A byte-level vocabulary: id k stands for bytes()[k]; one more id, unknown_id() == the number of
// bytes, stands for every byte that is not in it. A vocabulary taken from the training split
// meets bytes in the validation split (or in a prompt) that training never saw: they encode to
// unknown_id(), a class the model has and the training targets never hold, so a validation loss
// over them is finite and every byte of the split counts.
class CharVocab {
 public:
  // `bytes`: distinct, at least one, in the order of their ids (a saved bytes() as it was).
  explicit CharVocab(std::string bytes);
  // The distinct bytes of `text`, ascending: the vocabulary of a training split.
  static CharVocab of(std::string_view text);
  // What a checkpoint keeps: to_tensor() is bytes() as an i64 tensor [n] of values 0..255 (a
  // tensor, because safetensors' metadata is JSON and a lone byte >= 0x80 is not valid UTF-8);
  // from_tensor reads it back from any 1-D integer tensor.
  Tensor to_tensor() const;
  static CharVocab from_tensor(const Tensor& bytes);

  const std::string& bytes() const { return bytes_; }
  // The ids a model predicts: bytes().size() + 1, the unknown id included.
  int64_t size() const { return static_cast<int64_t>(bytes_.size()) + 1; }
  int64_t unknown_id() const { return static_cast<int64_t>(bytes_.size()); }
  int64_t id(char byte) const { return ids_[static_cast<unsigned char>(byte)]; }
  bool contains(char byte) const { return id(byte) != unknown_id(); }

  // i64 [text.size()] on the CPU.
  Tensor encode(std::string_view text) const;
  // The bytes of `ids` (any integer tensor, any shape, any device; read in row-major order), the
  // unknown id as U+FFFD, the replacement character. An id outside [0, size()) is an error.
  std::string decode(const Tensor& ids) const;
  std::string decode(std::span<const int64_t> ids) const;

  bool operator==(const CharVocab& other) const { return bytes_ == other.bytes_; }

 private:
  std::string bytes_;
  // byte -> id; fits a byte, since the unknown id is 256 only when every byte is in the vocabulary.
  std::array<uint8_t, 256> ids_{};
};

enum class TextSplit { train, validation };

struct TextOptions {
  // Characters a model sees at once: x and y are [n, block_size].
  int64_t block_size = 128;
  // The first 90% of the corpus's bytes, or the last 10%.
  TextSplit split = TextSplit::train;
  // Bytes between consecutive windows' starts. 1 (every start) for training; block_size tiles the
  // split with windows that share no target, so one unshuffled pass is the whole split's loss.
  int64_t stride = 1;
  // The ids to use: a saved vocabulary (resuming, sampling, or the validation split of a run). Unset,
  // the distinct bytes of the training split of this corpus.
  std::optional<CharVocab> vocab = std::nullopt;
};

// Debian's `fortunes` (/usr/share/games/fortunes, about 2.6 MB of English text): the default corpus.
std::string default_text_corpus_path();

// A corpus's bytes. A file is read as it is; a folder is its text files concatenated in name
// order, so the corpus is the same on every machine: regular files only (not symlinks, such as
// the fortunes' *.u8 aliases, nor subfolders), not *.dat (the fortunes' binary indexes), not
// hidden ones. Every failure is one "[TextDataset] <path>: ..." error: a path that does not
// exist, a file that cannot be read, an empty file, a folder with no text files or only empty ones.
std::string read_text_corpus(const std::string& path);

class TextDataset : public Dataset {
 public:
  // Reads `path` with read_text_corpus: a file (any UTF-8 or ASCII text, taken byte by byte) or a
  // folder such as default_text_corpus_path().
  explicit TextDataset(const std::string& path, TextOptions options = {});
  // A corpus already in memory (both splits from one read); `name` stands for the path in errors.
  static TextDataset from_text(std::string_view text, TextOptions options = {}, const std::string& name = "text");

  // Windows in the split: (split_bytes() - block_size - 1) / stride + 1.
  int64_t size() const override { return size_; }
  // {x, y}: i64 [indices.size(), block_size] each, fresh tensors.
  TensorList get_batch(std::span<const int64_t> indices) const override;

  const CharVocab& vocab() const { return vocab_; }
  int64_t block_size() const { return options_.block_size; }
  int64_t stride() const { return options_.stride; }
  TextSplit split() const { return options_.split; }
  // The split's length in bytes, and how many of them are outside the vocabulary (unknown_id()).
  int64_t split_bytes() const { return static_cast<int64_t>(ids_.size()); }
  int64_t unknown_bytes() const { return unknown_bytes_; }
  // The path (or from_text's name) errors name.
  const std::string& name() const { return name_; }

  // Whether `path` holds a corpus read_text_corpus accepts (tests and examples skip without one).
  static bool available(const std::string& path = default_text_corpus_path());

 private:
  TextDataset(std::string_view text, TextOptions options, std::string name);

  TextOptions options_;
  std::string name_;
  CharVocab vocab_;
  std::vector<uint8_t> ids_;  // the split, encoded
  int64_t unknown_bytes_ = 0;
  int64_t size_ = 0;
};

}  // namespace tandem::data
