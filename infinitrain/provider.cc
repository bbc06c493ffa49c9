#include "infinitrain/provider.h"

#include <map>
#include <mutex>
#include <stdexcept>

namespace infinitrain {
namespace {

struct PendingKernel {
    std::string op;
    KernelFn fn;
    std::string site;
};

struct Pending {
    RuntimeFactory runtime;
    std::string runtime_site;
    CclFactory ccl;
    std::string ccl_site;
    std::vector<PendingKernel> kernels;
    std::vector<std::string> errors;
    bool active = false;
};

std::mutex& Mu() {
    static std::mutex mu;
    return mu;
}
std::map<std::string, Pending>& Table() {
    static auto* t = new std::map<std::string, Pending>();
    return *t;
}

}  // namespace

void AddProviderRuntime(const char* provider, RuntimeFactory factory, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Pending& p = Table()[provider];
    if (p.runtime) {
        p.errors.push_back("runtime added twice: at " + p.runtime_site + " and at " + site);
        return;
    }
    p.runtime = std::move(factory);
    p.runtime_site = site;
}

void AddProviderKernel(const char* provider, const char* op, KernelFn fn, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Table()[provider].kernels.push_back({op, fn, site});
}

void AddProviderCcl(const char* provider, CclFactory factory, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Pending& p = Table()[provider];
    if (p.ccl) {
        p.errors.push_back("CCL added twice: at " + p.ccl_site + " and at " + site);
        return;
    }
    p.ccl = std::move(factory);
    p.ccl_site = site;
}

std::vector<std::string> LoadedProviders() {
    std::lock_guard<std::mutex> lock(Mu());
    std::vector<std::string> names;
    for (const auto& kv : Table()) names.push_back(kv.first);
    return names;
}

void RegisterProvider(const PrivateUse1Info& info) {
    std::lock_guard<std::mutex> lock(Mu());
    auto it = Table().find(info.name);
    if (it == Table().end() || !it->second.runtime) {
        throw std::runtime_error("provider '" + info.name + "' added no device runtime (is its library loaded?)");
    }
    Pending& p = it->second;
    if (!p.errors.empty()) {
        std::string msg = "provider '" + info.name + "' registration failed:";
        for (const std::string& e : p.errors) msg += "\n  " + e;
        throw std::runtime_error(msg);
    }
    RegisterPrivateUse1(info);  // raises when another provider holds the slot
    if (p.active) return;
    RegisterRuntime(DeviceType::kPrivateUse1, p.runtime, p.runtime_site.c_str());
    if (p.ccl) RegisterCcl(DeviceType::kPrivateUse1, p.ccl, p.ccl_site.c_str());
    for (const PendingKernel& k : p.kernels) {
        RegisterKernel(DeviceType::kPrivateUse1, k.op.c_str(), k.fn, k.site.c_str());
    }
    p.active = true;
    CheckRegistrations();
}

}  // namespace infinitrain
