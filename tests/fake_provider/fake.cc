// A minimal provider for the mechanism's own tests: the host-memory runtime
// (synchronous streams), and kernels for only a few ops (the CPU's, called directly), so the
// tests can see a provider with missing ops, the CPU fallback and composites,
// and two different providers in one process. PROVIDER_NAME comes from the
// build (fake, fake2).
#include <pybind11/pybind11.h>

#include "infinitrain/host_runtime.h"
#include "infinitrain/provider.h"

#define STR2(x) #x
#define STR(x) STR2(x)

namespace {

using namespace infinitrain;

constexpr const char* kName = STR(PROVIDER_NAME);

class FakeRuntime final : public HostMemoryRuntime {
public:
    FakeRuntime() : HostMemoryRuntime(DeviceType::kPrivateUse1, 2) {}
};

// Device memory is host memory here, so the CPU kernel can run on the same context.
void CpuKernel(KernelContext& ctx) { ctx.op->Kernel(DeviceType::kCPU)(ctx); }

}  // namespace

REGISTER_PROVIDER_RUNTIME(kName, FakeRuntime);
// Enough to create tensors, run elementwise arithmetic and compose silu; nothing else.
REGISTER_PROVIDER_KERNEL(kName, "fill_", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "cast", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "add", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "mul", CpuKernel);
REGISTER_PROVIDER_KERNEL(kName, "sigmoid", CpuKernel);

PYBIND11_MODULE(MODULE_NAME, m) {
    m.def("register_backend", [] { RegisterProvider({kName, DataType::kFloat16}); });
}
