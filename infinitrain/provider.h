// The provider mechanism. A provider's libraries add their runtime, kernels
// and CCL from file scope under the provider's name; nothing is live until the
// provider's Python module calls register_backend(), which calls
// RegisterProvider(): that claims the PrivateUse1 slot and activates what the
// provider added. Several provider libraries may be loaded; one registers.
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
void AddProviderCcl(const char* provider, CclFactory factory, const char* site);

// Idempotent for the same provider; raises when another provider holds the
// slot, when the provider added no runtime, or when a kernel names an unknown op.
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

#define REGISTER_PROVIDER_CCL(provider, cls)                                                                       \
    static ::infinitrain::ProviderRegistrar INFINITRAIN_CONCAT(provider_ccl_, __LINE__)(                           \
        provider, ::infinitrain::CclFactory([] { return std::unique_ptr<::infinitrain::CclBackend>(new cls()); }), \
        INFINITRAIN_SITE)

}  // namespace infinitrain
