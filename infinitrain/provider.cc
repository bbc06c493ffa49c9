#include "infinitrain/provider.h"

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

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

// Everything that could make activation fail, found before anything is activated. `order` receives the
// indices of the provider's ops in an order AddOp accepts: each op after the own ops its backward uses.
std::vector<std::string> Problems(const std::string& name, const Pending& p, std::vector<size_t>* order) {
    std::vector<std::string> problems = p.errors;
    if (!p.runtime) problems.push_back("it added no device runtime (is its library loaded?)");
    auto exists = [](const std::string& op) {
        try {
            GetOp(op);
            return true;
        } catch (const std::invalid_argument&) {
            return false;
        }
    };
    std::set<std::string> own;
    std::vector<std::pair<size_t, OpSchema>> parsed;  // the ops that parse, are named right and are new
    for (size_t i = 0; i < p.ops.size(); ++i) {
        const PendingOp& o = p.ops[i];
        try {
            OpSchema s = ParseOpSchema(o.def);
            if (s.name.rfind(name + ".", 0) != 0) {
                problems.push_back("op '" + s.name + "' (at " + o.site + ") must be named '" + name + ".<op>'");
            } else if (!own.insert(s.name).second) {
                problems.push_back("op '" + s.name + "' is defined twice (again at " + o.site + ")");
            } else if (exists(s.name)) {
                problems.push_back("op '" + s.name + "' (at " + o.site + ") is already an op");
            } else {
                parsed.emplace_back(i, std::move(s));
            }
        } catch (const std::exception& e) {
            problems.push_back(std::string(e.what()) + " (at " + o.site + ")");
        }
    }
    // Every backward op must be an existing op, the op itself or another op of the provider's; AddOp checks
    // against the ops added so far, so the provider's ops are added in dependency order.
    std::set<std::string> added;
    std::vector<bool> done(parsed.size(), false);
    for (bool progress = true; progress;) {
        progress = false;
        for (size_t k = 0; k < parsed.size(); ++k) {
            if (done[k]) continue;
            const OpSchema& s = parsed[k].second;
            bool ready = true;
            for (const std::string& b : s.backward) {
                if (b != s.name && !added.count(b) && (own.count(b) || !exists(b))) ready = false;
            }
            if (!ready) continue;
            done[k] = progress = true;
            added.insert(s.name);
            if (order) order->push_back(parsed[k].first);
        }
    }
    for (size_t k = 0; k < parsed.size(); ++k) {
        if (done[k]) continue;
        const OpSchema& s = parsed[k].second;
        const std::string& site = p.ops[parsed[k].first].site;
        bool missing = false;
        for (const std::string& b : s.backward) {
            if (b != s.name && !own.count(b) && !exists(b)) {
                problems.push_back("op '" + s.name + "' (at " + site + "): backward op '" + b + "' is not an op");
                missing = true;
            }
        }
        if (!missing) {
            problems.push_back("op '" + s.name + "' (at " + site +
                               "): its backward uses ops of the provider that cannot be added before it (a cycle, "
                               "or an op with a problem above)");
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
    std::vector<size_t> order;
    std::vector<std::string> problems = Problems(info.name, p, &order);
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
    for (size_t i : order) {
        const PendingOp& o = p.ops[i];
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
