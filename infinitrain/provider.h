// The provider mechanism. A provider's libraries add their runtime, kernels,
// CCL and ops of their own from file scope under the provider's name; nothing
// is live until the provider's Python module calls register_backend(), which
// calls RegisterProvider(): that checks everything the provider added, then
// claims the PrivateUse1 slot and activates it all, or raises and changes
// nothing. Several provider libraries may be loaded; one registers.
#pragma once

#include <string>
#include <vector>

#include "infinitrain/ccl.h"
#include "infinitrain/op.h"
#include "infinitrain/privateuse1.h"
#include "infinitrain/runtime.h"

namespace infinitrain {

void AddProviderRuntime(const char* provider, RuntimeFactory factory, const char* site);
void AddProviderKernel(const char* provider, const char* op, KernelFn fn, const char* site);
// A kernel that replaces the provider's other kernel for `op` (e.g. a vendor library's version of a portable
// kernel); the replaced one stays callable from the override's own code, not through the dispatcher.
void AddProviderKernelOverride(const char* provider, const char* op, KernelFn fn, const char* site);
void AddProviderCcl(const char* provider, CclFactory factory, const char* site);
// An op of the provider's own: its name must be "<provider>.<op>". The kernel runs on the provider's
// devices; the composite (optional: an empty function) runs where there is no kernel.
void AddProviderOp(const char* provider, const OpDef& def, KernelFn kernel, CompositeFn composite, const char* site);

// Idempotent for the same provider. Raises, registering nothing, when another provider holds the slot,
// when the provider added no runtime, or when something it added is malformed (a kernel for an unknown
// op, an op schema that does not parse, two runtimes...).
void RegisterProvider(const PrivateUse1Info& info);

// Providers whose libraries are loaded in this process (registered or not).
std::vector<std::string> LoadedProviders();

struct ProviderRegistrar {
    ProviderRegistrar(const char* provider, RuntimeFactory f, const char* site) {
        AddProviderRuntime(provider, std::move(f), site);
    }
    ProviderRegistrar(const char* provider, const char* op, KernelFn fn, const char* site) {
        AddProviderKernel(provider, op, fn, site);
    }
    ProviderRegistrar(const char* provider, CclFactory f, const char* site) {
        AddProviderCcl(provider, std::move(f), site);
    }
    ProviderRegistrar(const char* provider, const OpDef& def, KernelFn kernel, CompositeFn composite,
                      const char* site) {
        AddProviderOp(provider, def, kernel, std::move(composite), site);
    }
};

#define INFINITRAIN_SITE __FILE__ ":" INFINITRAIN_STR(__LINE__)

#define REGISTER_PROVIDER_RUNTIME(provider, cls)                                                                \
    static ::infinitrain::ProviderRegistrar INFINITRAIN_CONCAT(provider_runtime_, __LINE__)(                    \
        provider,                                                                                               \
        ::infinitrain::RuntimeFactory([] { return std::unique_ptr<::infinitrain::DeviceRuntime>(new cls()); }), \
        INFINITRAIN_SITE)

#define REGISTER_PROVIDER_KERNEL(provider, op, fn)                                                           \
    static ::infinitrain::ProviderRegistrar INFINITRAIN_CONCAT(provider_kernel_, __LINE__)(provider, op, fn, \
                                                                                           INFINITRAIN_SITE)

#define REGISTER_PROVIDER_KERNEL_OVERRIDE(provider, op, fn)                                          \
    static const bool INFINITRAIN_CONCAT(provider_kernel_override_, __LINE__) =                       \
        (::infinitrain::AddProviderKernelOverride(provider, op, fn, INFINITRAIN_SITE), true)

#define REGISTER_PROVIDER_CCL(provider, cls)                                                                       \
    static ::infinitrain::ProviderRegistrar INFINITRAIN_CONCAT(provider_ccl_, __LINE__)(                           \
        provider, ::infinitrain::CclFactory([] { return std::unique_ptr<::infinitrain::CclBackend>(new cls()); }), \
        INFINITRAIN_SITE)

// REGISTER_PROVIDER_OP("sim", (OpDef{"sim.my_op(x) -> out", OpTier::kProvider, ...}), kernel, composite)
#define REGISTER_PROVIDER_OP(provider, def, kernel, composite)                                                \
    static ::infinitrain::ProviderRegistrar INFINITRAIN_CONCAT(provider_op_, __LINE__)(provider, def, kernel, \
                                                                                       composite, INFINITRAIN_SITE)

}  // namespace infinitrain
