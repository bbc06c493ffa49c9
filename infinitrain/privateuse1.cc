#include "infinitrain/privateuse1.h"

#include <memory>
#include <mutex>
#include <stdexcept>

namespace infinitrain {
namespace {
std::mutex g_mu;
std::unique_ptr<PrivateUse1Info> g_info;

// True when `info` is already registered; raises when it cannot be. Holds g_mu.
bool Check(const PrivateUse1Info& info) {
    if (info.name.empty() || info.name == "cpu" || info.name.find_first_of(":. ") != std::string::npos) {
        throw std::invalid_argument("provider name must be non-empty, not 'cpu', without ':', '.' or spaces; got '" +
                                    info.name + "'");
    }
    if (info.autocast_dtype != DataType::kFloat16 && info.autocast_dtype != DataType::kBFloat16) {
        throw std::invalid_argument("provider '" + info.name + "': autocast dtype must be float16 or bfloat16");
    }
    if (!g_info) return false;
    if (g_info->name == info.name && g_info->autocast_dtype == info.autocast_dtype) return true;
    throw std::runtime_error("cannot register provider '" + info.name + "': provider '" + g_info->name +
                             "' already holds the PrivateUse1 slot in this process (one provider per process)");
}
}  // namespace

void CheckPrivateUse1(const PrivateUse1Info& info) {
    std::lock_guard<std::mutex> lock(g_mu);
    Check(info);
}

void RegisterPrivateUse1(const PrivateUse1Info& info) {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!Check(info)) g_info = std::make_unique<PrivateUse1Info>(info);
}

const PrivateUse1Info* GetPrivateUse1() {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_info.get();
}

}  // namespace infinitrain
