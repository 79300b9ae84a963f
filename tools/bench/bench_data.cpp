// bench_data: the data layer's costs on Fashion-MNIST (Debian's dataset-fashion-mnist).
//
//   bench_data [--json] [--runs N]
//
// Rows: fmnist_load_train (FashionMNIST(train): inflate, convert, normalise), read_idx_images
// (the images file alone); gather_{images,labels}_b64 (64 random rows: TensorDataset's memcpy of
// rows, index_select as the peer); loader_batch_b64 (a loader's cost per batch over one epoch,
// nothing done between batches); loader_wait_b64_{idle,mlp} (how long a training loop waits for
// each batch, median and mean, when its step leaves the CPU idle for 2 ms as a GPU step does, and
// when it is a CPU MLP step, 784-256-256-10). Each at prefetch 0 (batches made on the calling
// thread) and 2 (on the prefetch thread). One intra-op thread.
#include <CLI/CLI.hpp>

#include <chrono>
#include <random>
#include <thread>

#include "bench_common.h"
#include "tandem.h"
#include "train/models.h"

using namespace tandem;

namespace {

enum class Step { none, idle, mlp };

struct EpochTimes {
  double per_batch_s;    // the epoch's wall time per batch
  double wait_median_s;  // the loop's wait for a batch (in begin() / ++), median and mean
  double wait_mean_s;
};

EpochTimes run_epoch(const std::shared_ptr<const data::Dataset>& ds, int prefetch, Step step, MlpBench& mlp) {
  data::DataLoader loader(ds, {.batch_size = 64, .seed = 1, .prefetch = prefetch});
  std::vector<double> waits;
  const double t0 = bench::now_s();
  double t = t0;
  for (auto it = loader.begin(); it != loader.end(); t = bench::now_s(), ++it) {
    waits.push_back(bench::now_s() - t);
    if (step == Step::idle) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    if (step == Step::mlp) {
      mlp.x = (*it)[0].view({-1, 784});
      mlp.y = (*it)[1];
      mlp.step();
    }
  }
  const double total = bench::now_s() - t0;
  const double n = static_cast<double>(waits.size());
  double sum = 0;
  for (double w : waits) sum += w;
  std::sort(waits.begin(), waits.end());
  return {total / n, waits[waits.size() / 2], sum / n};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_data: Fashion-MNIST loading, batch gathering and the DataLoader's per-batch cost"};
  bool json = false;
  int runs = 3;
  app.add_flag("--json", json, "one JSON object per row");
  app.add_option("--runs", runs, "repetitions (the median is reported)");
  CLI11_PARSE(app, argc, argv);
  if (!data::FashionMNIST::available(data::Split::train)) {
    fmt::print(stderr, "bench_data: Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)\n");
    return 1;
  }
  set_num_threads(1);
  std::vector<bench::Row> rows;

  auto ds = std::make_shared<data::FashionMNIST>(data::Split::train);
  const double load = bench::median_seconds([] { data::FashionMNIST again(data::Split::train); }, 1, runs, 0);
  rows.push_back({"fmnist_load_train", load, std::nullopt, "s", "", "60000 images, gzipped IDX -> normalised f32"});
  const std::string images = data::FashionMnistOptions{}.root + "/train-images-idx3-ubyte.gz";
  const double read = bench::median_seconds([&] { data::read_idx(images, f32); }, 1, runs, 0);
  rows.push_back({"read_idx_images", read, std::nullopt, "s", "", "26 MB gz -> 47 MB u8 -> f32"});

  std::mt19937_64 gen(0);
  std::vector<int64_t> idx(64);
  auto draw = [&] {
    for (int64_t& i : idx) i = static_cast<int64_t>(gen() % 60000);
  };
  for (int field : {0, 1}) {
    data::TensorDataset one({ds->tensors()[field]});
    const Tensor& src = ds->tensors()[field];
    auto rows_s = bench::median_seconds_interleaved(
        {[&] {
           draw();
           one.get_batch(idx);
         },
         [&] {
           draw();
           index_select(src, 0, from_vector(idx));
         }},
        2000, 5 * runs, 200);
    rows.push_back({field == 0 ? "gather_images_b64" : "gather_labels_b64", rows_s[0] * 1e6, rows_s[1] * 1e6, "us", "",
                    field == 0 ? "64 x 3136 B rows; peer: index_select" : "64 x 8 B rows; peer: index_select"});
  }

  MlpBench mlp(64, 784, 256, 10);
  for (int prefetch : {0, 2}) {
    const std::string p = fmt::format("_prefetch{}", prefetch);
    std::vector<double> bare;
    for (int r = 0; r < runs; ++r) bare.push_back(run_epoch(ds, prefetch, Step::none, mlp).per_batch_s);
    rows.push_back({"loader_batch_b64" + p, median(bare) * 1e6, std::nullopt, "us", "", "per batch, no work between"});
    for (Step step : {Step::idle, Step::mlp}) {
      std::vector<double> med, mean, per;
      for (int r = 0; r < runs; ++r) {
        const EpochTimes e = run_epoch(ds, prefetch, step, mlp);
        med.push_back(e.wait_median_s);
        mean.push_back(e.wait_mean_s);
        per.push_back(e.per_batch_s);
      }
      const std::string name = std::string("loader_wait_b64_") + (step == Step::idle ? "idle" : "mlp") + p;
      rows.push_back({name, median(med) * 1e6, std::nullopt, "us", "",
                      fmt::format("median wait; mean {:.1f} us; step + wait {:.0f} us", median(mean) * 1e6,
                                  median(per) * 1e6)});
    }
  }
  bench::print_rows(rows, json);
}
