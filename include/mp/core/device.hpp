#pragma once
#include <cstdint>
#include <string>

namespace mp {

/// Kind of device a tensor lives on.
enum class DeviceType : uint8_t { cpu = 0, cuda = 1 };

/// Number of device types (tables indexed by DeviceType).
inline constexpr int kNumDeviceTypes = 2;

/// A device: cpu, or cuda:N.
struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  /// Parse "cpu", "cuda", "cuda:1"; throws mp::Error for anything else.
  explicit Device(const std::string& s);

  constexpr bool is_cpu() const { return type == DeviceType::cpu; }
  constexpr bool is_cuda() const { return type == DeviceType::cuda; }
  /// "cpu" or "cuda:N".
  std::string str() const;
  friend constexpr bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
};

/// The host CPU.
inline constexpr Device kCPU{DeviceType::cpu, 0};

}  // namespace mp
