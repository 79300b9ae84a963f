// Fashion-MNIST (Zalando, 2017): 28x28 grey images of 10 kinds of clothing, 60,000 for training
// and 10,000 for testing, read from the IDX files Debian's dataset-fashion-mnist installs.
#pragma once

#include <string>

#include "data/dataset.h"

namespace tandem::data {

enum class Split { train, test };

struct FashionMnistOptions {
  // Holds {train,t10k}-{images-idx3,labels-idx1}-ubyte, each gzipped (.gz) or not.
  std::string root = "/usr/share/datasets/fashion-mnist";
  // true: (x / 255 - kMean) / kStd, torchvision's usual ToTensor + Normalize; false: x / 255.
  bool normalize = true;
};

// A TensorDataset of {images [N, 28, 28] f32, labels [N] i64 in 0..9}; the split picks the files.
class FashionMNIST : public TensorDataset {
 public:
  // The training images' pixel mean and standard deviation after /255; both splits use them.
  static constexpr float kMean = 0.2860f;
  static constexpr float kStd = 0.3530f;
  static constexpr int64_t kClasses = 10;
  static constexpr const char* kClassNames[kClasses] = {"T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                                                        "Sandal",      "Shirt",   "Sneaker",  "Bag",   "Ankle boot"};

  explicit FashionMNIST(Split split = Split::train, const FashionMnistOptions& options = {});
  const Tensor& images() const { return tensors()[0]; }
  const Tensor& labels() const { return tensors()[1]; }

  // Whether `root` holds both files of `split` (tests and examples skip without them).
  static bool available(Split split, const std::string& root = FashionMnistOptions{}.root);
};

}  // namespace tandem::data
