#include "data/fashion_mnist.h"

#include <filesystem>

#include "data/idx.h"

namespace tandem::data {

namespace {

namespace fs = std::filesystem;

// The file `stem` under root: gzipped as distributed, or unpacked; empty when neither exists.
std::string locate(const std::string& root, const std::string& stem) {
  std::error_code ec;
  for (const fs::path& p : {fs::path(root) / (stem + ".gz"), fs::path(root) / stem})
    if (fs::is_regular_file(p, ec)) return p.string();
  return {};
}

std::string find_file(const std::string& root, const std::string& stem) {
  std::string path = locate(root, stem);
  if (!path.empty()) return path;
  const fs::path gz = fs::path(root) / (stem + ".gz");
  const fs::path raw = fs::path(root) / stem;
  fail("[FashionMNIST] neither {} nor {} exists (Debian: apt-get install dataset-fashion-mnist; or set .root)",
       gz.string(), raw.string());
}

const char* prefix(Split split) { return split == Split::train ? "train" : "t10k"; }

TensorList load(Split split, const FashionMnistOptions& options) {
  const std::string image_path = find_file(options.root, std::string(prefix(split)) + "-images-idx3-ubyte");
  const std::string label_path = find_file(options.root, std::string(prefix(split)) + "-labels-idx1-ubyte");
  Tensor images = read_idx(image_path, f32);
  Tensor labels = read_idx(label_path, i64);
  TANDEM_CHECK(images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28,
               "[FashionMNIST] {}: expected images of shape [N, 28, 28], got {}", image_path, images.shape());
  TANDEM_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0),
               "[FashionMNIST] {}: expected {} labels (one per image of {}), got shape {}", label_path, images.size(0),
               image_path, labels.shape());
  const int64_t* y = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < labels.numel(); ++i)
    TANDEM_CHECK(y[i] >= 0 && y[i] < FashionMNIST::kClasses, "[FashionMNIST] {}: label {} of example {} is not in 0..9",
                 label_path, y[i], i);
  // One fused pass (x * scale + shift) instead of three tensor ops over the 47M pixels.
  const float scale = options.normalize ? 1.0f / (255.0f * FashionMNIST::kStd) : 1.0f / 255.0f;
  const float shift = options.normalize ? -FashionMNIST::kMean / FashionMNIST::kStd : 0.0f;
  float* x = images.data_ptr<float>();
  for (int64_t i = 0; i < images.numel(); ++i) x[i] = x[i] * scale + shift;
  return {images, labels};
}

}  // namespace

FashionMNIST::FashionMNIST(Split split, const FashionMnistOptions& options) : TensorDataset(load(split, options)) {}

bool FashionMNIST::available(Split split, const std::string& root) {
  return !locate(root, std::string(prefix(split)) + "-images-idx3-ubyte").empty() &&
         !locate(root, std::string(prefix(split)) + "-labels-idx1-ubyte").empty();
}

}  // namespace tandem::data
