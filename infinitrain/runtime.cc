#include "infinitrain/runtime.h"

#include <string>
#include <vector>

#include "infinitrain/type_registry.h"

namespace infinitrain {
namespace {
PerDeviceType<DeviceRuntime>& Runtimes() {
    // Destroyed at exit, so runtimes get to stop their threads.
    static PerDeviceType<DeviceRuntime> r("device runtime", "no device runtime registered for '%s'");
    return r;
}
}  // namespace

namespace {
// Per thread, per device type, a small map from device index to its current stream.
thread_local std::vector<Stream> t_current[kNumDeviceTypes];
}  // namespace

Stream CurrentStream(const Device& device) {
    const auto& v = t_current[static_cast<int>(device.type)];
    return device.index < static_cast<int>(v.size()) ? v[device.index] : nullptr;
}

void SetCurrentStream(const Device& device, Stream stream) {
    auto& v = t_current[static_cast<int>(device.type)];
    if (device.index >= static_cast<int>(v.size())) v.resize(device.index + 1, nullptr);
    v[device.index] = stream;
}

void RegisterRuntime(DeviceType type, RuntimeFactory factory, const char* site) {
    Runtimes().Register(type, std::move(factory), site);
}

bool HasRuntime(DeviceType type) { return Runtimes().Has(type); }

DeviceRuntime& GetRuntime(DeviceType type) { return Runtimes().Get(type); }

}  // namespace infinitrain
