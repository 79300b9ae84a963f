// tandem::Error and the checks that raise it.
//
// Every message starts with the component or op in brackets and names the shapes, dtypes,
// devices, ranks or parameter names involved: "[matmul] inner dimensions differ: a is [4, 3],
// b is [5, 2]". The library never exits or aborts on user error; it throws.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(std::string message) : std::runtime_error(std::move(message)) {}
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace tandem

// TANDEM_CHECK(cond, "[op] message {}", arg): throws tandem::Error when cond is false. The
// message is only formatted on failure, so checks cost one branch on the hot path.
#define TANDEM_CHECK(cond, ...)        \
  do {                                 \
    if (!(cond)) [[unlikely]] {        \
      ::tandem::fail(__VA_ARGS__);     \
    }                                  \
  } while (0)
