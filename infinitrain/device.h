// Devices: a device type plus an index. "cpu" is built in; a provider's name
// (sim, cuda, maca, ...) maps to the PrivateUse1 slot once it registered.
#pragma once

#include <cstdint>
#include <string>

namespace infinitrain {

enum class DeviceType : int8_t { kCPU = 0, kPrivateUse1 = 1 };
constexpr int kNumDeviceTypes = 2;

struct Device {
    DeviceType type = DeviceType::kCPU;
    int index = 0;

    bool operator==(const Device& o) const { return type == o.type && index == o.index; }
    bool operator!=(const Device& o) const { return !(*this == o); }
    bool is_cpu() const { return type == DeviceType::kCPU; }
    std::string ToString() const;
};

// Name of a device type: "cpu", or the registered provider's name.
std::string DeviceTypeName(DeviceType t);
// Parses "cpu", "cpu:0", "<provider>", "<provider>:N". Unknown names raise
// std::invalid_argument listing the registered names.
Device ParseDevice(const std::string& spec);

// Called with an unknown device type name before ParseDevice gives up; returns
// true when it registered a provider of that name (Python imports the provider).
void SetDeviceResolver(bool (*resolver)(const std::string& name));

}  // namespace infinitrain
