// What every fuzzer here shares: the sanitizer defaults they are meant to run under.
#pragma once

// A failed allocation must reach the library as a null pointer (which it turns into
// "[alloc] out of CPU memory ..."), as it would without ASan, instead of ASan stopping the run;
// and anything above 1 GiB fails, so a fuzzer can ask for huge tensors and check the error
// without the machine really handing out the memory. Set here rather than only in
// tools/ci/sanitize.sh so a crash reproduces the same way by hand (`./fuzz_ops crash-...`);
// ASAN_OPTIONS still overrides them.
extern "C" const char* __asan_default_options() {
  return "allocator_may_return_null=1:max_allocation_size_mb=1024";
}
// UBSan: stop at the first report, except those tools/ci/ubsan.supp lists (element values of
// integer tensors wrapping, and tensor casts, as in PyTorch; see that file).
extern "C" const char* __ubsan_default_options() {
  return "halt_on_error=1:print_stacktrace=1:suppressions=" TANDEM_FUZZ_UBSAN_SUPP;
}
// Bytes above which an allocation fails under those options.
inline constexpr long long kFuzzAllocLimit = 1LL << 30;
