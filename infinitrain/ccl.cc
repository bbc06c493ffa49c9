#include "infinitrain/ccl.h"

#include <stdexcept>

#include "infinitrain/type_registry.h"

namespace infinitrain {
namespace {
PerDeviceType<CclBackend>& Ccls() {
    static PerDeviceType<CclBackend> r(
        "CCL", "device type '%s' has no collective library (CCL); distributed features need one");
    return r;
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
    Ccls().Register(type, std::move(factory), site);
}

bool HasCcl(DeviceType type) { return Ccls().Has(type); }

CclBackend& GetCcl(DeviceType type) { return Ccls().Get(type); }

}  // namespace infinitrain
