// libFuzzer target: nn::parse_safetensors over arbitrary bytes. Every input must end in a
// TensorDict or a tandem::Error; any other exception, a crash, a sanitizer report or a hang is a
// finding. A parsed file is also checked for what the loader promises: CPU tensors, contiguous,
// whose bytes the file held exactly (data_offsets tile the buffer), and BOOL bytes of 0 or 1.
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/threads.h"
#include "core/error.h"
#include "fuzz_common.h"
#include "nn/safetensors.h"

using namespace tandem;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_num_threads(1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  nn::Metadata metadata;
  nn::TensorDict tensors;
  try {
    tensors = nn::parse_safetensors(data, size, &metadata, "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  // Accepted: the header length and the tensors' bytes account for the whole input.
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
  size_t bytes = 0;
  for (const auto& [name, t] : tensors.items()) {
    if (!t.is_cpu() || !t.is_contiguous() || t.numel() < 0) std::abort();
    bytes += t.nbytes();
    if (t.dtype() == boolean) {
      const auto* b = static_cast<const uint8_t*>(t.data_ptr());
      for (int64_t i = 0; i < t.numel(); ++i)
        if (b[i] > 1) std::abort();
    } else if (t.nbytes() > 0) {
      // Touch every byte, so a tensor shorter than it claims shows up under ASan.
      const auto* p = static_cast<const uint8_t*>(t.data_ptr());
      uint8_t x = 0;
      for (size_t i = 0; i < t.nbytes(); ++i) x ^= p[i];
      volatile uint8_t sink = x;
      (void)sink;
    }
  }
  if (8 + header + bytes != size) std::abort();
  return 0;
}
