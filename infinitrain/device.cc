#include "infinitrain/device.h"

#include <cstdlib>
#include <stdexcept>

#include "infinitrain/privateuse1.h"

namespace infinitrain {

std::string DeviceTypeName(DeviceType t) {
    if (t == DeviceType::kCPU) return "cpu";
    const PrivateUse1Info* p = GetPrivateUse1();
    return p ? p->name : "privateuse1";
}

// "cpu" for the single CPU device, "<provider>:<index>" otherwise.
std::string Device::ToString() const {
    if (type == DeviceType::kCPU) return "cpu";
    return DeviceTypeName(type) + ":" + std::to_string(index);
}

namespace {
bool (*g_resolver)(const std::string&) = nullptr;
}  // namespace

void SetDeviceResolver(bool (*resolver)(const std::string&)) { g_resolver = resolver; }

Device ParseDevice(const std::string& spec) {
    std::string name = spec;
    int index = 0;
    size_t colon = spec.find(':');
    if (colon != std::string::npos) {
        name = spec.substr(0, colon);
        std::string idx = spec.substr(colon + 1);
        char* end = nullptr;
        long v = idx.empty() ? -1 : std::strtol(idx.c_str(), &end, 10);
        if (idx.empty() || *end != '\0' || v < 0) {
            throw std::invalid_argument("bad device '" + spec +
                                        "': expected '<type>' or '<type>:<index>' with index >= 0");
        }
        index = static_cast<int>(v);
    }
    if (name == "cpu") {
        if (index != 0) throw std::invalid_argument("bad device '" + spec + "': the cpu device has index 0 only");
        return Device{DeviceType::kCPU, 0};
    }
    const PrivateUse1Info* p = GetPrivateUse1();
    if (!p && g_resolver && g_resolver(name)) p = GetPrivateUse1();
    if (p && name == p->name) return Device{DeviceType::kPrivateUse1, index};
    std::string known = "cpu";
    if (p) known += ", " + p->name;
    throw std::invalid_argument("unknown device '" + spec + "': registered device types are " + known);
}

}  // namespace infinitrain
