#include "infinitrain/provider.h"

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>

namespace infinitrain {
namespace {

struct PendingKernel {
    std::string op;
    KernelFn fn;
    std::string site;
    bool override = false;
};

struct PendingOp {
    OpDef def;
    KernelFn kernel;
    CompositeFn composite;
    std::string site;
};

struct Pending {
    RuntimeFactory runtime;
    std::string runtime_site;
    CclFactory ccl;
    std::string ccl_site;
    std::vector<PendingKernel> kernels;
    std::vector<PendingOp> ops;
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

// Everything that could make activation fail, found before anything is activated.
std::vector<std::string> Problems(const std::string& name, const Pending& p) {
    std::vector<std::string> problems = p.errors;
    if (!p.runtime) problems.push_back("it added no device runtime (is its library loaded?)");
    std::set<std::string> own;
    for (const PendingOp& o : p.ops) {
        try {
            OpSchema s = ParseOpSchema(o.def);
            if (s.name.rfind(name + ".", 0) != 0) {
                problems.push_back("op '" + s.name + "' (at " + o.site + ") must be named '" + name + ".<op>'");
            } else if (!own.insert(s.name).second) {
                problems.push_back("op '" + s.name + "' is defined twice (again at " + o.site + ")");
            }
        } catch (const std::exception& e) {
            problems.push_back(std::string(e.what()) + " (at " + o.site + ")");
        }
    }
    std::map<std::string, int> plain, overrides;
    for (const PendingKernel& k : p.kernels) (k.override ? overrides : plain)[k.op] += 1;
    for (const PendingKernel& k : p.kernels) {
        bool known = own.count(k.op) > 0;
        if (!known) {
            try {
                GetOp(k.op);
                known = true;
            } catch (const std::invalid_argument&) {
            }
        }
        if (!known) problems.push_back("kernel registered at " + k.site + " for unknown op '" + k.op + "'");
        if ((k.override ? overrides : plain)[k.op] > 1) {
            problems.push_back(std::string("two ") + (k.override ? "overrides" : "kernels") + " for op '" + k.op +
                               "' (one at " + k.site + ")");
        }
    }
    return problems;
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

void AddProviderKernelOverride(const char* provider, const char* op, KernelFn fn, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Table()[provider].kernels.push_back({op, fn, site, true});
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

void AddProviderOp(const char* provider, const OpDef& def, KernelFn kernel, CompositeFn composite, const char* site) {
    std::lock_guard<std::mutex> lock(Mu());
    Table()[provider].ops.push_back({def, kernel, std::move(composite), site});
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
    if (it == Table().end()) {
        throw std::runtime_error("provider '" + info.name + "' added no device runtime (is its library loaded?)");
    }
    Pending& p = it->second;
    if (p.active) {
        RegisterPrivateUse1(info);  // idempotent, or raises for a changed autocast dtype
        return;
    }
    std::vector<std::string> problems = Problems(info.name, p);
    if (!problems.empty()) {
        std::string msg = "provider '" + info.name + "' registration failed:";
        for (const std::string& e : problems) msg += "\n  " + e;
        throw std::runtime_error(msg);
    }
    CheckPrivateUse1(info);  // raises when another provider holds the slot
    // Nothing below can fail on what was checked above.
    RegisterPrivateUse1(info);
    RegisterRuntime(DeviceType::kPrivateUse1, p.runtime, p.runtime_site.c_str());
    if (p.ccl) RegisterCcl(DeviceType::kPrivateUse1, p.ccl, p.ccl_site.c_str());
    for (const PendingOp& o : p.ops) {
        AddOp(o.def);
        Op& op = GetMutableOp(ParseOpSchema(o.def).name);
        if (o.composite) op.SetComposite(o.composite);
        if (o.kernel) RegisterKernel(DeviceType::kPrivateUse1, op.name(), o.kernel, o.site.c_str());
    }
    std::set<std::string> overridden;
    for (const PendingKernel& k : p.kernels) {
        if (k.override) overridden.insert(k.op);
    }
    for (const PendingKernel& k : p.kernels) {
        if (k.override || !overridden.count(k.op)) {
            RegisterKernel(DeviceType::kPrivateUse1, k.op.c_str(), k.fn, k.site.c_str());
        }
    }
    p.active = true;
}

}  // namespace infinitrain
