#include "infinitrain/runtime.h"

#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace infinitrain {
namespace {
struct Slot {
    RuntimeFactory factory;
    std::string site;
    std::unique_ptr<DeviceRuntime> runtime;
    std::once_flag once;
};

Slot* Slots() {
    static Slot slots[kNumDeviceTypes];
    return slots;
}
std::mutex& RegistryMutex() {
    static std::mutex mu;
    return mu;
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
    std::lock_guard<std::mutex> lock(RegistryMutex());
    Slot& s = Slots()[static_cast<int>(type)];
    if (s.factory) {
        throw std::runtime_error("device runtime for '" + DeviceTypeName(type) + "' registered twice: at " + s.site +
                                 " and at " + site);
    }
    s.factory = std::move(factory);
    s.site = site;
}

bool HasRuntime(DeviceType type) {
    std::lock_guard<std::mutex> lock(RegistryMutex());
    return static_cast<bool>(Slots()[static_cast<int>(type)].factory);
}

DeviceRuntime& GetRuntime(DeviceType type) {
    Slot& s = Slots()[static_cast<int>(type)];
    {
        std::lock_guard<std::mutex> lock(RegistryMutex());
        if (!s.factory) throw std::runtime_error("no device runtime registered for '" + DeviceTypeName(type) + "'");
    }
    std::call_once(s.once, [&] { s.runtime = s.factory(); });
    return *s.runtime;
}

}  // namespace infinitrain
