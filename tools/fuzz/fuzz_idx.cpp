// libFuzzer target: data::read_idx over arbitrary files, plain or gzipped. The first input byte
// picks the dtype asked for; the rest is the file, handed over through a memfd so the reader's own
// path (gzopen, transparent for plain files) is what runs. Every input must end in a tensor or a
// tandem::Error; any other exception, a crash, a sanitizer report or a hang is a finding. An
// accepted plain file is also checked against what the reader promises: a contiguous CPU tensor
// of the dtype asked for, whose shape is the header's dims and whose payload is exactly the rest
// of the file, every element converted from its big-endian value.
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "core/threads.h"
#include "core/error.h"
#include "data/idx.h"
#include "fuzz_common.h"

using namespace tandem;

namespace {

int file_fd = -1;
std::string file_path;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_idx: expectation failed: %s\n", what);
  std::abort();
}

constexpr Dtype kDtypes[] = {f32, f64, f16, bf16, i32, i64, boolean};

// The element at `i` of a plain file's payload, as a double (every IDX type converts exactly).
double element(const uint8_t* payload, uint8_t type, int64_t i) {
  auto be = [&](int bytes) {
    uint64_t u = 0;
    for (int b = 0; b < bytes; ++b) u = (u << 8) | payload[i * bytes + b];
    return u;
  };
  switch (type) {
    case 0x08: return payload[i];
    case 0x09: return static_cast<int8_t>(payload[i]);
    case 0x0B: return static_cast<int16_t>(be(2));
    case 0x0C: return static_cast<int32_t>(be(4));
    case 0x0D: { uint32_t u = static_cast<uint32_t>(be(4)); float f; std::memcpy(&f, &u, 4); return f; }
    default: { uint64_t u = be(8); double d; std::memcpy(&d, &u, 8); return d; }
  }
}

// The dtype's rounding of an exactly known value.
double rounded(double v, Dtype d) {
  switch (d) {
    case f32: return static_cast<float>(v);
    case f16: return static_cast<float>(Half(static_cast<float>(v)));
    case bf16: return static_cast<float>(BFloat16(static_cast<float>(v)));
    case boolean: return v != 0;
    default: return v;
  }
}

double read_back(const Tensor& t, int64_t i) {
  double v = 0;
  TANDEM_DISPATCH_ALL(t.dtype(), "fuzz_idx", [&] {
    const scalar_t x = static_cast<const scalar_t*>(t.data_ptr())[i];
    if constexpr (std::is_same_v<scalar_t, Half> || std::is_same_v<scalar_t, BFloat16>) {
      v = static_cast<float>(x);
    } else {
      v = static_cast<double>(x);
    }
  });
  return v;
}

void check_plain(const uint8_t* file, size_t size, const Tensor& t) {
  static constexpr int kItem[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 0, 2, 4, 4, 8, 0};
  if (size < 4) finding("accepted a file shorter than its magic");
  const uint8_t type = file[2];
  const size_t ndim = file[3];
  if (type >= 16 || kItem[type] == 0) finding("accepted an unknown element type");
  if (t.dim() != static_cast<int64_t>(ndim)) finding("rank differs from the header's dims");
  size_t count = 1;
  for (size_t d = 0; d < ndim; ++d) {
    const uint32_t dim = (uint32_t{file[4 + 4 * d]} << 24) | (uint32_t{file[5 + 4 * d]} << 16) |
                         (uint32_t{file[6 + 4 * d]} << 8) | file[7 + 4 * d];
    if (t.size(static_cast<int64_t>(d)) != dim) finding("a size differs from the header's dim");
    count *= dim;
  }
  const size_t header = 4 + 4 * ndim;
  if (header + count * kItem[type] != size) finding("payload length differs from the dims");
  const uint8_t* payload = file + header;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double want = rounded(element(payload, type, i), t.dtype());
    const double got = read_back(t, i);
    if (!(got == want || (std::isnan(got) && std::isnan(want)))) finding("an element differs from the file's");
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  file_fd = memfd_create("fuzz_idx", 0);
  if (file_fd < 0) {
    std::perror("fuzz_idx: memfd_create");
    std::abort();
  }
  file_path = "/proc/self/fd/" + std::to_string(file_fd);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Dtype dtype = kDtypes[data[0] % 7];
  const uint8_t* file = data + 1;
  const size_t file_size = size - 1;
  if (ftruncate(file_fd, 0) != 0 || pwrite(file_fd, file, file_size, 0) != static_cast<ssize_t>(file_size)) {
    std::perror("fuzz_idx: writing the memfd");
    std::abort();
  }
  Tensor t;
  try {
    t = data::read_idx(file_path, dtype);
  } catch (const Error&) {
    return 0;
  }
  if (!t.is_cpu() || !t.is_contiguous() || t.dtype() != dtype) finding("not a contiguous CPU tensor of the dtype asked for");
  const bool gzipped = file_size >= 2 && file[0] == 0x1f && file[1] == 0x8b;
  if (!gzipped) check_plain(file, file_size, t);
  return 0;
}
