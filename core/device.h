// Where a tensor's storage lives.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace tandem {

enum class DeviceType : uint8_t { cpu, cuda };

struct Device {
  DeviceType type = DeviceType::cpu;
  int16_t index = 0;

  static constexpr Device cpu() { return {DeviceType::cpu, 0}; }
  static constexpr Device cuda(int i = 0) { return {DeviceType::cuda, static_cast<int16_t>(i)}; }
  bool is_cpu() const { return type == DeviceType::cpu; }
  bool is_cuda() const { return type == DeviceType::cuda; }
  bool operator==(const Device&) const = default;
  std::string str() const { return is_cpu() ? "cpu" : "cuda:" + std::to_string(index); }
};

inline constexpr Device kCPU = Device::cpu();

}  // namespace tandem

template <> struct fmt::formatter<tandem::Device> : fmt::formatter<std::string> {
  auto format(const tandem::Device& d, format_context& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
