#include "infinitrain/ccl.h"

#include <mutex>
#include <stdexcept>

namespace infinitrain {
namespace {
struct Slot {
    CclFactory factory;
    std::string site;
    std::unique_ptr<CclBackend> backend;
    std::once_flag once;
};
Slot* Slots() {
    static Slot slots[kNumDeviceTypes];
    return slots;
}
std::mutex& Mu() {
    static std::mutex mu;
    return mu;
}
}  // namespace

ReduceOp ParseReduceOp(const std::string& name) {
    if (name == "sum") return ReduceOp::kSum;
    if (name == "avg") return ReduceOp::kAvg;
    if (name == "max") return ReduceOp::kMax;
    if (name == "min") return ReduceOp::kMin;
    if (name == "prod") return ReduceOp::kProd;
    throw std::invalid_argument("unknown reduce op '" + name + "': expected sum, avg, max, min or prod");
}

void RegisterCcl(DeviceType type, CclFactory factory, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Slot& s = Slots()[static_cast<int>(type)];
    if (s.factory) {
        throw std::runtime_error("CCL for '" + DeviceTypeName(type) + "' registered twice: at " + s.site + " and at " +
                                 site);
    }
    s.factory = std::move(factory);
    s.site = site;
}

bool HasCcl(DeviceType type) {
    std::lock_guard<std::mutex> lock(Mu());
    return static_cast<bool>(Slots()[static_cast<int>(type)].factory);
}

CclBackend& GetCcl(DeviceType type) {
    Slot& s = Slots()[static_cast<int>(type)];
    {
        std::lock_guard<std::mutex> lock(Mu());
        if (!s.factory) {
            throw std::runtime_error("device type '" + DeviceTypeName(type) +
                                     "' has no collective library (CCL); distributed features need one");
        }
    }
    std::call_once(s.once, [&] { s.backend = s.factory(); });
    return *s.backend;
}

}  // namespace infinitrain
